"""Regeneration score on tiny random-weight models: errors, determinism, samples, saved images, resume,
and the cosine itself against a direct computation."""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers")
PIL = pytest.importorskip("PIL")
from PIL import Image, ImageDraw  # noqa: E402

from qace.config import parse_signature  # noqa: E402
from qace.data.records import Record, RecordError  # noqa: E402
from qace.errors import ConfigError, InputError, ModelNotFoundError, ResumeError  # noqa: E402
from qace.judges.regen import (  # noqa: E402
    RegenConfig,
    RegenScore,
    add_cli_arguments,
    image_file_name,
    sample_seed,
)
from qace.judges.regen_loading import Preprocess, tree_fingerprint  # noqa: E402
from qace.scorers import get  # noqa: E402
from qace.testing.regen import make_regen_test_models  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
SETTINGS = {"size": 32, "steps": 2, "batch_size": 3, "chunk_size": 4, "progress": False}


@pytest.fixture(scope="session")
def regen_loading() -> Path:
    """Tiny generator/ and encoder/, built once and cached (QACE_REGEN_TEST_MODELS or .qace-cache/)."""
    cache = os.environ.get("QACE_REGEN_TEST_MODELS") or REPO_ROOT / ".qace-cache" / "regen-test-models"
    return make_regen_test_models(cache)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    """Drawn PNG and JPEG images of other sizes, a missing path, a non-image and a truncated PNG."""
    root = tmp_path_factory.mktemp("images")
    out = {}
    for name, colour, size, fmt in [
        ("red.png", "red", (48, 40), "PNG"),
        ("blue.jpg", "blue", (40, 64), "JPEG"),
        ("green.png", "green", (32, 32), "PNG"),
    ]:
        image = Image.new("RGB", size, colour)
        draw = ImageDraw.Draw(image)
        draw.ellipse((4, 6, 28, 30), fill="white")
        draw.rectangle((20, 2, 30, 12), fill="black")
        image.save(root / name, format=fmt)
        out[name] = root / name
    out["missing.png"] = root / "missing.png"
    (root / "notes.png").write_text("not an image at all")
    out["notes.png"] = root / "notes.png"
    (root / "cut.png").write_bytes((root / "red.png").read_bytes()[:60])
    out["cut.png"] = root / "cut.png"
    return out


def make(models: Path, **settings) -> RegenScore:
    return RegenScore(
        generator=str(models / "generator"), image_encoder=str(models / "encoder"), **{**SETTINGS, **settings}
    )


@pytest.fixture(scope="module")
def scorer(regen_loading) -> RegenScore:
    return make(regen_loading)


CAPTIONS = ["a dog on the grass", "a red ball", "two people near the water", "a cat"]


def test_rows_in_input_order_with_bad_images_as_errors(scorer, images):
    records = [
        Record("a", CAPTIONS[0], image=str(images["red.png"])),
        Record("b", CAPTIONS[1], image=str(images["missing.png"])),
        Record("c", CAPTIONS[2], image=str(images["blue.jpg"])),
        RecordError("line 4", "malformed JSON"),
        Record("d", CAPTIONS[3], image=str(images["notes.png"])),
        Record("e", CAPTIONS[0], image=str(images["cut.png"])),
        Record("f", CAPTIONS[1]),
        Record("g", CAPTIONS[1], image=str(images["green.png"])),
    ]
    results = list(scorer.score_records(records))
    assert [r.id if isinstance(r, RecordError) else r["id"] for r in results] == list("abc") + [
        "line 4",
        "d",
        "e",
        "f",
        "g",
    ]
    errors = {r.id: r.reason for r in results if isinstance(r, RecordError)}
    assert "missing.png" in errors["b"] and "does not exist" in errors["b"]
    assert "notes.png" in errors["d"]
    assert "cut.png" in errors["e"]
    assert "missing image" in errors["f"]
    rows = [r for r in results if not isinstance(r, RecordError)]
    for row in rows:
        assert -1.0 <= row["regen"] <= 1.0
        assert row["signature"] == scorer.signature
        assert "regen_samples" not in row and "generated_images" not in row
    assert len({row["regen"] for row in rows}) == len(rows)  # other captions/images, other scores


