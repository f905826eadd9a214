"""``benchmarks/speed_defaults.py --tiny``: both engines run on the CPU and report the same rewards."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import speed_defaults


def test_tiny_run_times_both_engines(tiny_models: Path, tmp_path: Path) -> None:
    out = tmp_path / "speed.json"
    assert speed_defaults.main(["--tiny", "--out", str(out), "--models-dir", str(tiny_models)]) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["gpu"] is None
    cpu, device = report["settings"]["cpu_defaults"], report["settings"]["device_defaults"]
    assert (
        cpu
        == device
        == {
            "max_batch_tokens": 16384,
            "max_batch_rows": 256,
            "chunk_size": 512,
            "spacy_workers": 0,
            "host_workers": 0,
        }
    )
    (cell,) = report["cells"]
    assert (cell["variant"], cell["batch"], cell["iterations"]) == ("img", 4, 2)
    for name in ("cpu_defaults", "device_defaults"):
        assert 0 < cell[name]["min_ms"] <= cell[name]["p50_ms"] <= cell[name]["max_ms"]
    assert cell["max_abs_reward_diff"] == 0.0  # same settings on the CPU: the same rewards
