"""``benchmarks/replay_gaps.py``: the idle histogram's arithmetic on a made-up trace, and a ``--tiny`` run
through the engine core whose sections add up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import replay_gaps
from benchmarks.profile import _CALL
from tests.helpers import SHARED_DATA


def _span(name: str, cat: str, ts: float, dur: float) -> dict[str, object]:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "tid": 1}


def test_idle_histogram_bins_the_stretches_between_device_work() -> None:
    events = [
        _span(_CALL, "user_annotation", 0, 1000),
        _span("k1", "kernel", 10, 10),  # overlapping kernels count once
        _span("k2", "kernel", 15, 15),
        _span("k3", "kernel", 100, 10),
        _span("copy", "gpu_memcpy", 600, 500),  # runs past the call: only its part inside counts
        _span("before", "kernel", -50, 20),  # before the call: not counted
    ]
    hist = replay_gaps.idle_histogram(events)
    assert hist["wall_ms"] == 1.0
    assert hist["busy_ms"] == pytest.approx((20 + 10 + 400) / 1000)
    assert hist["idle_ms"] == pytest.approx((10 + 70 + 490) / 1000)
    stretches = {b["from_us"]: b["stretches"] for b in hist["bins"]}
    assert stretches == {0.0: 0, 5.0: 1, 20.0: 0, 50.0: 1, 200.0: 1, 1000.0: 0}
    assert hist["bins"][-1]["to_us"] is None


def test_tiny_run(tiny_models: Path, tmp_path: Path) -> None:
    if not (SHARED_DATA / "pascal50s").is_dir():
        pytest.skip("PASCAL-50S not in the shared data")
    out = tmp_path / "gaps.json"
    argv = ["--tiny", "--out", str(out), "--models-dir", str(tiny_models), "--captions", "8"]
    argv += ["--warmup", "4", "--chunk-size", "4", "--host-workers", "2", "--repeats", "2"]
    assert replay_gaps.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["requests"] > 0 and len(report["replay_seconds_each"]) == 2
    prof = report["profiled"]
    assert prof["busy_ms"] + prof["idle_ms"] == pytest.approx(prof["wall_ms"])
    assert sum(b["ms"] for b in prof["bins"]) == pytest.approx(prof["idle_ms"])
    assert report["streams"]["call"]["wall_ms"] == pytest.approx(prof["wall_ms"])
    streams = set(report["streams"]) - {"call"}
    assert streams and all(set(s.split("+")) <= {"qg", "tqa", "vqa"} for s in streams)
    stacks = report["with_stacks"]
    assert stacks["by_qace_function"] and set(stacks["by_stage"]) - {"(between stages)"} <= streams


def test_needs_the_engine_core() -> None:
    with pytest.raises(SystemExit):
        replay_gaps.parse_args(["--tiny", "--host-workers", "0"])