def test_list_api_and_signature(scorer, images):
    rows = scorer.score(CAPTIONS[:2], images=[images["red.png"], images["missing.png"]], ids=["x", "y"])
    assert rows[0]["id"] == "x" and isinstance(rows[0]["regen"], float)
    assert rows[1] == {"id": "y", "error": f"image file {str(images['missing.png'])!r} does not exist"}
    fields = parse_signature(scorer.signature)
    assert fields["metric"] == "Regen"
    assert fields["gen"].startswith("sha256-") and fields["enc"].startswith("sha256-")
    assert (fields["steps"], fields["size"], fields["n"], fields["seed"]) == ("2", "32", "1", "0")
    assert scorer.uses_test_models


def test_same_input_twice_gives_identical_scores(regen_loading, scorer, images):
    inputs = (CAPTIONS, [images["red.png"], images["blue.jpg"], images["green.png"], images["red.png"]])
    first = scorer.score(*inputs)
    assert scorer.score(*inputs) == first  # cached originals, same seeds
    assert make(regen_loading).score(*inputs) == first  # a fresh scorer: nothing carried over


def test_scores_do_not_depend_on_batch_composition_or_order(regen_loading, scorer, images):
    paths = [images["red.png"], images["blue.jpg"], images["green.png"], images["red.png"]]
    batched = {r["id"]: r["regen"] for r in scorer.score(CAPTIONS, images=paths)}
    one = make(regen_loading, batch_size=1, chunk_size=1)
    reordered = one.score(CAPTIONS[::-1], images=paths[::-1], ids=["3", "2", "1", "0"])
    for row in reordered:
        assert row["regen"] == pytest.approx(batched[row["id"]], abs=1e-6)


def test_seed_and_caption_change_the_generated_image(regen_loading, scorer, images):
    base = scorer.score(CAPTIONS[:1], images=[images["red.png"]])[0]["regen"]
    other_seed = make(regen_loading, seed=1)
    assert other_seed.score(CAPTIONS[:1], images=[images["red.png"]])[0]["regen"] != base
    assert sample_seed(0, "a", 0) != sample_seed(0, "a", 1) != sample_seed(1, "a", 0)
    assert sample_seed(0, "a", 0) == sample_seed(0, "a", 0) < 2**63


def test_samples_are_averaged(regen_loading, scorer, images):
    three = make(regen_loading, samples=3)
    paths = [images["red.png"], images["blue.jpg"]]
    rows = three.score(CAPTIONS[:2], images=paths)
    single = scorer.score(CAPTIONS[:2], images=paths)
    for row, one in zip(rows, single, strict=True):
        samples = row["regen_samples"]
        assert len(samples) == 3 and len(set(samples)) == 3  # other seeds, other images
        assert row["regen"] == pytest.approx(float(np.mean(samples)), abs=1e-12)
        assert samples[0] == pytest.approx(one["regen"], abs=1e-6)  # sample 0 has the samples=1 seed
    assert parse_signature(three.signature)["n"] == "3"


def _embed_file(scorer: RegenScore, path: Path) -> torch.Tensor:
    array = np.array(Image.open(path).convert("RGB"))
    return scorer.encoder.embed([torch.from_numpy(array).permute(2, 0, 1)])[0]


