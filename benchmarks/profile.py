"""Where one reward call's time goes: stage walls, GPU kernels, host functions.

    python -m benchmarks.profile --variant img --batch 256 --out-dir /tmp/profile
    python -m benchmarks.profile --tiny --out-dir /tmp/profile-tiny      # CPU smoke run

The latency and throughput benchmarks say how long; this says why. Same engine, workload and settings as
``benchmarks/latency.py`` (its ``make_scorer``: a call scored in the caller's process, as every call of
one chunk is). After the same warm-up (``QACEReward.warm_up``, one full
chunk, then a few calls; ``graph_captures_in_profiled_calls`` says if a call still captured a graph),
it times ``--calls`` calls of ``--batch`` captions three ways, each on its own calls so that no tool
distorts another:

- ``stages``: wall milliseconds per pipeline stage, the GPU synchronised at each stage's end, and the
  time the interpreter's garbage collector paused the calls;
- ``torch.profiler``: time per operator on the host and per kernel on the GPU, how busy the GPU was
  during the calls (``gpu_busy_fraction``: kernel time over wall time), and per stage the wall time and
  the time the GPU ran anything (``gpu_busy_by_stage``, from the trace, ``trace.json``);
- ``cProfile``: Python functions by cumulative and by own time;
- ``threads``: what every Python thread was doing while the calls ran (`ThreadSampler`: each thread's
  innermost Python frame every ``--sample-ms``), so a thread that runs Python beside the model thread,
  and takes the interpreter lock the model thread waits to get back after each released call (a graph
  replay, a wait for the device), shows as ``running``;
- ``parse_split``: the candidates stage's parse through the scorer's parsing processes against the
  largest share one process parses and the whole call, parsed in this process (`parse_split`);
- ``gpu_idle`` (``--idle-calls``, on a GPU): where the GPU waits for the host. The calls run under
  ``torch.profiler`` with Python stacks (which slows the host, so the milliseconds are of those calls,
  their shares are what counts); every stretch of at least 50 µs inside a call in which the GPU runs
  nothing is charged, each part of it, to the innermost Python function of qace's own code that the
  model thread was in during that part, to the innermost frame of any code, and to the stage
  (`gpu_idle`). A stretch the model thread spends waiting (for the candidates, a tokenized slice) is
  charged to the wait.

``floor``: what one call cannot go under while it stays one batch, from the profiler's stages: the
candidates stage's wall (spaCy parses; no model can start before its captions' candidates are known)
plus the GPU's busy time in every later stage (each needs the one before it), as if no host work were
left. A latency target under it needs faster parsing or faster models, not more overlap.

Writes ``profile.json`` (the summary) and the three tables as text files to ``--out-dir``.
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import io
import itertools
import json
import pstats
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.latency import DEFAULT_DATA, context_columns, draw, make_scorer
from benchmarks.run_info import record
from benchmarks.workload import (
    add_engine_arguments,
    engine_defaults,
    flickr_workload,
    graph_captures,
    preload_features,
    workload_models,
)
from qace.engine import instrument
from qace.engine.instrument import CollectorPauses, StageTimer, cuda_sync
from qace.metric.candidates import balanced_parts, extract_candidates, load_spacy
from qace.reward import QACEReward


def _calls(reward: QACEReward, records: list, batch: int, calls: int, seed: int) -> Callable[[int], None]:
    def call(i: int) -> None:
        picked = draw(records, batch, seed, i)
        reward([r.caption for r in picked], **context_columns(picked, reward.variant))
        cuda_sync()

    return call


def stage_walls(reward: QACEReward, call: Callable[[int], None], calls: int) -> dict[str, Any]:
    timer = StageTimer(sync=cuda_sync)
    pauses = CollectorPauses()
    walls = []
    with instrument.attached(reward.scorer, timer=timer):
        for i in range(calls):
            start = time.perf_counter()
            call(i)
            walls.append(time.perf_counter() - start)
    pauses.close()
    # the model thread's stages; "prepare" runs beside them in the prefetch thread
    ms = {k: 1000 * v / calls for k, v in timer.seconds.items() if k != "prepare"}
    wall = 1000 * float(np.mean(walls))
    return {
        "wall_ms": wall,
        "stage_ms": ms,
        "unstaged_ms": wall - sum(ms.values()),
        "prefetch_ms": 1000 * timer.seconds.get("prepare", 0.0) / calls,
        "gc_ms": 1000 * pauses.seconds / calls,
        "gc_collections": pauses.count / calls,
        "gc_by_generation": {
            str(g): {"collections": n / calls, "ms": 1000 * s / calls}
            for g, (n, s) in sorted(pauses.by_generation.items())
        },
    }


WAITING = {
    ("threading.py", "wait"),
    ("threading.py", "_wait_for_tstate_lock"),
    ("threading.py", "join"),
    ("queue.py", "get"),
    ("thread.py", "_worker"),
    ("selectors.py", "select"),
    ("connection.py", "_poll"),
    ("connection.py", "_recv"),
    ("connection.py", "wait"),
    ("_monitor.py", "run"),
}
"""Innermost frames (file name, function) of a thread blocked in a wait: a lock, a queue, a pipe, an idle
executor worker, tqdm's monitor between its checks. Any other frame counts as running."""


