"""`benchmarks.encoder_replay` on a GPU at small shapes: both ways timed, the graph's output compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.gpu
def test_encoder_replay_smoke(tmp_path: Path, test_models_dir: Path) -> None:
    from benchmarks import encoder_replay

    out = tmp_path / "encoder_replay.json"
    argv = ["--models-dir", str(test_models_dir), "--shapes", "5x9", "33x17", "--calls", "5"]
    argv += ["--out", str(out)]
    assert encoder_replay.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["commit"] and result["gpu"] and result["precision"] == "bf16"
    assert [(s["rows"], s["length"]) for s in result["shapes"]] == [(5, 9), (33, 17)]
    for shape in result["shapes"]:
        assert shape["eager"]["host_ms"] > 0 and shape["eager"]["device_ms"] > 0
        graph = shape["graph"]
        assert graph["first_replay_host_ms"] > 0 and graph["replay_host_ms"] > 0 and graph["device_ms"] > 0
        assert shape["equal"] is True  # the same kernels on the same inputs
