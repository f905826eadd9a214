"""The VisCE² benchmark's tiny mode runs on the CPU and writes sane JSON (the GPU run uses the same code)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("PIL")

from benchmarks import visce2 as bench  # noqa: E402
from qace.config import parse_signature  # noqa: E402


def test_tiny_benchmark_writes_sane_json(tmp_path, capsys):
    out = tmp_path / "visce2.json"
    bench.main(["--tiny", "--images", "3", "--loop-images", "2", "--out", str(out)])
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert result["benchmark"] == "visce2" and result["tiny"] is True
    assert result["precision"] == "fp32" and result["fixed_lengths"] is True
    assert (result["context_tokens"], result["rating_tokens"], result["captions_per_image"]) == (16, 4, 5)
    engine, loop = result["engine"], result["loop"]
    assert (engine["images"], engine["captions"], loop["images"], loop["captions"]) == (3, 15, 2, 10)
    assert engine["contexts_computed"] == 3 and loop["contexts_computed"] == 10
    assert engine["scored"] + engine["no_rating"] == 15
    for side in (engine, loop):
        assert side["seconds"] > 0
        assert side["captions_per_s"] == pytest.approx(side["captions"] / side["seconds"], rel=0.01)
    assert result["speedup"] == pytest.approx(engine["captions_per_s"] / loop["captions_per_s"], rel=0.01)
    same, total = map(int, result["scores_identical_on_loop_captions"].split("/"))
    assert total == 10 and same == 10  # fp32 on the CPU: batching must not change a score
    assert parse_signature(result["signature"])["metric"] == "VisCE2"
    assert result["command"].startswith("python -m benchmarks.visce2 --tiny")
    assert {"torch", "transformers", "qace"} <= result["versions"].keys()
    assert result["model"]["image_tokens"] == 16 and result["device"]
