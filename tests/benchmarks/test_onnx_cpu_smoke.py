"""``benchmarks/onnx_cpu.py`` on a few prompts: every backend runs, and the report says what ran where."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from benchmarks import onnx_cpu  # noqa: E402


def test_few_prompts_report_every_backend_with_commit(tmp_path: Path) -> None:
    out = tmp_path / "onnx_cpu.json"
    argv = ["--tiny", "--n", "4", "--rounds", "1", "--quality-n", "1", "--batch-rows", "4", "--out", str(out)]
    assert onnx_cpu.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["command"] == "python -m benchmarks.onnx_cpu " + " ".join(argv)
    assert "commit" in report and report["versions"]["onnxruntime"]
    for entry in report["speed"]:
        assert entry["rows"] == 4 and entry["model"] == "tiny shape, random weights"
        assert set(entry["backends"]) == {"torch_eager_fp32", "onnx_fp32", "onnx_int8"}
        assert entry["backends"]["onnx_fp32"]["identical_outputs_vs_torch"] == 1.0
