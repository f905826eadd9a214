"""VisCE² on the tiny test VLM: loading, rows, determinism, context caching, batching, errors, resume,
and the expected rating against a direct forward pass."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("PIL")

from qace.config import parse_signature  # noqa: E402
from qace.data.records import Record, RecordError  # noqa: E402
from qace.errors import ConfigError, InputError, ModelNotFoundError, ResumeError  # noqa: E402
from qace.judges.rating import expected_rating, parse_rating  # noqa: E402
from qace.judges.visce2 import VisCE2, VisCE2Config, build_signature  # noqa: E402
from qace.judges.visce2_prompts import CONTEXT_PROMPT, rating_text  # noqa: E402

CAPTIONS = [
    "A girl in a red dress running on the beach.",
    "A dog runs in the snow.",
    "two women cooking in a kitchen",
    "a man riding a bike in the city",
    "the the the",
    "A brown dog jumps for a frisbee.",
]
SETTINGS = {"context_tokens": 24, "progress": False, "expected": True, "explain": True}


@pytest.fixture(scope="module")
def scorer(test_vlm_dir) -> VisCE2:
    return VisCE2(model=str(test_vlm_dir), **SETTINGS)


def _images(drawn_images, n: int) -> list[str]:
    names = ["beach", "park", "night"]
    return [str(drawn_images[names[i % 3]]) for i in range(n)]


def test_loads_with_auto_classes_and_signs_its_settings(test_vlm_dir, scorer):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    assert type(AutoModelForImageTextToText.from_pretrained(test_vlm_dir)).__name__ == (
        "LlavaForConditionalGeneration"
    )
    assert AutoProcessor.from_pretrained(test_vlm_dir).chat_template
    fields = parse_signature(scorer.signature)
    assert fields["metric"] == "VisCE2"
    assert fields["vlm"].startswith("sha256-")
    assert (fields["ctx"], fields["rate"], fields["exp"], fields["prec"], fields["dec"]) == (
        "24",
        "8",
        "yes",
        "fp32",
        "greedy",
    )
    assert scorer.uses_test_models
    other = build_signature(VisCE2Config(variant="vanilla", context_tokens=24), fields["vlm"])
    assert parse_signature(other)["metric"] == "VisCE2-Vanilla" and "ctx" not in parse_signature(other)


def test_rows_hold_the_parsed_rating_raw_text_context_and_expected(scorer, drawn_images):
    rows = scorer.score(CAPTIONS, _images(drawn_images, len(CAPTIONS)))
    assert [r["id"] for r in rows] == [str(i) for i in range(len(CAPTIONS))]
    scored = [r for r in rows if "error" not in r]
    assert scored, "the test VLM should rate some captions"
    for row in scored:
        parsed = parse_rating(row["visce2_raw"])
        assert parsed is not None and row["visce2"] == float(parsed.value)
        assert 0.0 <= row["visce2"] <= 100.0
        assert row["context"]
        assert row["signature"] == scorer.signature
        if row["visce2_expected"] is not None:
            assert 0.0 <= row["visce2_expected"] <= 100.0
        else:
            assert "expected_unavailable" in row["flags"]
    assert len({r["visce2"] for r in scored}) > 1, "scores should vary across captions and images"
    for row in rows:
        if "error" in row:
            assert row["error"].startswith("no rating 0-100 in the model's answer")


def test_same_input_twice_gives_identical_scores_also_from_a_fresh_scorer(test_vlm_dir, scorer, drawn_images):
    images = _images(drawn_images, len(CAPTIONS))
    first = scorer.score(CAPTIONS, images)
    again = scorer.score(CAPTIONS, images)
    fresh = VisCE2(model=str(test_vlm_dir), **SETTINGS).score(CAPTIONS, images)
    assert first == again == fresh


def test_batch_shape_does_not_change_fp32_scores(test_vlm_dir, scorer, drawn_images):
    images = _images(drawn_images, len(CAPTIONS))
    one_by_one = VisCE2(model=str(test_vlm_dir), max_batch_rows=1, **SETTINGS).score(CAPTIONS, images)
    batched = scorer.score(CAPTIONS, images)
    strip = [{k: v for k, v in r.items() if k != "visce2_expected"} for r in batched]
    assert strip == [{k: v for k, v in r.items() if k != "visce2_expected"} for r in one_by_one]
    for a, b in zip(batched, one_by_one, strict=True):
        if a.get("visce2_expected") is not None:
            assert a["visce2_expected"] == pytest.approx(b["visce2_expected"], abs=1e-4)


def test_each_image_context_is_computed_once_and_shared_by_identical_files(test_vlm_dir, drawn_images):
    scorer = VisCE2(model=str(test_vlm_dir), **{**SETTINGS, "chunk_size": 2})
    seen: list[tuple[int, int]] = []
    generate = scorer.runner.generate

    def counting(rows, max_new_tokens, **kwargs):
        seen.append((len(rows), max_new_tokens))
        return generate(rows, max_new_tokens, **kwargs)

    scorer.runner.generate = counting  # type: ignore[method-assign]
    images = [drawn_images[n] for n in ("beach", "park", "beach_copy", "beach", "park", "night")]
    rows = scorer.score(CAPTIONS, images)
    context_rows = sum(n for n, tokens in seen if tokens == SETTINGS["context_tokens"])
    assert context_rows == 3  # beach (and its byte-identical copy), park, night: across three chunks
    assert scorer.contexts.computed == 3 and len(scorer.contexts) == 3
    assert scorer.contexts.reused >= 2
    by_image = {}
    for row, image in zip(rows, images, strict=True):
        if "context" in row:
            by_image.setdefault(image.read_bytes(), set()).add(row["context"])
    assert all(len(contexts) == 1 for contexts in by_image.values())


def test_prompts_reach_the_model_as_the_paper_writes_them(test_vlm_dir, drawn_images):
    scorer = VisCE2(model=str(test_vlm_dir), **SETTINGS)
    sent: list[str] = []
    encode = scorer.runner.encode

    def spying(image, text):
        sent.append(text)
        return encode(image, text)

    scorer.runner.encode = spying  # type: ignore[method-assign]
    rows = scorer.score(["a dark night", "a red ball"], [drawn_images["night"]] * 2)
    assert set(sent) == {
        CONTEXT_PROMPT,
        rating_text(scorer.variant, "a dark night", rows[0]["context"]),
        rating_text(scorer.variant, "a red ball", rows[1]["context"]),
    }
    assert scorer.runner.prompt("hi").startswith("USER: <image>\nhi")


def test_missing_and_unreadable_images_fail_only_their_records(scorer, drawn_images, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(drawn_images["beach"].read_bytes()[:60])
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    images = [drawn_images["beach"], tmp_path / "missing.jpg", broken, text, drawn_images["park"]]
    rows = scorer.score(["a beach"] * 5, images, ids=["ok1", "gone", "cut", "text", "ok2"])
    errors = {r["id"]: r["error"] for r in rows if "error" in r}
    assert "missing.jpg" in errors["gone"] and "does not exist" in errors["gone"]
    assert "broken.png" in errors["cut"]
    assert "notes.png" in errors["text"]
    assert {r["id"] for r in rows} == {"ok1", "gone", "cut", "text", "ok2"}
    good = [r for r in rows if r["id"] in ("ok1", "ok2")]
    assert all("visce2" in r or r["error"].startswith("no rating") for r in good)


def test_records_without_image_or_caption_are_errors_in_place(scorer, drawn_images):
    records = [
        Record("a", "a girl on the beach", image=str(drawn_images["beach"])),
        Record("b", "no image here"),
        RecordError("line 3", "line 3: malformed JSON"),
        Record("c", "   ", image=str(drawn_images["beach"])),
        Record("d", "a park", image=str(drawn_images["park"])),
    ]
    results = list(scorer.score_records(records))
    assert [r.id if isinstance(r, RecordError) else r["id"] for r in results] == [
        "a",
        "b",
        "line 3",
        "c",
        "d",
    ]
    assert isinstance(results[1], RecordError) and "missing image" in results[1].reason
    assert isinstance(results[3], RecordError) and "empty" in results[3].reason


def test_an_answer_without_a_rating_is_an_error_quoting_it(scorer, drawn_images, monkeypatch):
    from qace.judges.vlm import Generation

    def no_number(rows, max_new_tokens, **kwargs):
        return [Generation((5,), "a lovely picture of things", False, None) for _ in rows]

    monkeypatch.setattr(scorer.runner, "generate", no_number)
    row = scorer.score(["a girl"], [drawn_images["beach"]], ids=["x"])[0]
    assert row == {"id": "x", "error": "no rating 0-100 in the model's answer 'a lovely picture of things'"}


def test_expected_rating_matches_a_direct_forward_pass(scorer, drawn_images):
    """Teacher-force each greedy answer and recompute the number-token distribution at its digits."""
    from qace.judges.images import load_image

    images = _images(drawn_images, len(CAPTIONS))
    rows = scorer.score(CAPTIONS, images)
    checked = 0
    for caption, path, row in zip(CAPTIONS, images, rows, strict=True):
        if row.get("visce2_expected") is None:
            continue
        inputs = scorer.runner.encode(load_image(path), rating_text(scorer.variant, caption, row["context"]))
        answer = scorer.runner.generate([inputs], scorer.config.answer_tokens)[0]
        assert answer.text == row["visce2_raw"]
        ids = torch.cat([inputs["input_ids"], torch.tensor([answer.token_ids])], dim=1)
        with torch.inference_mode():
            logits = scorer.runner.model(
                input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=inputs["pixel_values"]
            ).logits[0]
        parsed = parse_rating(answer.text)
        assert parsed is not None
        steps, pieces = scorer.runner.pieces(answer.token_ids, parsed.start, parsed.end)
        assert "".join(p.strip("▁") for p in pieces) == answer.text[parsed.start : parsed.end]
        positions = inputs["input_ids"].shape[1] - 1 + np.asarray(steps)
        probs = logits[positions].softmax(-1)[:, scorer.runner.numbers.ids].numpy()
        want = expected_rating(pieces, probs, scorer.runner.numbers)
        assert want is not None and row["visce2_expected"] == pytest.approx(want, abs=1e-4)
        checked += 1
    assert checked >= 2


def test_variants_vanilla_runs_no_context_step(test_vlm_dir, drawn_images):
    scorer = VisCE2(model=str(test_vlm_dir), variant="vanilla", progress=False, explain=True)
    rows = scorer.score(CAPTIONS[:3], _images(drawn_images, 3))
    assert scorer.contexts.computed == 0
    assert all("context" not in r for r in rows)
    assert parse_signature(scorer.signature)["metric"] == "VisCE2-Vanilla"


def test_bad_settings_and_missing_models_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="variant"):
        VisCE2Config(variant="best")
    with pytest.raises(ConfigError, match="precision"):
        VisCE2Config(precision="int8")
    with pytest.raises(ConfigError, match="unknown VisCE"):
        VisCE2(batch=3)
    with pytest.raises(ModelNotFoundError, match="--vlm"):
        VisCE2(model=str(tmp_path / "no-such-dir"))


def test_score_file_resumes_to_the_same_bytes(test_vlm_dir, drawn_images, tmp_path, monkeypatch):
    source = tmp_path / "in.jsonl"
    images = _images(drawn_images, len(CAPTIONS))
    source.write_text(
        "".join(
            json.dumps({"id": f"c{i}", "caption": c, "image": images[i]}) + "\n"
            for i, c in enumerate(CAPTIONS)
        )
        + json.dumps({"id": "gone", "caption": "x", "image": "missing.png"})
        + "\n"
    )
    settings = {**SETTINGS, "chunk_size": 2}
    whole = tmp_path / "whole.jsonl"
    VisCE2(model=str(test_vlm_dir), **settings).score_file(source, whole)

    scorer = VisCE2(model=str(test_vlm_dir), **settings)
    chunk = scorer._score_items
    calls = {"n": 0}

    def crash_on_third(items):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return chunk(items)

    monkeypatch.setattr(scorer, "_score_items", crash_on_third)
    resumed = tmp_path / "resumed.jsonl"
    with pytest.raises(KeyboardInterrupt):
        scorer.score_file(source, resumed)
    monkeypatch.undo()
    summary = VisCE2(model=str(test_vlm_dir), **settings).score_file(source, resumed, resume=True)
    assert summary.skipped == 4
    assert resumed.read_bytes() == whole.read_bytes()
    errors = (tmp_path / "whole.errors.jsonl").read_text()
    assert "missing.png" in errors and errors == (tmp_path / "resumed.errors.jsonl").read_text()
    with pytest.raises(ResumeError):
        VisCE2(model=str(test_vlm_dir), **{**settings, "expected": False}).score_file(
            source, tmp_path / "resumed.jsonl", resume=True
        )


def test_misaligned_images_are_an_input_error(scorer, drawn_images):
    """Like QACE's and the regeneration score's list APIs: InputError, raised before any work."""
    with pytest.raises(InputError, match="got 2 captions but 1 images"):
        scorer.score(["a girl on the beach", "a park"], [drawn_images["beach"]])