class ThreadSampler:
    """Samples, every ``interval`` seconds from a thread of its own, every other Python thread's innermost
    frame (`sys._current_frames`): per thread name (executor workers' numbers dropped), how many samples,
    how many were in a `WAITING` frame, the most frequent frames, and the most frequent innermost frames
    of qace's own code with the frame inside it (``qace_top``: which of the engine's functions the samples
    fall in, a library's call included). The sampler needs the interpreter
    lock to sample, so a thread that holds it for long is seen at the moments it lets go (the switch
    interval): the counts rank threads, they do not time them."""

    def __init__(self, interval: float = 0.0005) -> None:
        self.interval = interval
        self.samples: dict[str, dict[str, int]] = {}
        self.owners: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="qace-thread-sampler", daemon=True)

    def __enter__(self) -> ThreadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = re.sub(r"_\d+$", "", names.get(ident, "unknown"))
                where = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
                counts = self.samples.setdefault(name, {})
                counts[where] = counts.get(where, 0) + 1
                owner = _qace_frame(frame)
                owned = self.owners.setdefault(name, {})
                key = f"{owner} > {where}" if owner else where
                owned[key] = owned.get(key, 0) + 1

    def report(self) -> dict[str, Any]:
        """Per thread: samples, the share in a running frame, the eight most frequent frames and the
        twenty most frequent qace frames (with the innermost frame)."""
        out = {}
        for name, counts in sorted(self.samples.items(), key=lambda kv: -sum(kv[1].values())):
            total = sum(counts.values())
            waiting = sum(n for where, n in counts.items() if tuple(where.split(":", 1)) in WAITING)
            top = sorted(counts.items(), key=lambda kv: -kv[1])[:8]
            owned = sorted(self.owners.get(name, {}).items(), key=lambda kv: -kv[1])[:20]
            out[name] = {
                "samples": total,
                "running_share": (total - waiting) / total,
                "top": dict(top),
                "qace_top": dict(owned),
            }
        return out


_QACE_DIR = str(Path(__file__).resolve().parents[1] / "qace")


def _qace_frame(frame: Any) -> str | None:
    """``file:function`` of the innermost frame in the qace package at or above ``frame``."""
    while frame is not None:
        if frame.f_code.co_filename.startswith(_QACE_DIR):
            return f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
        frame = frame.f_back
    return None


def thread_activity(call: Callable[[int], None], calls: int, interval: float) -> dict[str, Any]:
    """`ThreadSampler` over ``calls`` calls of their own."""
    start = time.perf_counter()
    with ThreadSampler(interval) as sampler:
        for i in range(calls):
            call(3 * calls + i)
    return {
        "interval_ms": 1000 * interval,
        "wall_ms_per_call": 1000 * (time.perf_counter() - start) / calls,
        "by_thread": sampler.report(),
    }


def kernel_tables(
    reward: QACEReward, call: Callable[[int], None], calls: int, out_dir: Path
) -> dict[str, Any]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    start = time.perf_counter()
    with instrument.attached(reward.scorer, timer=_labelled), profile(activities=activities) as prof:
        for i in range(calls):
            with torch.profiler.record_function(_CALL):
                call(calls + i)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    # kernels only: an operator's row repeats the time of the kernels it launched, and a label's row
    # (``qace:``) spans the device time of everything inside it
    gpu_us = sum(
        e.self_device_time_total
        for e in events
        if e.device_type == DeviceType.CUDA and not e.key.startswith("qace:")
    )
    (out_dir / "ops_by_gpu.txt").write_text(events.table(sort_by="self_device_time_total", row_limit=50))
    (out_dir / "ops_by_host.txt").write_text(events.table(sort_by="self_cpu_time_total", row_limit=50))
    trace = out_dir / "trace.json"
    prof.export_chrome_trace(str(trace))
    return {
        "wall_ms_per_call": 1000 * wall / calls,
        "gpu_kernel_ms_per_call": gpu_us / 1000 / calls,
        "gpu_busy_fraction": gpu_us / 1e6 / wall if wall else 0.0,
        "gpu_busy_by_stage": stage_busy(json.loads(trace.read_text())["traceEvents"], calls),
    }


