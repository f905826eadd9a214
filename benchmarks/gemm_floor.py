"""The T5 stages' matrix products against their floor, at the engine's shapes (one GPU).

    python -m benchmarks.gemm_floor --out benchmarks/results/gemm_floor_h200.json

Each product the engine's half-precision T5 runs (`qace.families.t5`) is timed as the engine calls it,
inside a CUDA graph (``--calls`` calls captured once, replayed ``--replays`` times, so no launch cost is
counted), for T5-base (question generation, text QA: 768 wide, feed-forward 3,072) and T5-small
(Visual-T5: 512 and 2,048), at a decoding step's rows (``--decoder-rows``, the graph buckets up to
2,048) and at an encoder batch's tokens (``--encoder-rows``):

- ``qkv`` (``F.linear``, self-attention's q, k and v in one product), ``o`` (``addmm_``: the output
  projection adding the residual in its epilogue), ``cross_q`` (``F.linear``, decoder only),
  ``ff_in`` (``_addmm_activation``: the ReLU in the epilogue), ``ff_out`` (``addmm_``) and, for the
  decoder, ``lm_head`` (32,128 fp32 logits, T5's output scale as the product's ``alpha``).

Against each, three references:

- ``triton_best``: the fastest of a grid of tiled Triton products (``TILE_GRID``: block sizes, stages
  and warps; bf16 in, fp32 sums, bf16 out, no epilogue), an independent kernel family: what another
  kernel than cuBLAS's reaches at the shape (every tile timed briefly, its three fastest as the
  engine's product is);
- ``roofline_us``: the shape's time at the bf16 peak (``--peak-tflops``, H100/H200 SXM dense: 989) or
  at the GPU's practical read rate (a ``torch.sum`` over 1 GiB, measured here) over its bytes
  (operands read once, output written once), whichever is longer;
- ``empty_kernel_us``: one near-empty kernel's time in a graph, measured here: what any kernel costs
  at least, however small its work.

Then per model and row count, the products of one decoding step or of a whole encoder pass summed: cuBLAS as
the engine runs it, the faster of cuBLAS and the Triton grid at each product, and the roofline.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.decode_step import graph_time_us
from benchmarks.run_info import record, write_result

MODELS = {"t5-base": (768, 3072, 12), "t5-small": (512, 2048, 6)}
"""Width, feed-forward width and layers of the engine's two T5 sizes."""
VOCAB = 32128

TILE_GRID = [
    (bm, bn, bk, stages, warps)
    for bm in (64, 128)
    for bn in (64, 128, 256)
    for bk in (32, 64, 128)
    for stages in (3, 4)
    for warps in (4, 8)
    if (bm + bn) * bk * 2 * stages <= 200 * 1024 and not (bm == 64 and bn == 256 and warps == 4)
]
"""Triton tiles tried (`TILE_FIELDS`) whose pipelined operand tiles fit in 200 KB of shared memory."""
TILE_FIELDS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "stages", "warps")


def products(model: str, encoder: bool) -> list[tuple[str, int, int]]:
    """``(name, N, K)`` of each product of one layer (and, for a decoder, the LM head), as the engine
    runs them: rows of width K times a ``(N, K)`` weight's transpose."""
    d, ff, _ = MODELS[model]
    out = [("qkv", 3 * d, d), ("o", d, d)]
    if not encoder:
        out += [("cross_q", d, d), ("cross_o", d, d)]
    out += [("ff_in", ff, d), ("ff_out", d, ff)]
    if not encoder:
        out.append(("lm_head", VOCAB, d))
    return out


def engine_call(name: str, x: torch.Tensor, w: torch.Tensor) -> Callable[[], object]:
    """The product as the engine calls it (`qace.families.t5.ops`, `qace.families.t5.decoder`)."""
    from qace.families.t5.decoder import half_logits
    from qace.families.t5.ops import add_linear_

    if name in ("o", "cross_o", "ff_out"):
        h = torch.zeros(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)
        return lambda: add_linear_(h, x, w)
    if name == "ff_in":  # as `qace.families.t5.ops.FeedForward` runs T5's ReLU feed-forward
        zero = torch.zeros(w.shape[0], device=x.device, dtype=x.dtype)
        return lambda: torch._addmm_activation(zero, x, w.t())
    if name == "lm_head":
        scale = x.shape[1] ** -0.5
        return lambda: half_logits(x, w, scale)
    return lambda: F.linear(x, w)


