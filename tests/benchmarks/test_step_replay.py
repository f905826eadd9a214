"""`benchmarks.step_replay` on a GPU at a small shape: every figure measured, the step's kernels counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.gpu
def test_step_replay_smoke(tmp_path: Path, test_models_dir: Path) -> None:
    from benchmarks import step_replay

    out = tmp_path / "step_replay.json"
    argv = ["--models-dir", str(test_models_dir), "--shapes", "5x9", "--replays", "9", "--out", str(out)]
    assert step_replay.main([*argv, "--prepare", "16x20"]) == 0
    result = json.loads(out.read_text())
    assert result["buckets_prepared_first"] == 2 * 2  # rows 8, 16 x lengths 16, 32 (1 to 20 tokens)
    first = result["first_replays"]
    assert first["graphs"] == 4 and first["first_host_us"]["p50"] > 0 and first["again_host_us"]["p50"] > 0
    assert result["commit"] and result["gpu"]
    (shape,) = result["shapes"]
    assert shape["bucket"] == [8, 16]
    assert shape["host_us_per_replay_call"]["p50"] > 0 and shape["device_ms_per_step"] > 0
    assert shape["kernels_per_step"] > 10  # a step's layers, not only the resets
    assert 0 < shape["kernel_share"]
    named = shape["kernels_by_time"]
    assert 0 < len(named) <= step_replay.KERNEL_NAMES
    assert sum(k["per_step"] for k in named.values()) <= shape["kernels_per_step"] + step_replay.RESET_KERNELS