_CALL, _STAGE = "qace:call", "qace:stage:"


@contextmanager
def _labelled(stage: str) -> Iterator[None]:
    """A stage timer that only names the stage in the profiler's trace."""
    with torch.profiler.record_function(_STAGE + stage):
        yield


def stage_busy(events: list[dict[str, Any]], calls: int) -> dict[str, dict[str, float]]:
    """Per stage, and for the whole call (``call``), milliseconds per call of wall time and of time the
    GPU ran anything (kernels, copies, fills; overlapping ones counted once), from a chrome trace whose
    calls and stages are labelled ``qace:call`` and ``qace:stage:<name>``. A stage's host-only time is
    the difference: the GPU idles while the host prepares, waits for spaCy or reads results."""
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    device = _device_work(events)
    out: dict[str, dict[str, float]] = {}
    for e in spans:
        name = str(e["name"])
        if name != _CALL and not name.startswith(_STAGE):
            continue
        key = "call" if name == _CALL else name[len(_STAGE) :]
        lo, hi = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        entry = out.setdefault(key, {"wall_ms": 0.0, "gpu_busy_ms": 0.0})
        entry["wall_ms"] += (hi - lo) / 1000 / calls
        entry["gpu_busy_ms"] += _covered(device, lo, hi) / 1000 / calls
    return out


