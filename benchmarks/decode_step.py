"""The decoding step's memory-bound pieces against their bound, at the engine's batch shapes (one GPU).

    python -m benchmarks.decode_step --out benchmarks/results/decode_step_h200.json

A T5 decoding step is memory-bound (`docs/performance.md`): most of its bytes are the cached keys and
values its attention reads. Each piece is timed as the engine runs it, inside a CUDA graph (``--calls``
calls captured once, replayed ``--replays`` times, so no launch cost is counted), at ``--rows`` rows of
T5-base (12 heads of 64):

- ``cross``: cross-attention over one layer's keys and values, laid out as the decoder stacks them
  (every layer's in one buffer), rows of 20-48 real keys padded to 48; the fused Triton kernel
  (`qace.families.t5.decode_attention.attend`) against the PyTorch form of the same arithmetic
  (two batched products and an fp32 softmax, the kernel's own fallback) and against the bound: a
  ``torch.sum`` reading the same bytes, the GPU's practical read rate;
- ``cross_ended``: the same with ``--ended`` of the rows ended, flagged (their reads skipped; bytes
  are the other rows') or not (every row read, as before the flags);
- ``self``: self-attention at position ``--position`` of a ``--window``-position cache window, the step's
  key and value written into the cache: the fused kernel (`attend_step`) against two index copies and
  the attention (what it replaced) and the PyTorch form;
- ``lm_head``: the fp32 logits of a 32,128-token head with T5's output scale, in the product's epilogue
  (`qace.families.t5.decoder.half_logits`) against the product then a scaling pass, and the argmax
  that follows either.

Bytes are what each piece must move at least: the keys and values of the positions it keeps, the
queries and the outputs. Rates are those bytes over the time; ``of_bound`` is the rate over the bound's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.run_info import record, write_result

HEADS, D_KV, LAYERS, VOCAB, D_MODEL = 12, 64, 12, 32128, 768


def graph_time_us(fn: Callable[[], object], calls: int, replays: int) -> float:
    """Mean device time of one ``fn()`` in µs: ``calls`` calls captured in one CUDA graph, replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (calls * replays)


