"""Where the device waits inside the models' own stream: the engine core's device work for distinct
captions scored in whole chunks, replayed back to back with no host work between its requests (the
throughput benchmark's models-alone replay), and every stretch in which the GPU runs nothing.

    python -m benchmarks.replay_gaps --out benchmarks/results/replay_gaps_h200.json   # one GPU
    python -m benchmarks.replay_gaps --tiny --host-workers 2 --out /tmp/replay-gaps-tiny.json  # CPU smoke

The models-alone replay runs a pass's model batches in more time than their kernels take one after
another (docs/performance.md, "Each stage against its MFU target"): what is left is time in which the GPU
waits for the host inside the stream itself. This benchmark says how long those waits are and where the
host is while they last. Engine and workload as `benchmarks.throughput`'s (the benchmarks' models,
forced outputs, bf16, the device's speed settings), QACE-Img unless ``--variant ref``.

1. Requests. After `QACE.warm_up` and a pass over other captions, ``--captions`` distinct PASCAL-50S
   captions are scored in whole chunks through the engine core's host processes
   (`score_in_full_chunks`), and every request the core runs is recorded.
2. Seconds. The models' batches replayed alone (BERTScore left out), synchronised, from emptied caches
   (`benchmarks.throughput.replayed_seconds`): ``replay_seconds``, the median of ``--repeats``.
3. Busy. One replay under torch.profiler (CPU and CUDA activity, no stacks), each stream of batches
   labelled by its runners (``qg``, ``tqa+vqa``): per stream its wall and the time the GPU ran anything
   (`benchmarks.profile.stage_busy`), and every idle stretch of the replay by length
   (``idle_histogram``: stretches and milliseconds per bin), so that many short waits (each decoding
   step's launch and end-of-rows check) are told apart from few long ones (a batch's setup, the host
   work between batches).
4. Where. One replay with Python stacks: its idle stretches of at least ``--min-gap-us`` charged to the
   innermost qace function, frame and stream open on the replaying thread
   (`benchmarks.profile.gpu_idle`). Stacks slow Python most where it calls many small functions, so
   its milliseconds are read as shares of the stacks' replay.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.profile import _CALL, _labelled, gpu_idle, idle_stretches, stage_busy
from benchmarks.run_info import default_result, gpu_name, record
from benchmarks.throughput import DATA, recorded_requests, replay, replayed_seconds
from benchmarks.workload import (
    PASCAL_DISTINCT,
    add_engine_arguments,
    engine_defaults,
    flickr_workload,
    pascal_workload,
    reset_caches,
    score_in_full_chunks,
    workload_models,
    workload_scorer,
)
from qace.engine.instrument import cuda_sync

BINS_US = (0.0, 5.0, 20.0, 50.0, 200.0, 1000.0)
"""Lower edges of the idle histogram's bins, in µs (the last bin is open)."""


