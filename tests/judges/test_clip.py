"""CLIP-S, RefCLIP-S, PAC-S and RefPAC-S on the tiny random-weight CLIP: parity with the plain reference
(`benchmarks.clip_reference`, one caption at a time) and with torchmetrics' CLIPScore, images by path
or by id, per-record errors, caching, the signature and argument checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("PIL")

from benchmarks import clip_reference as ref  # noqa: E402
from qace.data.records import Record, RecordError, read_records  # noqa: E402
from qace.errors import ConfigError  # noqa: E402
from qace.judges.clip import ClipScore  # noqa: E402
from qace.signature import Signature  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "qace" / "examples" / "captions.jsonl"


@pytest.fixture(scope="module")
def reference(clip_dir):
    return ref.load(str(clip_dir))


def _records() -> list[Record]:
    return [r for r in read_records(EXAMPLE) if isinstance(r, Record) and r.caption.strip()]


@pytest.mark.parametrize(
    ("family", "references", "w"),
    [("clip", False, 2.5), ("clip", True, 2.5), ("pac", False, 2.0), ("pac", True, 2.0)],
)
def test_scores_equal_the_plain_reference_within_1e_5(clip_dir, reference, family, references, w):
    scorer = ClipScore(model=str(clip_dir), family=family, references=references, text_batch=3, image_batch=2)
    records = _records()
    rows = list(scorer.score_records(records))
    assert len(rows) == len(records) and not any(isinstance(r, RecordError) for r in rows)
    for record, row in zip(records, rows, strict=True):
        if references:
            want = ref.refclip_s(*reference, record.caption, record.image, list(record.references), w=w)
        else:
            want = ref.clip_s(*reference, record.caption, record.image, w=w)
        assert row[scorer.score_key] == pytest.approx(want, abs=1e-5), record.id
    assert len({round(r[scorer.score_key], 6) for r in rows}) > 3  # the scores differ between captions


def test_torchmetrics_clipscore_agrees_at_w_100_without_prompt(clip_dir):
    """torchmetrics' CLIPScore is 100 * max(cos, 0) with no prompt: ours with w=100 and prompt ''."""
    tm = pytest.importorskip("torchmetrics.multimodal.clip_score")
    import numpy as np
    import torch
    from PIL import Image
    from transformers import CLIPModel, CLIPProcessor

    records = _records()[:6]
    model = ref.tensor_features(CLIPModel.from_pretrained(clip_dir))
    load = lambda: (model, CLIPProcessor.from_pretrained(clip_dir))  # noqa: E731
    metric = tm.CLIPScore(model_name_or_path=load)
    ours = ClipScore(model=str(clip_dir), w=100.0, prompt="").score(
        [r.caption for r in records], images=[r.image for r in records]
    )
    for record, row in zip(records, ours, strict=True):
        metric.reset()
        pixels = torch.from_numpy(np.array(Image.open(record.image).convert("RGB"))).permute(2, 0, 1)
        metric.update(pixels, record.caption)
        assert row["clip_s"] == pytest.approx(float(metric.compute()), abs=1e-4), record.id


def test_images_by_id_from_a_folder_or_list_score_as_by_path(clip_dir, tmp_path):
    records = _records()
    by_path = ClipScore(model=str(clip_dir)).score(
        [r.caption for r in records], images=[r.image for r in records]
    )
    listing = tmp_path / "images.txt"
    listing.write_text("\n".join(sorted({r.image for r in records})) + "\n")
    for source in (str(EXAMPLE.parent / "images"), str(listing)):
        scorer = ClipScore(model=str(clip_dir), images=source)
        by_id = scorer.score([r.caption for r in records], image_ids=[r.image_id for r in records])
        assert [r["clip_s"] for r in by_id] == pytest.approx([r["clip_s"] for r in by_path], abs=1e-6)


