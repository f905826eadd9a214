"""One graphed decoding step, whole, at reward and steady-state batch sizes: the host's launch against the
device's time (one GPU).

    python -m benchmarks.step_replay --out benchmarks/results/step_replay_h200.json

The engine decodes by replaying one CUDA graph per step (`qace.families.t5.decode_graphs`). Whether a
step at a given batch size is bound by the host (the replay's launch) or by the device (its kernels) says
which work shortens small reward calls: fewer host calls, or fewer and faster kernels. On the question
generator (random weights of T5-base's shape, bf16, the workload's models, `benchmarks.workload`), for
each ``--shapes`` entry ``ROWSxLENGTH`` (decoded rows x encoder positions, forced tokens), the graph of the
first self-attention window is replayed ``--replays`` times:

- ``host_us_per_replay_call``: host time of one ``replay()`` call (p50 and max), the queue not full;
- ``device_ms_per_step``: device time per replay from CUDA events around back-to-back replays;
- ``replay_and_wait_ms``: one replay and the wait for its ended flags (the decoding loop's pattern), p50;
- ``kernels_per_step`` and ``kernel_ms_per_step``: the graph's kernels and their summed time
  (`torch.profiler`), so ``kernel_share`` = how much of the device's step the kernels fill;
  ``kernels_by_time``: the step's most costly kernels by name, launches and milliseconds a step (what a
  fusion would remove).

``--prepare 2048x96`` first captures every bucket a warm-up captures for one model (hundreds of graphs in
one memory pool), to tell whether a replay's host call costs more among many captured graphs; and
``first_replays`` times the host's call of up to `FIRST_REPLAYS` of those graphs replayed for the first
time after the preparation, then again, every row flagged ended (a graph's first launch uploads it to the
device; `GraphedDecoding.prepare` launches each new graph once, so both should cost as much).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.latency import DEFAULT_DATA
from benchmarks.run_info import record, write_result
from benchmarks.workload import half_qg
from qace.config import QACEConfig, speed_defaults
from qace.engine.scheduler import batch_shapes
from qace.families.t5.decode_graphs import bucket_length, bucket_rows, windows
from qace.families.t5.decoder import StaticT5Decoder

STEPS = 31
"""Decoding steps the graphs are built for (the engine's question length)."""
KERNEL_NAMES = 20
"""Kernels named in ``kernels_by_time`` (a step's, by time, names cut at 80 characters)."""
RESET_KERNELS = 2
"""Device operations of one reset between rounds of replays (the position zeroed, the ended flags)."""
FIRST_REPLAYS = 24
"""Prepared graphs whose first and second replays ``first_replays`` times."""


def _p50(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


@torch.inference_mode()
def measure(decoder: StaticT5Decoder, width: int, rows: int, length: int, replays: int) -> dict[str, Any]:
    """One shape's figures (see the module docstring)."""
    hidden = torch.randn(rows, length, width, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(rows, length, device="cuda", dtype=torch.long)
    forced = torch.full((rows, STEPS), 7, device="cuda", dtype=torch.long)
    for _ in range(3):  # captures the bucket, loads the kernels
        decoder.generate(hidden, mask, max_new_tokens=STEPS, unanswerable_id=None, forced=forced)
    view = decoder.graphed()._views[(bucket_rows(rows), bucket_length(length), True, None)]
    graph = view.graphs[windows(STEPS)[0]]

    def reset() -> None:  # position 0, every row decoding
        view.pos.zero_()
        view.finished.fill_(False)

    def steps(n: int, each: Any = None) -> None:
        """``n`` replays, positions 0 to ``window - 1`` over and over (reset between rounds, not counted
        as steps: `RESET_KERNELS`); ``each(seconds)`` gets each replay's host time when given."""
        for i in range(n):
            if i % window == 0:
                reset()
            start = time.perf_counter()
            graph.replay()
            if each is not None:
                each(time.perf_counter() - start)

    window = windows(STEPS)[0]
    torch.cuda.synchronize()
    host: list[float] = []
    steps(replays, host.append)
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    steps(replays)
    end.record()
    torch.cuda.synchronize()
    waited = []
    for _ in range(replays):
        reset()
        start = time.perf_counter()
        graph.replay()
        bool(view.finished.all())
        waited.append(time.perf_counter() - start)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        steps(window)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    step_kernels = (len(kernels) - RESET_KERNELS) / window
    kernel_ms = sum(e.device_time for e in kernels) / window / 1000
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        entry = by_name.setdefault(e.name[:80], [0.0, 0.0])
        entry[0] += 1 / window
        entry[1] += e.device_time / window / 1000
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:KERNEL_NAMES]
    device_ms = begin.elapsed_time(end) / replays
    return {
        "rows": rows,
        "length": length,
        "bucket": [bucket_rows(rows), bucket_length(length)],
        "host_us_per_replay_call": {"p50": _p50(host) * 1e6, "max": max(host) * 1e6},
        "device_ms_per_step": device_ms,
        "replay_and_wait_ms": _p50(waited) * 1e3,
        "kernels_per_step": step_kernels,
        "kernel_ms_per_step": kernel_ms,
        "kernel_share": kernel_ms / device_ms,
        "kernels_by_time": {name: {"per_step": n, "ms_per_step": ms} for name, (n, ms) in top},
        "note": f"device and kernel times include a reset (two fills) every {window} replays",
    }


@torch.inference_mode()
def first_replays(decoder: StaticT5Decoder) -> dict[str, Any]:
    """Host time of the first and the second ``replay()`` after the preparation of up to `FIRST_REPLAYS`
    captured graphs (one window of each prepared bucket), each followed by a wait for the device."""
    views = list(decoder.graphed()._views.values())[:FIRST_REPLAYS]
    for view in views:
        view.finished.fill_(True)  # the attention reads nothing; the products still run
    times: dict[str, list[float]] = {"first": [], "again": []}
    for round_ in ("first", "again"):
        for view in views:
            view.pos.zero_()  # one position for every bucket: each replay advances it
            torch.cuda.synchronize()
            start = time.perf_counter()
            next(iter(view.graphs.values())).replay()
            times[round_].append((time.perf_counter() - start) * 1e6)
            torch.cuda.synchronize()
    return {
        "graphs": len(views),
        **{f"{k}_host_us": {"p50": _p50(v), "max": max(v)} for k, v in times.items() if v},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results/step_replay_<gpu>.json")
    parser.add_argument(
        "--models-dir", type=Path, default=None, help="the workload's models (built if absent)"
    )
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--shapes", nargs="+", default=["256x32", "1024x32", "2048x48"])
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument(
        "--prepare",
        metavar="ROWSxLENGTH",
        default=None,
        help="first capture every bucket of batches of up to ROWS rows of 1 to LENGTH tokens, as a warm-up "
        "does (2048x96: one model's), so the steps replay among as many graphs as in a warmed engine",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.step_replay needs a CUDA GPU")
    model, qg = half_qg(args.models_dir, args.data_dir, "qace-step-replay-")
    decoder = StaticT5Decoder(model)
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes]
    prepared = 0
    if args.prepare:
        rows, length = (int(x) for x in args.prepare.split("x"))
        like = torch.empty(0, device="cuda", dtype=torch.bfloat16)
        # this GPU's default batch tokens (the dataclass's where it has none), as `QACE.warm_up` meets
        tokens = speed_defaults("cuda").get("max_batch_tokens", QACEConfig.max_batch_tokens)
        shapes_up_to = batch_shapes(range(1, length + 1), tokens, rows)
        prepared = decoder.graphed().prepare(shapes_up_to, steps=STEPS, like=like, forcing=True)
    replayed_first = first_replays(decoder) if args.prepare else None
    result = {
        **record("benchmarks.step_replay", argv, device="cuda"),
        "precision": "bf16",
        "model": str(qg),
        "steps": STEPS,
        "buckets_prepared_first": prepared,
        "first_replays": replayed_first,
        "shapes": [measure(decoder, model.config.d_model, r, n, args.replays) for r, n in shapes],
    }
    out = write_result(result, args.out, "step_replay")
    for shape in result["shapes"]:
        print(json.dumps(shape))
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
