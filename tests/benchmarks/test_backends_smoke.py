"""``benchmarks/backends.py --tiny --records FILE``: both backends in one run on a given workload, as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from benchmarks import backends  # noqa: E402
from tests.helpers import flickr_records  # noqa: E402

N = 12


def test_records_workload_runs_both_backends(tiny_models: Path, tmp_path: Path) -> None:
    records = flickr_records(N, refs=5)
    source = tmp_path / "distinct.jsonl"
    rows = [
        {"id": r.id, "caption": r.caption, "image_id": r.image_id, "references": list(r.references)}
        for r in records
    ]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "backends.json"
    argv = ["--tiny", "--records", str(source), "--models-dir", str(tiny_models), "--out", str(out)]
    argv += ["--device", "cpu", "--precision", "fp32", "--variants", "ref", "--spacy-workers", "0"]
    argv += ["--batch-rows", "64", "--batch-tokens", "4096", "--chunk-size", "64"]
    assert backends.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["workload"] == str(source)
    assert report["captions"] == N and report["distinct_captions"] == len({r.caption for r in records})
    (entry,) = report["results"]
    assert entry["torch"]["captions_per_s"] > 0 and entry["onnx"]["captions_per_s"] > 0
    assert entry["mean_abs_qace_diff"] < 1e-5  # fp32 on both sides, same forced outputs
    assert entry["onnx_decoding"] == {role: {"static_cache": False} for role in ("qg", "tqa")}  # the CPU's


def test_bad_record_is_named(tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text('{"id": "x1", "caption": ""}\n')
    with pytest.raises(SystemExit, match="x1"):
        backends.main(["--tiny", "--records", str(source), "--out", str(tmp_path / "o.json")])