def _device_work(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The (start, end) of everything a chrome trace shows the GPU running (kernels, copies, fills),
    sorted by start, in µs."""
    return sorted(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )


def _covered(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of ``[lo, hi]`` covered by the union of sorted ``intervals``."""
    total, reach = 0.0, lo
    for start, end in intervals:
        if start >= hi:
            break
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


def idle_profile(reward: QACEReward, call: Callable[[int], None], calls: int) -> dict[str, Any]:
    """The module docstring's ``gpu_idle``, over ``calls`` calls of their own."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with (
        instrument.attached(reward.scorer, timer=_labelled),
        profile(activities=activities, with_stack=True) as prof,
    ):
        for i in range(calls):
            with torch.profiler.record_function(_CALL):
                call(4 * calls + i)
    with tempfile.TemporaryDirectory(prefix="qace-idle-") as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    return gpu_idle(events, calls)


def idle_stretches(events: list[dict[str, Any]], min_gap_us: float) -> list[tuple[float, float]]:
    """``(start, end)`` in µs of every stretch of at least ``min_gap_us`` (and longer than 0) inside the
    trace's ``qace:call`` spans in which the GPU runs nothing (`_device_work`)."""
    device = _device_work(events)
    gaps: list[tuple[float, float]] = []
    for c in events:
        if c.get("ph") != "X" or c.get("cat") != "user_annotation" or c.get("name") != _CALL:
            continue
        lo, hi = float(c["ts"]), float(c["ts"]) + float(c["dur"])
        reach = lo
        for start, end in device:
            if end <= lo:
                continue
            if start >= hi:
                break
            if start > reach and start - reach >= min_gap_us:
                gaps.append((reach, start))
            reach = max(reach, min(end, hi))
        if hi > reach and hi - reach >= min_gap_us:
            gaps.append((reach, hi))
    return gaps


IDLE_MIN_US = 50.0
"""The shortest GPU idle stretch `gpu_idle` counts (shorter ones are a kernel's own launch gap)."""


def gpu_idle(
    events: list[dict[str, Any]], calls: int, top: int = 25, min_gap_us: float = IDLE_MIN_US
) -> dict[str, Any]:
    """From a chrome trace with ``qace:call`` / ``qace:stage:`` labels and Python stacks: the GPU's idle
    stretches of at least ``min_gap_us`` inside the calls, in milliseconds per call, each cut where a
    frame of the model thread (the one that opened the calls) opens or closes, and each piece charged to
    the innermost qace function (``by_qace_function``, ``"file(line): function"``), the innermost frame
    (``by_frame``) and the stage (``by_stage``) open on that thread during it; the ``top`` largest of
    each."""
    spans = [e for e in events if e.get("ph") == "X"]
    call_spans = [e for e in spans if e.get("cat") == "user_annotation" and e.get("name") == _CALL]
    if not call_spans:
        return {"min_gap_us": min_gap_us, "idle_ms_per_call": 0.0, "stretches_per_call": 0.0}
    thread = call_spans[0]["tid"]
    gaps = idle_stretches(events, min_gap_us)
    frames = sorted(
        (
            (float(e["ts"]), float(e["ts"]) + float(e["dur"]), _ADDRESS.sub("", str(e["name"])))
            for e in spans
            if e.get("tid") == thread and e.get("cat") in ("python_function", "user_annotation")
        ),
        key=lambda f: (f[0], -f[1]),
    )
    # the pieces of every stretch in which the thread's open frames stay the same: (middle, length)
    bounds = sorted({t for start, end, _ in frames for t in (start, end)})
    pieces: list[tuple[float, float]] = []
    for lo, hi in gaps:
        cuts = [lo, *bounds[bisect.bisect_right(bounds, lo) : bisect.bisect_left(bounds, hi)], hi]
        pieces += [((a + b) / 2, b - a) for a, b in itertools.pairwise(cuts)]
    pieces.sort()
    by_qace: dict[str, float] = {}
    by_frame: dict[str, float] = {}
    by_stage: dict[str, float] = {}
    stack: list[tuple[float, float, str]] = []  # frames open at the last start, outermost first
    at = 0
    for middle, length in pieces:
        while at < len(frames) and frames[at][0] <= middle:
            while stack and stack[-1][1] <= frames[at][0]:
                stack.pop()
            stack.append(frames[at])
            at += 1
        while stack and stack[-1][1] < middle:
            stack.pop()
        # a label opens inside a Python frame and outlives it, so an ended frame can sit under an open
        # one: only the frames open at the middle count
        names = [name for _, end, name in stack if end >= middle]
        python = [n for n in names if not n.startswith("qace:")]
        own = [n for n in python if _is_qace(n)]
        stages = [n[len(_STAGE) :] for n in names if n.startswith(_STAGE)]
        for table, key in (
            (by_qace, own[-1] if own else "(no qace frame)"),
            (by_frame, python[-1] if python else "(no frame)"),
            (by_stage, stages[-1] if stages else "(between stages)"),
        ):
            table[key] = table.get(key, 0.0) + length

    def per_call(table: dict[str, float]) -> dict[str, float]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1])[:top]
        return {k: round(v / 1000 / calls, 3) for k, v in ranked}

    return {
        "min_gap_us": min_gap_us,
        "idle_ms_per_call": sum(hi - lo for lo, hi in gaps) / 1000 / calls,
        "stretches_per_call": len(gaps) / calls,
        "by_stage": per_call(by_stage),
        "by_qace_function": per_call(by_qace),
        "by_frame": per_call(by_frame),
    }


_ADDRESS = re.compile(r" (of [^ ]+ )?object at 0x[0-9a-f]+")
"""A bound built-in's receiver in a trace's frame name (``<built-in method contiguous of Tensor object at
0x7f...>``): dropped, so one method is one row."""


def _is_qace(frame: str) -> bool:
    """Whether a trace's Python frame (``"qace/engine/engine.py(183): batches"``) is qace's own code."""
    path = frame.split("(", 1)[0]
    return path.startswith("qace/") or "/qace/" in path


def python_profile(call: Callable[[int], None], calls: int, out_dir: Path) -> dict[str, Any]:
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(calls):
        call(2 * calls + i)
    profiler.disable()
    for sort, name in (("cumulative", "python_cumulative.txt"), ("tottime", "python_own.txt")):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(sort).print_stats(60)
        (out_dir / name).write_text(text.getvalue())
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    own = sorted(((v[2], k) for k, v in stats.items()), reverse=True)[:15]
    return {"top_own_ms_per_call": {f"{k[0]}:{k[1]}({k[2]})": 1000 * t / calls for t, k in own}}