def entry(us: float, nbytes: int, bound_gbps: float | None = None) -> dict[str, float]:
    gbps = nbytes / us / 1e3
    out = {"us": round(us, 2), "bytes": nbytes, "gbps": round(gbps, 1)}
    if bound_gbps:
        out["of_bound"] = round(gbps / bound_gbps, 3)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from qace.families.t5.decode_attention import attend, attend_step, pytorch_form
    from qace.families.t5.decoder import half_logits

    torch.manual_seed(args.seed)
    dev, dt = "cuda", torch.bfloat16
    rows, length, low = args.rows, args.length, args.min_length
    masked = torch.finfo(dt).min
    time = lambda fn: graph_time_us(fn, args.calls, args.replays)  # noqa: E731
    out: dict[str, Any] = {}

    lengths = torch.randint(low, length + 1, (rows,), device=dev)
    keep = torch.arange(length, device=dev)[None, :] < lengths[:, None]
    cross_bias = torch.where(keep[:, None, None, :], 0.0, masked).to(dt)
    stacked = torch.randn(rows, length, 2 * LAYERS * HEADS * D_KV, device=dev, dtype=dt)
    split = stacked.view(rows, length, 2, LAYERS, HEADS, D_KV).transpose(1, 4)
    k, v = split[:, :, 0, LAYERS // 2], split[:, :, 1, LAYERS // 2]
    q = torch.randn(rows, HEADS, 1, D_KV, device=dev, dtype=dt)
    kept = int(lengths.sum())
    io = 2 * rows * HEADS * D_KV * 2  # queries in, outputs out
    cross_bytes = kept * HEADS * D_KV * 2 * 2 + io
    flat = torch.randn(cross_bytes // 2, device=dev, dtype=dt)
    bound = cross_bytes / time(lambda: flat.sum()) / 1e3
    ended = torch.rand(rows, device=dev) < args.ended
    ended_bytes = int(lengths[~ended].sum()) * HEADS * D_KV * 2 * 2 + io
    out["read_bound_gbps"] = round(bound, 1)
    out["cross"] = {
        "fused": entry(time(lambda: attend(q, k, v, cross_bias)), cross_bytes, bound),
        "pytorch": entry(time(lambda: pytorch_form(q, k, v, cross_bias)), cross_bytes, bound),
        "read_bound": entry(cross_bytes / bound / 1e3, cross_bytes, bound),
        "kept_keys_per_row": round(kept / rows, 2),
    }
    out["cross_ended"] = {
        "ended_fraction": round(float(ended.float().mean()), 3),
        "fused": entry(time(lambda: attend(q, k, v, cross_bias, ended)), ended_bytes, bound),
        "fused_without_flags": entry(time(lambda: attend(q, k, v, cross_bias)), cross_bytes, bound),
    }

    window, position = args.window, args.position
    cache = torch.randn(2, rows, HEADS, 31, D_KV, device=dev, dtype=dt)
    keys, values = cache[0, :, :, :window], cache[1, :, :, :window]
    qkv = torch.randn(rows, 1, 3 * HEADS * D_KV, device=dev, dtype=dt)
    sq, sk, sv = qkv.view(rows, 1, -1, D_KV).transpose(1, 2).chunk(3, dim=1)
    pos = torch.tensor([position], device=dev)
    self_bias = torch.zeros(1, HEADS, 1, window, device=dev, dtype=dt)
    self_bias[..., position + 1 :] = masked
    self_bytes = rows * HEADS * position * D_KV * 2 * 2 + io + 2 * rows * HEADS * D_KV * 2 * 2

    def copies_then_attend() -> torch.Tensor:
        keys.index_copy_(2, pos, sk)
        values.index_copy_(2, pos, sv)
        return attend(sq, keys, values, self_bias)

    def copies_then_pytorch() -> torch.Tensor:
        keys.index_copy_(2, pos, sk)
        values.index_copy_(2, pos, sv)
        return pytorch_form(sq, keys, values, self_bias)

    out["self"] = {
        "window": window,
        "position": position,
        "fused_write": entry(
            time(lambda: attend_step(sq, sk, sv, keys, values, pos, self_bias)), self_bytes, bound
        ),
        "index_copies_then_fused": entry(time(copies_then_attend), self_bytes, bound),
        "index_copies_then_pytorch": entry(time(copies_then_pytorch), self_bytes, bound),
    }

    h = torch.randn(rows, D_MODEL, device=dev, dtype=dt)
    head = torch.randn(VOCAB, D_MODEL, device=dev, dtype=dt) * 0.05
    scale = D_MODEL**-0.5
    logits_bytes = rows * VOCAB * 4
    epilogue = half_logits(h, head, scale)
    out["lm_head"] = {
        "scale_in_epilogue": entry(time(lambda: half_logits(h, head, scale)), logits_bytes),
        "product_then_scale": entry(
            time(lambda: torch.mm(h, head.t(), out_dtype=torch.float32) * scale), logits_bytes
        ),
        "argmax": entry(time(lambda: epilogue.argmax(dim=-1)), logits_bytes, bound),
        "bit_equal": bool(torch.equal(epilogue, torch.mm(h, head.t(), out_dtype=torch.float32) * scale)),
    }
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results/decode_step_<gpu>.json")
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--length", type=int, default=48, help="encoder positions (padded)")
    parser.add_argument("--min-length", type=int, default=20, help="fewest real encoder positions a row")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--position", type=int, default=10)
    parser.add_argument("--ended", type=float, default=0.3, help="share of rows ended in cross_ended")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.decode_step needs a CUDA GPU")
    result = {
        **record("benchmarks.decode_step", argv, device="cuda", packages=("triton",)),
        "precision": "bf16",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        **run(args),
    }
    out = write_result(result, args.out, "decode_step")
    print(
        json.dumps(
            {k: result[k] for k in ("read_bound_gbps", "cross", "cross_ended", "self", "lm_head")}, indent=1
        )
    )
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
