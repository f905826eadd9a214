"""``benchmarks/profile.py --tiny``: runs on the CPU and accounts for a call's time (numbers not checked)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import profile
from qace.metric.text import filter_stopwords
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
    busy = report["torch_profiler"]["gpu_busy_by_stage"]
    assert set(busy) == {"call", *stages["stage_ms"]} and all(v["gpu_busy_ms"] == 0 for v in busy.values())
    assert sum(busy[k]["wall_ms"] for k in stages["stage_ms"]) <= busy["call"]["wall_ms"]
    # no GPU: the floor is the parsing alone
    assert report["floor"]["chain_floor_ms"] == busy["candidates"]["wall_ms"] > 0
    assert "aten::" in (tmp_path / "ops_by_host.txt").read_text()
    assert "score_chunk" in (tmp_path / "python_cumulative.txt").read_text()
    assert report["python"]["top_own_ms_per_call"]
    threads = report["threads"]["by_thread"]
    assert threads["MainThread"]["samples"] > 0 and threads["MainThread"]["running_share"] > 0
    split = report["parse_split"]  # no parsing processes on the CPU: one share is the whole call
    assert split["parsing_processes"] == 0 and 0 < split["distinct_captions"] <= 4
    assert split["largest_share_captions"] == split["distinct_captions"]
    assert split["largest_share_characters"] > split["distinct_captions"]
    assert min(split["pool_ms"], split["largest_share_ms"], split["whole_in_process_ms"]) > 0


def test_stage_busy_counts_overlapping_device_work_once() -> None:
    def span(cat: str, name: str, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    events = [
        span("user_annotation", "qace:call", 0, 10_000),
        span("user_annotation", "qace:stage:questions", 1_000, 4_000),
        span("user_annotation", "other", 0, 10_000),
        span("kernel", "k1", 500, 2_000),  # 1,500 of it inside the stage
        span("kernel", "k2", 2_000, 1_000),  # overlaps k1 for 500: counted once
        span("gpu_memcpy", "c", 4_000, 3_000),  # 1,000 inside the stage
        span("cpu_op", "aten::mm", 1_000, 4_000),  # host work is not device time
    ]
    busy = profile.stage_busy(events, calls=2)
    assert busy == {
        "call": {"wall_ms": 5.0, "gpu_busy_ms": 2.75},  # (2,500 + 3,000) / 2 calls
        "questions": {"wall_ms": 2.0, "gpu_busy_ms": 1.5},  # (1,500 + 500 + 1,000) / 2
    }


def test_gpu_idle_charges_each_part_of_an_idle_stretch_to_the_model_threads_innermost_frames() -> None:
    def span(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}

    events = [
        span("user_annotation", "qace:call", 0, 10_000),
        span("python_function", "qace/metric/pipeline.py(56): score_chunk", 0, 10_000),
        span("python_function", "contextlib.py(132): __enter__", 900, 150),
        span("user_annotation", "qace:stage:questions", 1_000, 5_000),  # opened inside __enter__
        span("python_function", "qace/engine/engine.py(183): batches", 1_500, 1_000),
        span("python_function", "numpy/pad.py(9): pad", 1_600, 700),
        span("python_function", "<built-in method fill_ of Tensor object at 0x7f01>", 2_200, 100),
        span("python_function", "qace/engine/tokenize.py(74): decode", 7_000, 2_000),
        span("python_function", "qace/engine/helper.py(1): spin", 0, 10_000, tid=2),  # another thread
        span("kernel", "k1", 0, 1_000),
        span("kernel", "k2", 1_020, 480),  # 20 us after k1: too short to count
        # idle 1,500-3,000: 1,500-1,600 batches, 1,600-2,200 pad (in batches), 2,200-2,300 fill_ (in
        # pad), 2,300-2,500 batches, 2,500-3,000 score_chunk; all in the questions stage
        span("gpu_memcpy", "c", 3_000, 4_000),
        # idle 7,000-9,500: 7,000-9,000 decode, 9,000-9,500 score_chunk; no stage
        span("kernel", "k3", 9_500, 500),
        span("kernel", "outside", 20_000, 100),  # after the call: not its idle time
    ]
    idle = profile.gpu_idle(events, calls=2)
    assert idle["stretches_per_call"] == 1.0
    assert idle["idle_ms_per_call"] == 2.0  # (1,500 + 2,500) us over 2 calls
    assert idle["by_qace_function"] == {
        "qace/engine/tokenize.py(74): decode": 1.0,
        "qace/engine/engine.py(183): batches": 0.5,
        "qace/metric/pipeline.py(56): score_chunk": 0.5,
    }
    assert idle["by_frame"] == {
        "qace/engine/tokenize.py(74): decode": 1.0,
        "qace/metric/pipeline.py(56): score_chunk": 0.5,
        "numpy/pad.py(9): pad": 0.3,
        "qace/engine/engine.py(183): batches": 0.15,
        "<built-in method fill_>": 0.05,
    }
    assert idle["by_stage"] == {"(between stages)": 1.25, "questions": 0.75}


def test_the_chain_floor_is_parsing_then_the_device_work_of_every_later_stage() -> None:
    busy = {
        "call": {"wall_ms": 200.0, "gpu_busy_ms": 90.0},
        "candidates": {"wall_ms": 45.0, "gpu_busy_ms": 1.0},
        "questions": {"wall_ms": 55.0, "gpu_busy_ms": 37.0},
        "answers": {"wall_ms": 65.0, "gpu_busy_ms": 40.0},
        "bertscore": {"wall_ms": 16.0, "gpu_busy_ms": 3.0},
    }
    assert profile.chain_floor(busy) == {
        "candidates_wall_ms": 45.0,
        "gpu_busy_ms_after_candidates": 80.0,
        "chain_floor_ms": 125.0,
    }


def test_the_thread_sampler_tells_running_threads_from_waiting_ones() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(100))
            filter_stopwords("a dog on the grass " * 20)

    busy = threading.Thread(target=spin, name="busy")
    idle = threading.Thread(target=stop.wait, name="idle")
    pool = ThreadPoolExecutor(1, thread_name_prefix="pool")
    pool.submit(int).result()  # its worker now waits for work
    busy.start()
    idle.start()
    with profile.ThreadSampler(0.001) as sampler:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            time.sleep(0.01)
    stop.set()
    busy.join()
    idle.join()
    pool.shutdown()
    threads = sampler.report()
    assert threads["busy"]["samples"] > 0 and threads["busy"]["running_share"] > 0.9
    assert threads["idle"]["running_share"] == 0 and "threading.py:wait" in threads["idle"]["top"]
    assert threads["pool"]["running_share"] == 0  # the worker's number dropped from its name
    assert "qace-thread-sampler" not in threads
    # samples inside qace's code name its innermost function; the test's own frames have no qace owner
    owned = threads["busy"]["qace_top"]
    assert any(key.startswith("text.py:filter_stopwords > ") for key in owned)
    assert all(" > " in key or not key.startswith("text.py:") for key in owned)