def test_bad_records_get_reasons_naming_the_fix_and_the_rest_are_scored(clip_dir, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    image = str(EXAMPLE.parent / "images" / "dog.png")
    scorer = ClipScore(model=str(clip_dir), references=True)
    rows = scorer.score(
        ["a dog", "  ", "a dog", "a dog", "a dog"],
        images=[image, image, None, str(broken), image],
        references=[["a brown dog"], ["x"], ["x"], ["x"], []],
    )
    assert "refclip_s" in rows[0] and 0 <= rows[0]["refclip_s"]
    assert "empty" in rows[1]["error"]
    assert "needs the image" in rows[2]["error"] and "--images" in rows[2]["error"]
    assert "broken.png" in rows[3]["error"]
    assert "needs reference captions" in rows[4]["error"]


def test_each_image_is_embedded_once_and_shared_by_the_metrics_of_a_run(clip_dir):
    records = _records()
    clip = ClipScore(model=str(clip_dir), chunk_size=2, image_batch=3)
    before = clip.encoder.embedded
    list(clip.score_records(records))
    distinct = len({r.image for r in records})
    assert clip.encoder.embedded - before <= distinct
    refclip = ClipScore(model=str(clip_dir), references=True, image_batch=3)  # a run's settings
    assert refclip.encoder is clip.encoder  # same checkpoint, device, precision: one model, one cache
    list(refclip.score_records(records))
    assert clip.encoder.embedded - before <= distinct


def test_a_scorers_scores_do_not_depend_on_what_another_image_batch_embedded_first(clip_dir):
    """Scorers sharing the encoder with other image batches keep their embeddings apart: the batch's
    rows change an embedding's last bits on some CPUs' matrix kernels (MKL on an AVX-512 AMD host)."""
    records = _records()[:5]
    captions, images = [r.caption for r in records], [r.image for r in records]
    other = ClipScore(model=str(clip_dir), image_batch=2)
    other.encoder.forget_images()
    fresh = ClipScore(model=str(clip_dir), image_batch=5).score(captions, images=images)
    other.encoder.forget_images()
    other.score(captions, images=images)  # the shared cache now holds the batch-2 embeddings
    after = ClipScore(model=str(clip_dir), image_batch=5).score(captions, images=images)
    assert other.encoder is ClipScore(model=str(clip_dir), image_batch=5).encoder
    assert [r["clip_s"] for r in after] == [r["clip_s"] for r in fresh]


def test_decoding_in_worker_processes_gives_the_same_scores(clip_dir):
    records = _records()[:5]
    captions, images = [r.caption for r in records], [r.image for r in records]
    inline = ClipScore(model=str(clip_dir)).score(captions, images=images)
    workers = ClipScore(model=str(clip_dir), workers=1)
    try:
        pooled = workers.score(captions, images=images)
    finally:
        workers.encoder.close()
    assert [r["clip_s"] for r in pooled] == [r["clip_s"] for r in inline]


def test_signature_names_checkpoint_hash_w_prompt_and_precision(clip_dir):
    fields = Signature.parse(
        ClipScore(model=str(clip_dir), family="pac", references=True).signature
    ).as_dict()
    assert fields["metric"] == "RefPAC-S" and fields["clip"].startswith("sha256-")
    assert (fields["w"], fields["prompt"], fields["prec"]) == ("2", "A%20photo%20depicts", "fp32")
    other = Signature.parse(ClipScore(model=str(clip_dir), w=3, prompt="").signature).as_dict()
    assert (other["metric"], other["w"], other["prompt"]) == ("CLIP-S", "3", "none")


def test_a_long_caption_is_cut_to_77_tokens_and_flagged(clip_dir):
    image = str(EXAMPLE.parent / "images" / "dog.png")
    (row,) = ClipScore(model=str(clip_dir)).score(["a dog " * 80], images=[image])
    assert row["flags"] == ["truncated_caption"] and row["clip_s"] >= 0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"family": "pac"}, "PAC-S checkpoint"),
        ({"w": 0}, "w must be positive"),
        ({"precision": "int8"}, "precision"),
        ({"prompt": "a|b"}, "may not contain"),
        ({"images": "/no/such/folder"}, "does not exist"),
        ({"colour": "red"}, "unknown setting"),
    ],
)
def test_bad_settings_fail_before_any_model_loads(settings, message, monkeypatch):
    import qace.judges.clip_model

    monkeypatch.setattr(qace.judges.clip_model, "shared_encoder", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(ConfigError, match=message):
        ClipScore(**settings)


def test_a_missing_checkpoint_names_the_option_and_the_fix(tmp_path):
    from qace.errors import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="--clip-model"):
        ClipScore(model=str(tmp_path / "nothing-here"))


def test_rows_are_json_with_image_and_signature(clip_dir):
    (row,) = ClipScore(model=str(clip_dir)).score(
        ["a dog"], images=[str(EXAMPLE.parent / "images" / "dog.png")]
    )
    assert json.loads(json.dumps(row))["signature"].startswith("CLIP-S|clip:sha256-")