@functools.cache
def _triton_matmul() -> Callable[..., None]:
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(  # noqa: PLR0913 - a kernel's arguments
        a, b, c, M, N, K,
        sam, sak, sbn, sbk, scm, scn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
        EVEN: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
        width = GROUP * grid_n
        group = pid // width
        first_m = group * GROUP
        size_m = min(grid_m - first_m, GROUP)
        pid_m = first_m + (pid % width) % size_m
        pid_n = (pid % width) // size_m
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            kk = k * BLOCK_K + rk
            pa = a + rm[:, None] * sam + kk[None, :] * sak
            pb = b + kk[:, None] * sbk + rn[None, :] * sbn
            if EVEN:  # every tile whole: no masks
                x, y = tl.load(pa), tl.load(pb)
            else:
                x = tl.load(pa, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
                y = tl.load(pb, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(x, y, acc)
        pc = c + rm[:, None] * scm + rn[None, :] * scn
        if EVEN:
            tl.store(pc, acc.to(c.dtype.element_ty))
        else:
            tl.store(pc, acc.to(c.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))

    def matmul(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, tile: Sequence[int]) -> None:
        bm, bn, bk, stages, warps = tile
        m, k = x.shape
        n = w.shape[0]
        grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
        even = m % bm == 0 and n % bn == 0 and k % bk == 0
        kernel[grid](
            x, w, out, m, n, k, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
            out.stride(0), out.stride(1),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=8, EVEN=even, num_stages=stages, num_warps=warps,
        )  # fmt: skip

    return matmul


def triton_best(
    matmul: Callable[..., None], x: torch.Tensor, w: torch.Tensor, args: argparse.Namespace
) -> tuple[float, Sequence[int]]:
    """The fastest tile of the grid for ``x @ w.T``, in µs: every tile timed briefly, then the three
    fastest as the engine's products are; the winner's product checked against ``F.linear``."""
    out = torch.empty(x.shape[0], w.shape[0], device="cuda", dtype=torch.bfloat16)

    def timed(tile: Sequence[int], calls: int, replays: int) -> float:
        return graph_time_us(lambda: matmul(x, w, out, tile), calls, replays)

    coarse: list[tuple[float, Sequence[int]]] = []
    for tile in TILE_GRID[: args.tiles]:
        try:
            matmul(x, w, out, tile)
        except Exception:  # noqa: BLE001 - a tile too large for this GPU: not a candidate
            continue
        coarse.append((timed(tile, 4, 2), tile))
    best = min((timed(tile, args.calls, args.replays), tile) for _, tile in sorted(coarse)[:3])
    matmul(x, w, out, best[1])
    assert torch.allclose(out.float(), F.linear(x, w).float(), atol=0.05, rtol=0.02), "the Triton product"
    return best


def read_rate_gbps(calls: int, replays: int) -> float:
    """The GPU's practical read rate: a ``torch.sum`` over 1 GiB of bf16, in GB/s."""
    flat = torch.ones(2**29, device="cuda", dtype=torch.bfloat16)
    return flat.numel() * 2 / graph_time_us(lambda: flat.sum(), calls, replays) / 1e3


def empty_kernel_us(calls: int, replays: int) -> float:
    """One kernel that adds 1 to one element, in a graph: what any kernel costs at least."""
    one = torch.zeros(1, device="cuda")
    return graph_time_us(lambda: one.add_(1), calls, replays)


def measure(
    model: str, rows: int, encoder: bool, args: argparse.Namespace, bound: dict[str, float]
) -> dict[str, Any]:
    """Every product of one layer (``encoder``) or decoding step at ``rows`` rows, against its
    references (module docstring), and their sum over a step or a layer."""
    time = lambda fn: graph_time_us(fn, args.calls, args.replays)  # noqa: E731
    matmul = _triton_matmul() if args.triton else None
    torch.manual_seed(args.seed)
    entries: dict[str, Any] = {}
    for name, n, k in products(model, encoder):
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
        flops = 2 * rows * n * k
        out_bytes = rows * n * (4 if name == "lm_head" else 2)
        nbytes = (rows * k + n * k) * 2 + out_bytes * (2 if name in ("o", "cross_o", "ff_out") else 1)
        roofline = max(flops / args.peak_tflops / 1e6, nbytes / bound["read_gbps"] / 1e3)
        cublas = time(engine_call(name, x, w))
        entry: dict[str, Any] = {
            "n": n,
            "k": k,
            "gflop": round(flops / 1e9, 3),
            "mbytes": round(nbytes / 1e6, 2),
            "cublas_us": round(cublas, 2),
            "cublas_tflops": round(flops / cublas / 1e6, 1),
            "roofline_us": round(roofline, 2),
            "cublas_of_roofline": round(roofline / cublas, 3),
        }
        if matmul is not None and name != "lm_head":
            us, tile = triton_best(matmul, x, w, args)
            entry["triton_best_us"] = round(us, 2)
            entry["triton_best_tile"] = dict(zip(TILE_FIELDS, tile, strict=True))
            entry["triton_tflops"] = round(flops / us / 1e6, 1)
        entries[name] = entry
    _, _, layers = MODELS[model]
    per_layer = [e for name, e in entries.items() if name != "lm_head"]
    head = [entries["lm_head"]] if "lm_head" in entries else []

    def total(key: str) -> float:
        return layers * sum(e[key] for e in per_layer) + sum(e[key] for e in head)

    def best_of(e: dict[str, Any]) -> float:
        return min(e["cublas_us"], e.get("triton_best_us", math.inf))

    flops = layers * sum(e["gflop"] for e in per_layer) + sum(e["gflop"] for e in head)
    best_total = layers * sum(map(best_of, per_layer)) + sum(map(best_of, head))
    return {
        "rows": rows,
        "products": entries,
        "whole": {
            "what": "one encoder pass over the rows" if encoder else "one decoding step",
            "gflop": round(flops, 2),
            "cublas_us": round(total("cublas_us"), 1),
            "best_us": round(best_total, 1),
            "roofline_us": round(total("roofline_us"), 1),
            "cublas_tflops": round(flops / total("cublas_us") * 1e3, 1),
            "best_tflops": round(flops / best_total * 1e3, 1),
            "kernels": layers * len(per_layer) + len(head),
        },
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results/gemm_floor_<gpu>.json")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--decoder-rows", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--encoder-rows", type=int, nargs="+", default=[16384, 81920])
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="the GPU's dense bf16 peak")
    parser.add_argument("--no-triton", dest="triton", action="store_false", help="cuBLAS and bounds only")
    parser.add_argument("--tiles", type=int, default=None, help="the first this many of TILE_GRID (tests)")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.gemm_floor needs a CUDA GPU")
    bound = {
        "read_gbps": round(read_rate_gbps(args.calls, args.replays), 1),
        "empty_kernel_us": round(empty_kernel_us(args.calls, args.replays), 2),
        "peak_tflops": args.peak_tflops,
    }
    result: dict[str, Any] = {
        **record("benchmarks.gemm_floor", argv, device="cuda", packages=("triton",)),
        "precision": "bf16",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "tile_grid": len(TILE_GRID),
        "bounds": bound,
    }
    for model in args.models:
        result[model] = {
            "decoder": [measure(model, rows, False, args, bound) for rows in args.decoder_rows],
            "encoder": [measure(model, rows, True, args, bound) for rows in args.encoder_rows],
        }
    out = write_result(result, args.out, "gemm_floor")
    summary = {
        f"{model} {part} {cell['rows']}": cell["whole"]
        for model in args.models
        for part in ("decoder", "encoder")
        for cell in result[model][part]
    }
    print(json.dumps({"bounds": bound, **summary}, indent=1))
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
