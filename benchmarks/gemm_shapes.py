"""The host's time for a half-precision matrix product at a row count met for the first time, and again.

    python -m benchmarks.gemm_shapes --out benchmarks/results/gemm_shapes_h200.json    # one GPU, seconds
    python -m benchmarks.gemm_shapes --device cpu --up-to 300 --out /tmp/g.json        # smoke run

The engine's encoders run their products on a batch's tokens padded to one of a few row counts
(`qace.engine.gemm_rows.padded_rows`), because cuBLAS chooses a kernel by a heuristic query the first
time it meets a shape and caches the choice. For T5-base's four encoder product shapes (q/k/v 2,304 x
768, the output projection 768 x 768, the feed-forward's 3,072 x 768 and 768 x 3,072; bf16, with the
epilogues the encoder uses: a residual added in place, a ReLU), at every row count `row_counts` gives up
to ``--up-to``, in ascending order: the host time of one call (from its start to its return, the device
idle before it) the first time, then again twice. ``first_sum_ms`` is what running them all once costs a
warm-up; the difference between ``first`` and ``again`` is what a call pays for each new count it meets.
The numbers are the host's; the device's time is not measured.
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

from benchmarks.run_info import record, write_result
from qace.engine.gemm_rows import row_counts

SHAPES = {"qkv": (2304, 768), "out": (768, 768), "ff_in": (3072, 768), "ff_out": (768, 3072)}
"""T5-base's encoder products: (output features, input features)."""


def _products(name: str, n: int, k: int, top: int, device: str, dtype: torch.dtype) -> Callable[[int], Any]:
    """One call of product ``name`` at ``rows`` rows, as the fused encoder makes it (`qace.families.t5`)."""
    weight = torch.randn(n, k, device=device, dtype=dtype)
    x = torch.randn(top, k, device=device, dtype=dtype)
    h = torch.randn(top, n, device=device, dtype=dtype)
    zero = torch.zeros(n, device=device, dtype=dtype)
    if name in ("out", "ff_out"):  # the residual added in the epilogue (`add_linear_`)
        return lambda rows: h[:rows].addmm_(x[:rows], weight.t())
    if name == "ff_in":  # the ReLU in the epilogue (`FeedForward`)
        return lambda rows: torch._addmm_activation(zero, x[:rows], weight.t())
    return lambda rows: F.linear(x[:rows], weight)


def measure(up_to: int, device: str, dtype: torch.dtype) -> dict[str, Any]:
    counts = row_counts(up_to)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    out: dict[str, Any] = {"row_counts": len(counts), "largest": counts[-1]}
    for name, (n, k) in SHAPES.items():
        call = _products(name, n, k, counts[-1], device, dtype)

        def host_us(rows: int, call: Callable[[int], Any] = call) -> float:
            sync()
            start = time.perf_counter()
            call(rows)
            return (time.perf_counter() - start) * 1e6

        first = [host_us(rows) for rows in counts]
        again = [host_us(rows) for rows in counts] + [host_us(rows) for rows in counts]
        out[name] = {
            "first_p50_us": round(statistics.median(first), 1),
            "first_max_us": round(max(first), 1),
            "first_sum_ms": round(sum(first) / 1e3, 2),
            "again_p50_us": round(statistics.median(again), 1),
            "again_max_us": round(max(again), 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results/gemm_shapes_<gpu>.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--up-to", type=int, default=65536, help="the largest row count (tokens)")
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    result = {
        **record("benchmarks.gemm_shapes", argv, device=args.device),
        "dtype": str(dtype).removeprefix("torch."),
        "shapes": {name: list(shape) for name, shape in SHAPES.items()},
        **measure(args.up_to, args.device, dtype),
    }
    write_result(result, args.out, "gemm_shapes", args.device)
    print(json.dumps({k: v for k, v in result.items() if k in SHAPES}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