def test_pixels_are_transformers_pillow_processor_s(clip_dir, drawn_images):
    """Our light decoding (worker processes import no Transformers) gives the processor's 8-bit pixels,
    on images wider, taller and smaller than the crop."""
    import json as json_module

    import numpy as np
    import transformers

    from qace.judges.clip_images import ClipPixels

    config = json_module.loads((clip_dir / "preprocessor_config.json").read_text())
    cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    processor = cls(**{**config, "size": {"shortest_edge": 24}, "crop_size": {"height": 24, "width": 24}})
    ours = ClipPixels.from_config(processor.to_dict())
    from PIL import Image

    for path in [*drawn_images.values(), *sorted((EXAMPLE.parent / "images").glob("*.png"))]:
        with Image.open(path) as image:
            want = processor(
                images=image.convert("RGB"), do_rescale=False, do_normalize=False, return_tensors="np"
            )
        np.testing.assert_array_equal(
            ours(str(path)), want["pixel_values"][0].astype(np.uint8), err_msg=str(path)
        )


NAMES = (("self_attn.out_proj", "attn.out_proj"), ("layer_norm1", "ln_1"), ("layer_norm2", "ln_2"),
         ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj"))  # fmt: skip
"""Transformers' and OpenAI ``clip``'s names of a transformer block's parts."""


def _openai_layout(model) -> dict:  # noqa: ANN001
    """The tiny CLIP's weights under OpenAI ``clip``'s names (fused q/k/v, transposed projections)."""
    state = model.state_dict()
    out = {
        "visual.conv1.weight": state["vision_model.embeddings.patch_embedding.weight"],
        "visual.class_embedding": state["vision_model.embeddings.class_embedding"],
        "visual.positional_embedding": state["vision_model.embeddings.position_embedding.weight"],
        "visual.ln_pre.weight": state["vision_model.pre_layrnorm.weight"],
        "visual.ln_pre.bias": state["vision_model.pre_layrnorm.bias"],
        "visual.ln_post.weight": state["vision_model.post_layernorm.weight"],
        "visual.ln_post.bias": state["vision_model.post_layernorm.bias"],
        "visual.proj": state["visual_projection.weight"].t(),
        "token_embedding.weight": state["text_model.embeddings.token_embedding.weight"],
        "positional_embedding": state["text_model.embeddings.position_embedding.weight"],
        "ln_final.weight": state["text_model.final_layer_norm.weight"],
        "ln_final.bias": state["text_model.final_layer_norm.bias"],
        "text_projection": state["text_projection.weight"].t(),
        "logit_scale": state["logit_scale"],
    }
    import torch

    for tower, prefix in (("vision_model", "visual.transformer"), ("text_model", "transformer")):
        for i in range(2):
            hf, oa = f"{tower}.encoder.layers.{i}", f"{prefix}.resblocks.{i}"
            for kind in ("weight", "bias"):
                qkv = [state[f"{hf}.self_attn.{n}_proj.{kind}"] for n in "qkv"]
                out[f"{oa}.attn.in_proj_{kind}"] = torch.cat(qkv)
                for ours, theirs in NAMES:
                    out[f"{oa}.{theirs}.{kind}"] = state[f"{hf}.{ours}.{kind}"]
    return out


def test_an_openai_layout_checkpoint_converts_to_the_same_scores(clip_dir, tmp_path):
    """PAC-S ships OpenAI-``clip`` state dicts: converted, the tiny CLIP scores exactly as before."""
    import torch
    from transformers import CLIPModel

    from qace.judges.clip_convert import main as convert_main

    checkpoint = tmp_path / "pacs.pth"
    torch.save({"state_dict": _openai_layout(CLIPModel.from_pretrained(clip_dir))}, checkpoint)
    assert convert_main([str(checkpoint), str(tmp_path / "converted"), "--base", str(clip_dir)]) == 0
    records = _records()[:4]
    captions, images = [r.caption for r in records], [r.image for r in records]
    before = ClipScore(model=str(clip_dir), family="pac").score(captions, images=images)
    after = ClipScore(model=str(tmp_path / "converted"), family="pac").score(captions, images=images)
    assert [r["pac_s"] for r in after] == [r["pac_s"] for r in before]
    torch.save({"state_dict": {"visual.proj": torch.zeros(3, 3)}}, tmp_path / "bad.pth")
    with pytest.raises(ConfigError, match="does not fit"):
        convert_main([str(tmp_path / "bad.pth"), str(tmp_path / "bad"), "--base", str(clip_dir)])
