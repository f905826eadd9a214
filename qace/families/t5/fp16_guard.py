"""Hugging Face T5's fp16 overflow guard as two Triton kernels instead of five PyTorch ones.

After every residual addition in fp16, T5 clamps the activations to the largest half value, or to 1,000
below it when any of them is already infinite (``ops.clamp_fp16``'s formula: ``isinf``, ``any``,
``where``, ``clamp``). The engine keeps that guard so fp16 answers match Hugging Face's, but as PyTorch
operators it is four or five kernels and three passes over the activations per residual: 36 more kernels
in every T5-base decoding step's graph, 24 more passes over each encoder batch.

Here one kernel reads the activations once and raises a flag if it meets an infinity; a second clamps in
place, and returns at once in every program when the flag is down, which is the usual case. Without an
infinity the formula's clamp to the largest half value changes nothing (NaN stays NaN), so skipping it
is exact; with one, every element is clamped as the formula does.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: ops.clamp_fp16 uses the formula
    triton = None

BLOCK = 4096
LIMIT = torch.finfo(torch.float16).max - 1000
"""The formula's clamp once an infinity is present (64,504, exact in fp16)."""


def fused_available(h: torch.Tensor) -> bool:
    """The kernels run on contiguous fp16 CUDA tensors outside tracing and compilation."""
    return (
        triton is not None
        and h.is_cuda
        and h.dtype == torch.float16
        and h.is_contiguous()
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
        and not torch.onnx.is_in_onnx_export()
    )


def clamp_fp16_(h: torch.Tensor) -> torch.Tensor:
    """``h`` guarded in place, as ``ops.clamp_fp16`` would return it (see the module docstring)."""
    flat = h.view(-1)
    n = flat.numel()
    flag = torch.zeros(1, dtype=torch.int32, device=h.device)
    grid = (triton.cdiv(n, BLOCK),)
    _flag_infinity[grid](flat, flag, n, BLOCK=BLOCK)
    _clamp_if_flagged[grid](flat, flag, n, LIMIT, BLOCK=BLOCK)
    return h


if triton is not None:

    @triton.jit
    def _flag_infinity(X, FLAG, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offsets, mask=offsets < n, other=0.0)
        found = tl.max(((x == float("inf")) | (x == float("-inf"))).to(tl.int32), axis=0)
        if found != 0:
            tl.atomic_max(FLAG, 1)

    @triton.jit
    def _clamp_if_flagged(X, FLAG, n, limit, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        if tl.load(FLAG) != 0:
            offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(X + offsets, mask=offsets < n)
            bound = tl.full(x.shape, limit, x.dtype)
            x = tl.where(x > bound, bound, tl.where(x < -bound, -bound, x))  # NaN compares false: kept
            tl.store(X + offsets, x, mask=offsets < n)
