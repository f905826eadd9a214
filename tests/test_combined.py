"""Several metrics in one pass (`qace.combined`): ``qace score --metric qace-ref,clip-s`` reads the file
once and writes one row per record with every metric's columns and its own signature column; the
values are the single-metric runs'; metrics writing one score column are refused before loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("PIL")

from qace.cli import main  # noqa: E402
from qace.combined import SEPARATOR, combined_entry  # noqa: E402
from qace.errors import ConfigError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "qace" / "examples" / "captions.jsonl"


def _rows(path: Path) -> dict[str, dict]:
    return {row["id"]: row for row in map(json.loads, path.open())}


def _errors(path: Path) -> dict[str, str]:
    errors = path.with_name(path.stem + ".errors.jsonl")
    return {e["id"]: e["reason"] for e in map(json.loads, errors.open())} if errors.exists() else {}


def test_qace_ref_and_clip_s_in_one_pass_equal_their_single_runs(test_models_dir, clip_dir, tmp_path):
    source = tmp_path / "captions.jsonl"
    shutil.copy(EXAMPLE, source)
    shutil.copytree(EXAMPLE.parent / "images", tmp_path / "images")
    (tmp_path / "images" / "dog.png").unlink()  # clip-s cannot score ex05-ex07; qace-ref could
    base = [
        "score",
        str(source),
        "--models",
        str(test_models_dir),
        "--clip-model",
        str(clip_dir),
        "--no-progress",
    ]
    outputs = {}
    for metric in ("qace-ref", "clip-s", "qace-ref,clip-s"):
        outputs[metric] = tmp_path / f"{metric}.jsonl"
        assert main([*base, "--metric", metric, "-o", str(outputs[metric])]) == 0
    qace, clip, both = (_rows(outputs[m]) for m in ("qace-ref", "clip-s", "qace-ref,clip-s"))
    assert set(both) == set(qace) & set(clip) and len(both) == 8
    for record_id, row in both.items():
        assert row["qace"] == qace[record_id]["qace"] and row["qace_f1"] == qace[record_id]["qace_f1"]
        assert row["clip_s"] == clip[record_id]["clip_s"]
        assert row["qace_signature"] == qace[record_id]["signature"]
        assert row["clip_s_signature"] == clip[record_id]["signature"]
        assert row["signature"] == qace[record_id]["signature"] + SEPARATOR + clip[record_id]["signature"]
    errors = _errors(outputs["qace-ref,clip-s"])
    assert set(errors) == {"ex04", "ex05", "ex06", "ex07"}
    assert errors["ex05"].startswith("clip-s: ") and "dog.png" in errors["ex05"]


def test_a_combined_run_resumes_against_its_combined_signature(clip_dir, tmp_path):
    out = tmp_path / "both.jsonl"
    argv = [
        "score",
        str(EXAMPLE),
        "-o",
        str(out),
        "--metric",
        "clip-s,refclip-s",
        "--clip-model",
        str(clip_dir),
    ]
    assert main([*argv, "--no-progress"]) == 0
    first = out.read_bytes()
    assert main([*argv, "--no-progress", "--resume"]) == 0
    assert out.read_bytes() == first
    assert main([*argv, "--no-progress", "--resume", "--clip-w", "3"]) == 2  # another signature: refused


def test_records_split_like_gpus_shards_score_the_same_bits(clip_dir):
    """``--gpus`` shards (and a resumed run) score parts of the input in fresh processes: each part,
    scored alone by a fresh model and an empty image cache, gives the bits of the whole run."""
    from qace.combined import CombinedScorer
    from qace.data.records import read_records
    from qace.judges import clip_model

    records = list(read_records(EXAMPLE))
    settings = {name: {"model": str(clip_dir)} for name in ("clip-s", "refclip-s")}

    def fresh() -> CombinedScorer:
        clip_model._SHARED.clear()  # a new process: no model, no cached image
        return CombinedScorer(metrics=["clip-s", "refclip-s"], settings=settings, progress=False)

    whole = list(fresh().score_records(records))
    parts = list(fresh().score_records(records[:5])) + list(fresh().score_records(records[5:]))
    assert parts == whole and sum(isinstance(row, dict) for row in whole) == 11


def test_combined_runs_on_several_devices_byte_for_byte(clip_dir, tmp_path, monkeypatch):
    """``--gpus`` workers (two CPU processes here) build the combination from its entry's strings and
    write what one process writes."""
    import qace.scale.shards

    monkeypatch.setattr(qace.scale.shards, "resolve_devices", lambda gpus: ["cpu", "cpu"])
    base = [
        "score",
        str(EXAMPLE),
        "--metric",
        "clip-s,refclip-s",
        "--clip-model",
        str(clip_dir),
        "--no-progress",
    ]
    assert main([*base, "-o", str(tmp_path / "one.jsonl")]) == 0
    assert main([*base, "-o", str(tmp_path / "two.jsonl"), "--gpus", "2"]) == 0
    assert (tmp_path / "two.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("metric", "message"),
    [("qace-ref,qace-img", "both write the column 'qace'"), ("clip-s,bleu", "unknown metric 'bleu'"),
     ("clip-s,clip-s", "named twice")],
)  # fmt: skip
def test_metrics_that_cannot_share_a_row_are_refused_before_loading(metric, message):
    with pytest.raises(ConfigError, match=message):
        combined_entry(metric)


def test_the_combined_entry_lists_every_metric_s_columns():
    entry = combined_entry("clip-s,refclip-s")
    assert entry.score_key == "clip_s" and entry.columns == ("clip_s", "refclip_s", "clip_ref")
    assert entry.signature == "CLIP-S + RefCLIP-S" and entry.reads == "image"