def test_saved_images_are_the_embedded_pixels(regen_loading, images, tmp_path):
    saver = make(regen_loading, samples=2, save_images=str(tmp_path / "gen"))
    ids = ["img/1", "b", "c"]
    rows = saver.score([CAPTIONS[0], CAPTIONS[1], CAPTIONS[0]], images=[images["red.png"]] * 3, ids=ids)
    for row in rows:
        files = [Path(p) for p in row["generated_images"]]
        assert len(files) == 2 and all(f.parent == tmp_path / "gen" for f in files)
        original = _embed_file(saver, images["red.png"])
        for path, cosine in zip(files, row["regen_samples"], strict=True):
            with Image.open(path) as image:
                image.verify()
            with Image.open(path) as image:
                assert image.format == "PNG" and image.size == (32, 32) and image.mode == "RGB"
            # re-encoding the kept PNG reproduces the score: it holds exactly the embedded pixels
            assert float(_embed_file(saver, path) @ original) == pytest.approx(cosine, abs=1e-6)
    assert len({p for row in rows for p in row["generated_images"]}) == 6
    assert "/" not in Path(rows[0]["generated_images"][0]).name
    assert rows[0]["regen"] == rows[2]["regen"]  # same caption and image: same seed, same score


def test_cosine_matches_a_direct_computation(regen_loading, images, tmp_path):
    """One pair by hand: transformers' own CLIP model and image processor, numpy cosine."""
    from transformers import CLIPImageProcessor, CLIPVisionModelWithProjection

    saver = make(regen_loading, save_images=str(tmp_path))
    row = saver.score([CAPTIONS[2]], images=[images["blue.jpg"]])[0]
    model = CLIPVisionModelWithProjection.from_pretrained(str(regen_loading / "encoder")).eval()
    processor = CLIPImageProcessor.from_pretrained(str(regen_loading / "encoder"))
    pictures = [Image.open(images["blue.jpg"]).convert("RGB"), Image.open(row["generated_images"][0])]
    hf_pixels = processor(images=pictures, return_tensors="pt")["pixel_values"]
    tensors = [torch.from_numpy(np.array(p)).permute(2, 0, 1)[None] for p in pictures]
    ours = [saver.encoder.preprocess(t)[0] for t in tensors]
    # our torch preprocessing vs transformers' Pillow one: the 32 px generated image needs no resize
    # (identical); the 40x64 original is resized, where Pillow and torch round a few pixels differently
    assert torch.allclose(ours[1], hf_pixels[1], atol=1e-5)
    assert (ours[0] - hf_pixels[0]).abs().mean() < 0.02
    with torch.no_grad():
        ours_emb = model(pixel_values=torch.stack(ours)).image_embeds.numpy().astype(np.float64)
        hf_emb = model(pixel_values=hf_pixels).image_embeds.numpy().astype(np.float64)

    def cosine(a: np.ndarray, b: np.ndarray) -> float:
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    assert row["regen"] == pytest.approx(cosine(ours_emb[0], ours_emb[1]), abs=1e-6)
    assert row["regen"] == pytest.approx(cosine(hf_emb[0], hf_emb[1]), abs=5e-3)


class _Mirror:
    """A stand-in pipeline that 'generates' a fixed picture and records the seeds it was given."""

    def __init__(self, picture: np.ndarray) -> None:
        self.picture = torch.from_numpy(picture).permute(2, 0, 1).float() / 255
        self.calls: list[list[tuple[str, int]]] = []

    def __call__(self, *, prompt, generator, output_type, **kwargs):
        assert output_type == "pt" and len(generator) == len(prompt)
        self.calls.append([(p, g.initial_seed()) for p, g in zip(prompt, generator, strict=True)])
        images = self.picture.expand(len(prompt), -1, -1, -1).clone()
        for i, text in enumerate(prompt):
            if "nan" in text:
                images[i, 0, 0, 0] = float("nan")
        return argparse.Namespace(images=images)


def test_identical_images_score_one_and_each_caption_keeps_its_seed(scorer, images, tmp_path):
    picture = np.array(Image.open(images["green.png"]).convert("RGB"))
    mirror = _Mirror(picture)
    judge = RegenScore(
        pipeline=mirror, encoder=scorer.encoder, generator="mirror", image_encoder="tiny", **SETTINGS
    )
    assert parse_signature(judge.signature)["gen"] == "mirror"
    rows = judge.score(["a", "b", "a", "nan c", "d"], images=[images["green.png"]] * 5)
    assert [r["regen"] for r in rows[:3]] == pytest.approx([1.0, 1.0, 1.0], abs=1e-6)
    assert rows[3]["flags"] == ["nonfinite_image"] and rows[0]["flags"] == []
    seen = [pair for call in mirror.calls for pair in call]
    assert [p for p, _ in seen] == ["a", "b", "nan c", "d"]  # the repeated caption is generated once
    assert all(seed == sample_seed(0, p, 0) for p, seed in seen)
    assert [len(call) for call in mirror.calls] == [3, 1]


