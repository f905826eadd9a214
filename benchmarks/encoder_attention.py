"""The fused T5 encoder with its Triton attention against PyTorch's memory-efficient kernel, same inputs.

    python -m benchmarks.encoder_attention --out benchmarks/results/encoder_attention_h200.json   # one GPU
    python -m benchmarks.encoder_attention --device cpu --tiny --out /tmp/e.json                  # smoke run

A random T5-base encoder (bf16 on a GPU) runs batches of the given ``ROWSxLENGTH`` shapes, each row's
real tokens a random count from half the length to all of it (right padding, as text prompts); a shape
``ROWSxLENGTH:KEPT`` instead scatters ``KEPT`` real positions over the length, so the encoder packs them
(Visual-T5's question slots). Each batch runs through `qace.families.t5.encoder.T5Encoder` twice per
round, with the kernel (`qace.families.t5.encoder_attention`) and with the PyTorch path it replaced
(``pytorch``: the bias laid out per batch; on a GPU PyTorch's memory-efficient kernel), alternating;
``ms`` is the median over rounds of one whole encoder call, host and device, synchronised.
``max_abs_vs_fp32``: each path's largest difference from the fp32 encoder (Hugging Face's forward) at
real tokens; ``max_abs_between``: between the two paths. On a CPU (``--tiny``) only the PyTorch path
exists: a smoke run.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import T5Config, T5ForConditionalGeneration

import qace.families.t5.encoder as encoder_module
from benchmarks.run_info import record, write_result
from benchmarks.workload import RANDOM_T5, T5_BASE
from qace.families.t5.encoder import T5Encoder

TINY = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)


def _batch(shape: str, vocab: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` and ``mask`` of a shape ``ROWSxLENGTH`` (right-padded rows) or ``ROWSxLENGTH:KEPT``."""
    g = torch.Generator().manual_seed(seed)
    size, _, kept = shape.partition(":")
    rows, length = (int(x) for x in size.split("x"))
    ids = torch.randint(2, vocab, (rows, length), generator=g)
    if kept:
        order = torch.rand(rows, length, generator=g).argsort(dim=1)
        mask = (order < int(kept)).long()
    else:
        real = torch.randint(length // 2, length + 1, (rows,), generator=g)
        mask = (torch.arange(length)[None, :] < real[:, None]).long()
    return ids.to(device), mask.to(device)


def _run(encoder: T5Encoder, ids: torch.Tensor, mask: torch.Tensor, kernel: bool) -> torch.Tensor:
    """One encoder call, with the kernel or the PyTorch path, back to the full ``(rows, length)`` layout
    of real tokens (packed rows scattered back)."""
    chosen = encoder_module.fused_available
    if not kernel:
        encoder_module.fused_available = lambda *_: False
    try:
        hidden, packed_mask = encoder(mask, input_ids=ids)
    finally:
        encoder_module.fused_available = chosen
    if hidden.shape[1] == mask.shape[1]:
        return hidden
    out = hidden.new_zeros(mask.shape[0], mask.shape[1], hidden.shape[-1])
    positions = torch.argsort((~mask.bool()).to(torch.int8), dim=1, stable=True)[:, : hidden.shape[1]]
    out.scatter_(1, positions[..., None].expand_as(hidden), hidden * packed_mask[..., None])
    return out


def measure(shapes: list[str], rounds: int, device: str, tiny: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    config = T5Config(**RANDOM_T5, **(TINY if tiny else T5_BASE))
    model = T5ForConditionalGeneration(config).eval().to(device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    half = T5Encoder(copy.deepcopy(model).to(dtype), fused=True)
    exact = T5Encoder(model, fused=False)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    kernel_runs = encoder_module.fused_available(torch.empty(0, device=device, dtype=dtype), config.d_kv)
    out: dict[str, Any] = {
        "kernel_available": kernel_runs,
        "dtype": str(dtype).removeprefix("torch."),
        "shapes": {},
    }
    for seed, shape in enumerate(shapes):
        ids, mask = _batch(shape, config.vocab_size, device, seed)
        real = mask.bool()
        want = exact(mask, input_ids=ids)[0].float()
        paths = [True, False] if kernel_runs else [False]
        results = {path: _run(half, ids, mask, path).float() for path in paths}  # also the warm-up
        times: dict[bool, list[float]] = {path: [] for path in paths}
        for _ in range(rounds):
            for path in paths:
                sync()
                start = time.perf_counter()
                _run(half, ids, mask, path)
                sync()
                times[path].append((time.perf_counter() - start) * 1e3)
        name = {True: "kernel", False: "pytorch"}
        entry: dict[str, Any] = {"tokens": int(mask.numel()), "real_tokens": int(real.sum())}
        for path in paths:
            entry[name[path]] = {
                "ms": round(statistics.median(times[path]), 3),
                "ms_range": [round(min(times[path]), 3), round(max(times[path]), 3)],
                "max_abs_vs_fp32": float((results[path] - want)[real].abs().max()),
            }
        if len(paths) == 2:
            entry["max_abs_between"] = float((results[True] - results[False])[real].abs().max())
            entry["kernel_over_pytorch"] = round(entry["kernel"]["ms"] / entry["pytorch"]["ms"], 3)
        out["shapes"][shape] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="default: results/encoder_attention_<gpu>.json"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny random T5 (CPU smoke run)")
    parser.add_argument("--shapes", nargs="+", default=["256x32", "2048x40", "1024x120", "2048x102:56"])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    result = {
        **record("benchmarks.encoder_attention", argv, device=args.device),
        "model": "random T5 of tiny shapes" if args.tiny else "random T5-base encoder",
        "rounds": args.rounds,
        **measure(args.shapes, args.rounds, args.device, args.tiny),
    }
    write_result(result, args.out, "encoder_attention", args.device)
    print(json.dumps(result["shapes"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
