"""T5's RMS norm kernel against ``F.rms_norm`` and against a copy of the same bytes, at the engine's shapes.

    python -m benchmarks.rms_norm --out benchmarks/results/rms_norm_h200.json   # one GPU
    python -m benchmarks.rms_norm --device cpu --out /tmp/n.json                # smoke run (no kernel)

Each shape is ``ROWS`` rows of T5-base's 768 channels in bf16: decoding steps (a row a caption) and
encoder batches (rows x tokens). Three operations read the rows and write as many bytes:
`qace.families.t5.rms_norm` at its launch shape (``kernel``), ``F.rms_norm`` (``torch``), and
``Tensor.copy_`` (``copy``: the read-and-write bound). On a GPU each runs ``--calls`` times inside one
CUDA graph (as in the engine's decoding steps, no launch cost on the host), replayed ``--rounds`` times
in turn with the others; ``us`` is the median per call and ``tb_s`` its bytes (read plus written) a
second. ``eager_us`` times the same calls launched from Python (as the encoders' norms are),
synchronised once after all of them: a call's cost where the host is the bound, which decides
`rms_norm.EAGER_MIN_ROWS`. ``--sweep`` adds every launch shape of ``rms_norm.SHAPES`` in graphs. On a
CPU only ``torch`` and ``copy`` run, eagerly: a smoke run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.decode_step import graph_time_us
from benchmarks.run_info import record, write_result
from qace.families.t5 import rms_norm as norm_kernel

WIDTH = 768
EPS = 1e-6
ROWS = [256, 2048, 4096, 8192, 32_768, 81_920, 122_880]
"""Decoding steps of 256 to 8,192 rows; `rms_norm.EAGER_MIN_ROWS`; QG's encoder batch (2,048 x 40) and
text-QA's (1,024 x 120)."""


def _eager_us(fn: Callable[[], Any], calls: int, rounds: int, sync: Callable[[], None]) -> list[float]:
    """Microseconds a call, per round, of ``calls`` calls launched from Python and synchronised once."""
    fn()
    sync()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - start) * 1e6 / calls)
    return times


def _operations(x: torch.Tensor, w: torch.Tensor, kernel: bool, sweep: bool) -> dict[str, Callable[[], Any]]:
    """The operations timed on one shape, by name."""
    out = torch.empty_like(x)
    ops: dict[str, Callable[[], Any]] = {
        "torch": lambda: F.rms_norm(x, (WIDTH,), w, EPS),
        "copy": lambda: out.copy_(x),
    }
    if kernel:
        ops["kernel"] = lambda: norm_kernel.rms_norm(x, w, EPS)
        for shape in norm_kernel.SHAPES if sweep else ():
            ops[f"kernel_{shape[0]}x{shape[1]}"] = lambda s=shape: norm_kernel.rms_norm(x, w, EPS, s)
    return ops


def measure(rows_list: list[int], calls: int, rounds: int, device: str, sweep: bool) -> dict[str, Any]:
    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    shapes: dict[str, Any] = {}
    available = False
    for rows in rows_list:
        g = torch.Generator().manual_seed(rows)
        x = torch.randn(rows, WIDTH, generator=g).to(device, dtype)
        w = (torch.rand(WIDTH, generator=g) + 0.5).to(device, dtype)
        kernel = available = norm_kernel.fused_available(x, w)
        ops = _operations(x, w, kernel, sweep)
        graph_times: dict[str, list[float]] = {name: [] for name in ops}
        eager_times: dict[str, list[float]] = {name: [] for name in ops if not name.startswith("kernel_")}
        for _ in range(rounds):  # the operations take turns, round by round
            for name, fn in ops.items():
                if cuda:
                    graph_times[name].append(graph_time_us(fn, calls, 1))
                if name in eager_times:
                    eager_times[name] += _eager_us(fn, calls, 1, sync)
        moved = 2 * x.numel() * x.element_size()
        entry: dict[str, Any] = {"bytes_moved": moved}
        for name in ops:
            result: dict[str, Any] = {}
            if cuda:
                us = statistics.median(graph_times[name])
                result |= {"us": round(us, 2), "tb_s": round(moved / us / 1e6, 3)}
            if name in eager_times:
                result["eager_us"] = round(statistics.median(eager_times[name]), 2)
            entry[name] = result
        if kernel:
            entry["kernel_share_of_copy_rate"] = round(entry["copy"]["us"] / entry["kernel"]["us"], 3)
            entry["kernel_over_torch"] = round(entry["kernel"]["us"] / entry["torch"]["us"], 3)
        shapes[str(rows)] = entry
    return {"kernel_available": available, "dtype": str(dtype).removeprefix("torch."), "width": WIDTH,
            "shapes": shapes}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results/rms_norm_<gpu>.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, nargs="+", default=ROWS)
    parser.add_argument("--calls", type=int, default=50, help="calls a graph or an eager round")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--sweep", action="store_true", help="every launch shape of rms_norm.SHAPES")
    args = parser.parse_args(argv)
    result = {
        **record("benchmarks.rms_norm", argv, device=args.device, packages=("triton",)),
        "calls": args.calls,
        "rounds": args.rounds,
        **measure(args.rows, args.calls, args.rounds, args.device, args.sweep),
    }
    write_result(result, args.out, "rms_norm", args.device)
    print(json.dumps(result["shapes"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