def test_resumed_file_run_equals_uninterrupted_run(regen_loading, images, tmp_path, monkeypatch):
    lines = []
    names = ["red.png", "blue.jpg", "missing.png", "green.png", "notes.png", "red.png", "blue.jpg"]
    for i, name in enumerate(names):
        image = os.path.relpath(images[name], tmp_path)  # relative to the input file, as data sets ship
        lines.append(json.dumps({"id": f"r{i}", "caption": CAPTIONS[i % 4], "image": image}))
    lines.append(json.dumps({"id": "r7", "caption": "no image here"}))
    source = tmp_path / "captions.jsonl"
    source.write_text("\n".join(lines) + "\n")
    judge = make(regen_loading, chunk_size=2)
    whole = tmp_path / "whole.jsonl"
    summary = judge.score_file(source, whole)
    assert (summary.scored, summary.errors, summary.metric) == (5, 3, "regen")

    real = judge._score_chunk
    calls = {"n": 0}

    def dying(chunk):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")
        return real(chunk)

    monkeypatch.setattr(judge, "_score_chunk", dying)
    broken = tmp_path / "broken.jsonl"
    with pytest.raises(KeyboardInterrupt):
        judge.score_file(source, broken)
    assert not broken.exists()
    monkeypatch.setattr(judge, "_score_chunk", real)
    fresh = make(regen_loading, chunk_size=2)  # a new process would start with an empty image cache
    assert fresh.score_file(source, broken, resume=True).skipped == 4
    assert broken.read_bytes() == whole.read_bytes()
    assert (tmp_path / "broken.errors.jsonl").read_bytes() == (tmp_path / "whole.errors.jsonl").read_bytes()
    other = make(regen_loading, chunk_size=2, steps=3)
    with pytest.raises(ResumeError, match="signature"):
        other.score_file(source, broken, resume=True)


def from_cli(args: argparse.Namespace) -> RegenScore:
    """The scorer ``qace score --metric regen`` builds from parsed arguments: the registry's entry."""
    entry = get("regen")
    return entry.build(args.device, **entry.settings_from(args))  # type: ignore[return-value]


def test_cli_options_build_the_configured_scorer(regen_loading, tmp_path):
    parser = argparse.ArgumentParser()
    for flag, kwargs in [
        ("--device", {"default": "cpu"}),
        ("--precision", {"default": "fp32"}),
        ("--chunk-size", {"type": int, "default": 512}),
        ("--no-progress", {"action": "store_true"}),
    ]:
        parser.add_argument(flag, **kwargs)
    add_cli_arguments(parser)
    defaults = parser.parse_args([])
    assert (defaults.samples, defaults.regen_steps, defaults.regen_size) == (1, RegenConfig.steps, 512)
    assert defaults.generator is None and defaults.save_images is None
    args = parser.parse_args(
        [
            "--generator", str(regen_loading / "generator"),
            "--image-encoder", str(regen_loading / "encoder"),
            "--samples", "2", "--regen-steps", "3", "--regen-size", "32", "--regen-guidance", "2.5",
            "--regen-seed", "7", "--regen-batch", "5", "--save-images", str(tmp_path),
            "--chunk-size", "9", "--no-progress",
        ]
    )  # fmt: skip
    judge = from_cli(args)
    cfg = judge.config
    assert (cfg.samples, cfg.steps, cfg.size, cfg.guidance, cfg.seed, cfg.batch_size) == (2, 3, 32, 2.5, 7, 5)
    assert (cfg.save_images, cfg.chunk_size, cfg.progress, cfg.device) == (str(tmp_path), 9, False, "cpu")
    assert parse_signature(judge.signature)["cfg"] == "2.5"
    with pytest.raises(ConfigError, match="precision"):
        from_cli(parser.parse_args(["--precision", "int8", "--generator", str(regen_loading / "generator")]))


