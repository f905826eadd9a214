"""``benchmarks/profile.py --tiny``: runs on the CPU and accounts for a call's time (numbers not checked)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import profile
from tests.helpers import SHARED_DATA


def test_tiny_profile_writes_its_report_and_tables(tiny_models: Path, tmp_path: Path) -> None:
    args = ["--tiny", "--batch", "4", "--calls", "1", "--out-dir", str(tmp_path)]
    args += ["--models-dir", str(tiny_models), "--data-dir", str(SHARED_DATA)]
    assert profile.main(args) == 0
    report = json.loads((tmp_path / "profile.json").read_text())
    assert report["command"].startswith("python -m benchmarks.profile --tiny")
    stages = report["stages"]
    assert set(stages["stage_ms"]) == {
        "candidates", "questions", "answers", "token_f1", "bertscore"
    }  # fmt: skip
    assert all(v >= 0 for v in stages["stage_ms"].values())
    assert sum(stages["stage_ms"].values()) <= stages["wall_ms"]
    assert stages["gc_ms"] >= 0 and stages["gc_collections"] >= 0
    assert stages["prefetch_ms"] > 0  # reading and checking the call's records, in the prefetch thread
    assert report["torch_profiler"]["wall_ms_per_call"] > 0
    assert report["torch_profiler"]["gpu_kernel_ms_per_call"] == 0  # a CPU run launches no kernels
    assert "aten::" in (tmp_path / "ops_by_host.txt").read_text()
    assert "score_chunk" in (tmp_path / "python_cumulative.txt").read_text()
    assert report["python"]["top_own_ms_per_call"]