def parse_split(scorer: Any, records: list, batch: int, calls: int, seed: int) -> dict[str, Any]:
    """How the candidates stage's wall splits: the call's captions through the scorer's extractor (its
    parsing processes when started, as a call's are) against the largest share one process parses
    (the part of the most characters, as the extractor cuts a call: `balanced_parts`) and the whole
    call parsed here, both timed in this process on the same captions, with the extractor's cache off.
    ``pool_ms - largest_share_ms`` is what handing the parse to the processes costs beyond the parse
    itself (dispatch, pickling, waking the processes, collecting), if a process parses as fast as this
    one."""
    extractor = scorer.candidates
    nlp = load_spacy(extractor.model)
    kept, extractor.cache_size = extractor.cache_size, 0
    pool, share, whole = [], [], []
    try:
        for i in range(calls):
            captions = list(dict.fromkeys(r.caption for r in draw(records, batch, seed, -100 - i)))
            parts = [
                [captions[k] for k in part] for part in balanced_parts(captions, max(extractor.processes, 1))
            ]
            largest = max(parts, key=lambda part: sum(map(len, part)))
            start = time.perf_counter()
            extractor.submit(captions).result()
            pool.append(time.perf_counter() - start)
            start = time.perf_counter()
            extract_candidates(largest, nlp)
            share.append(time.perf_counter() - start)
            start = time.perf_counter()
            extract_candidates(captions, nlp)
            whole.append(time.perf_counter() - start)
    finally:
        extractor.cache_size = kept
    median = lambda xs: 1000 * float(np.median(xs))  # noqa: E731
    return {
        "parsing_processes": extractor.processes,
        "distinct_captions": len(captions),
        "pool_ms": median(pool),
        "largest_share_captions": len(largest),
        "largest_share_characters": sum(map(len, largest)),
        "largest_share_ms": median(share),
        "whole_in_process_ms": median(whole),
        "pool_overhead_ms": median(pool) - median(share),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA))
    parser.add_argument("--variant", default="img", choices=["img", "ref"])
    parser.add_argument("--batch", type=int, default=256, help="captions per call")
    parser.add_argument("--calls", type=int, default=5, help="calls per tool")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--candidate-cache", action="store_true", help="keep spaCy candidates across calls")
    parser.add_argument("--sample-ms", type=float, default=0.5, help="the thread sampler's interval")
    parser.add_argument(
        "--idle-calls", type=int, default=3, help="calls for ``gpu_idle`` (on a GPU; 0: skip it)"
    )
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    engine_defaults(args)
    return args


def chain_floor(busy: dict[str, dict[str, float]]) -> dict[str, float]:
    """The module docstring's ``floor`` from ``gpu_busy_by_stage`` (per call: wall and busy ms)."""
    parsing = busy.get("candidates", {}).get("wall_ms", 0.0)
    device = sum(v["gpu_busy_ms"] for stage, v in busy.items() if stage not in ("call", "candidates"))
    return {
        "candidates_wall_ms": parsing,
        "gpu_busy_ms_after_candidates": device,
        "chain_floor_ms": parsing + device,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = flickr_workload(Path(args.data_dir))
    models_dir = workload_models(args, records, "qace-profile-", Path(args.data_dir))
    scorer = make_scorer(models_dir, args.variant, args.device, args)
    preload_features(scorer, records)
    reward = QACEReward(scorer)
    reward.warm_up()
    list(scorer.score_records(records[: min(args.chunk_size, 64 if args.tiny else args.chunk_size)]))
    call = _calls(reward, records, args.batch, args.calls, args.seed)
    for i in range(2):
        call(-1 - i)
    captured = graph_captures(scorer)
    report = {
        **record("benchmarks.profile", argv, device=args.device, packages=("transformers",)),
        "variant": args.variant,
        "batch": args.batch,
        "calls": args.calls,
        "stages": stage_walls(reward, call, args.calls),
        "torch_profiler": kernel_tables(reward, call, args.calls, out_dir),
        "python": python_profile(call, args.calls, out_dir),
        "threads": thread_activity(call, args.calls, args.sample_ms / 1000),
        "parse_split": parse_split(scorer, records, args.batch, args.calls, args.seed),
    }
    if args.idle_calls and torch.cuda.is_available():
        report["gpu_idle"] = idle_profile(reward, call, args.idle_calls)
    report["graph_captures_in_profiled_calls"] = graph_captures(scorer) - captured
    report["floor"] = chain_floor(report["torch_profiler"]["gpu_busy_by_stage"])
    scorer.candidates.close()
    (out_dir / "profile.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