def idle_histogram(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Every stretch inside the trace's ``qace:call`` spans in which the GPU ran nothing
    (`benchmarks.profile.idle_stretches`: kernels, copies and fills as one union), binned by length
    (`BINS_US`): per bin the stretches and their milliseconds; with the calls' wall and busy
    milliseconds, so that ``busy + idle == wall``."""
    wall = sum(
        float(e["dur"]) for e in events if e.get("cat") == "user_annotation" and e.get("name") == _CALL
    )
    counts = [0] * len(BINS_US)
    ms = [0.0] * len(BINS_US)
    for lo, hi in idle_stretches(events, 0.0):
        k = max(i for i, edge in enumerate(BINS_US) if hi - lo >= edge)
        counts[k] += 1
        ms[k] += (hi - lo) / 1000
    edges = [*BINS_US[1:], None]
    return {
        "wall_ms": wall / 1000,
        "busy_ms": wall / 1000 - sum(ms),
        "idle_ms": sum(ms),
        "bins": [
            {"from_us": lo, "to_us": hi, "stretches": n, "ms": t}
            for lo, hi, n, t in zip(BINS_US, edges, counts, ms, strict=True)
        ],
    }


def profiled_replay(scorer: Any, requests: list[tuple[str, Any]], *, stacks: bool) -> list[dict[str, Any]]:
    """The chrome trace's events of one models-only replay from emptied caches, the replay labelled as
    one ``qace:call`` and each stream of batches as a ``qace:stage:`` of its runners."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    reset_caches(scorer)
    cuda_sync()
    with profile(activities=activities, with_stack=stacks) as prof:
        with torch.profiler.record_function(_CALL):
            replay(scorer.core, requests, functions=False, label=_labelled)
        cuda_sync()
    with tempfile.TemporaryDirectory(prefix="qace-replay-gaps-") as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events: list[dict[str, Any]] = json.loads(trace.read_text())["traceEvents"]
    return events


def measure(scorer: Any, records: list[Any], warm: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """Sections 1-4 of the module docstring on a started scorer."""
    start = time.perf_counter()
    scorer.warm_up()
    list(scorer.score_records(warm))
    warm_seconds = time.perf_counter() - start
    if scorer.core is None:
        raise SystemExit("the engine core did not start: give --host-workers 1 or more")
    requests = recorded_requests(scorer, lambda: score_in_full_chunks(scorer, records))
    replayed_seconds(scorer, requests, functions=False)  # untimed: what the recording pass did not meet
    seconds = [replayed_seconds(scorer, requests, functions=False) for _ in range(args.repeats)]
    plain = profiled_replay(scorer, requests, stacks=False)
    with_stacks = profiled_replay(scorer, requests, stacks=True)
    kernels = [e for e in plain if e.get("ph") == "X" and e.get("cat") == "kernel"]
    return {
        "warm_up_seconds": warm_seconds,
        "requests": len(requests),
        "replay_seconds": statistics.median(seconds),
        "replay_seconds_each": seconds,
        "kernels": len(kernels),
        "kernel_ms": sum(float(e["dur"]) for e in kernels) / 1000,
        "profiled": idle_histogram(plain),
        "streams": stage_busy(plain, 1),
        "with_stacks": gpu_idle(with_stacks, 1, top=args.top, min_gap_us=args.min_gap_us),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="default: benchmarks/results/replay_gaps_<gpu>.json")
    parser.add_argument("--variant", default="img", choices=["img", "ref"])
    parser.add_argument("--captions", type=int, default=None, help="distinct captions (default 4,096)")
    parser.add_argument("--warmup", type=int, default=None, help="other captions for the warm-up pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed replays (median)")
    parser.add_argument("--min-gap-us", type=float, default=20.0, help="shortest stretch charged (µs)")
    parser.add_argument("--top", type=int, default=30, help="rows of each table in the stacks' section")
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    engine_defaults(args)
    args.captions = args.captions or (16 if args.tiny else 4096)
    args.warmup = args.warmup if args.warmup is not None else (8 if args.tiny else args.chunk_size)
    if min(args.captions, args.repeats) < 1 or args.min_gap_us < 0:
        parser.error("--captions and --repeats must be positive, --min-gap-us not negative")
    if args.captions + args.warmup > PASCAL_DISTINCT:
        parser.error(f"--captions + --warmup exceed PASCAL-50S's {PASCAL_DISTINCT} distinct captions")
    if args.host_workers < 1:
        parser.error("the replay is the engine core's: --host-workers must be 1 or more")
    if not DATA.is_dir():
        parser.error(f"shared data not found at {DATA}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pascal = pascal_workload(DATA, PASCAL_DISTINCT)
    records, warm = pascal[: args.captions], pascal[args.captions : args.captions + args.warmup]
    models_dir = workload_models(args, [*pascal, *flickr_workload(DATA)], "qace-replay-gaps-", DATA)
    device, precision = args.device, args.precision
    scorer = workload_scorer(models_dir, args.variant, device=device, precision=precision, args=args)
    try:
        result = measure(scorer, records, warm, args)
    finally:
        scorer.close()
    report = {
        **record("benchmarks.replay_gaps", argv, device=args.device, packages=("transformers",)),
        "precision": args.precision,
        "tiny": args.tiny,
        "variant": args.variant,
        "workload": {
            "name": "PASCAL-50S distinct human captions, scored in whole chunks",
            "captions": len(records),
        },
        "settings": {
            "batch_rows": args.batch_rows,
            "batch_tokens": args.batch_tokens,
            "chunk_size": args.chunk_size,
            "host_workers": args.host_workers,
            "min_gap_us": args.min_gap_us,
        },
        "models": "tiny random T5s (a smoke run: numbers mean nothing)"
        if args.tiny
        else "random T5-base QG/TQA, random T5-small Visual-T5, random features, forced seeded outputs",
        **result,
    }
    out = Path(args.out or default_result("replay_gaps", gpu_name(args.device)))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    prof = result["profiled"]
    print(
        f"replay {result['replay_seconds']:.3f} s; profiled {prof['wall_ms']:.1f} ms: GPU busy "
        f"{prof['busy_ms']:.1f}, idle {prof['idle_ms']:.1f} ms; wrote {out}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