def test_missing_models_are_named_with_the_fix(tmp_path, regen_loading, monkeypatch):
    with pytest.raises(ModelNotFoundError, match="generator.*no such model directory.*--generator"):
        make(regen_loading).__class__(generator=str(tmp_path / "nowhere"), image_encoder="x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="model_index.json"):
        RegenScore(generator=str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="image encoder.*HF_HUB_OFFLINE"):
        RegenScore(generator=str(regen_loading / "generator"), image_encoder="nobody/no-such-encoder")


def test_fingerprint_follows_weights_and_scheduler(regen_loading, tmp_path):
    copy = tmp_path / "generator"
    shutil.copytree(regen_loading / "generator", copy)
    assert tree_fingerprint(copy) == tree_fingerprint(regen_loading / "generator")
    config = copy / "scheduler" / "scheduler_config.json"
    config.write_text(config.read_text().replace('"DDIMScheduler"', '"PNDMScheduler"'))
    assert tree_fingerprint(copy) != tree_fingerprint(regen_loading / "generator")
    assert tree_fingerprint("owner/model") == "owner/model"


def test_test_models_are_deterministic_and_reused(tmp_path, regen_loading):
    built = make_regen_test_models(tmp_path / "a")
    for role in ("generator", "encoder"):
        assert tree_fingerprint(built / role) == tree_fingerprint(regen_loading / role)
    stamp = (built / "generator" / "unet" / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns
    make_regen_test_models(tmp_path / "a")
    assert (built / "generator" / "unet" / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns == stamp


def test_preprocess_follows_transformers_sizes():
    clip = Preprocess.from_config(
        {"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224}, "do_center_crop": True,
         "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 3}
    )  # fmt: skip
    assert clip.target_size(480, 640) == (224, 298) and clip.target_size(641, 480) == (299, 224)
    out = clip(torch.full((2, 3, 480, 640), 255, dtype=torch.uint8))
    assert out.shape == (2, 3, 224, 224) and torch.allclose(out, torch.ones_like(out))
    vit = Preprocess.from_config({"size": {"height": 16, "width": 16}, "do_normalize": False})
    assert vit(torch.zeros(1, 3, 40, 30, dtype=torch.uint8)).shape == (1, 3, 16, 16)
    with pytest.raises(ConfigError, match="aspect"):
        Preprocess.from_config({"size": {"shortest_edge": 224}})


def test_image_file_names_are_safe_and_distinct():
    assert image_file_name("abc_1", 0) == "abc_1-0.png"
    names = {image_file_name(i, 1) for i in ["a/b", "a_b", "a:b", "../x", ".hidden"]}
    assert len(names) == 5 and not any("/" in n or n.startswith(".") for n in names)


def test_settings_are_checked(regen_loading):
    with pytest.raises(ConfigError, match="unknown setting"):
        make(regen_loading, nonsense=1)
    with pytest.raises(ConfigError, match="multiple of 8"):
        RegenConfig(size=30)
    with pytest.raises(ConfigError, match="samples"):
        RegenConfig(samples=0)


def test_demo_falls_back_to_test_models_without_touching_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("QACE_TEST_MODELS", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    entry = get("regen")
    judge = entry.build_demo()  # the default models are not in this machine's cache: offline, no hub call
    assert judge.uses_test_models and "--generator" in (entry.hint or "")
    assert (judge.config.size, judge.config.steps) == (32, 2)
    assert "HF_HUB_OFFLINE" not in os.environ


def test_misaligned_images_or_ids_are_an_input_error(scorer, images):
    with pytest.raises(InputError, match="got 2 captions but 1 images"):
        scorer.score(CAPTIONS[:2], images=[images["red.png"]])
    with pytest.raises(InputError, match="got 1 captions but 2 ids"):
        scorer.score(CAPTIONS[:1], images=[images["red.png"]], ids=["x", "y"])
