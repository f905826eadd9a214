"""T5 building blocks shared by the engine's encoder and decoder and the ONNX export graphs.

In fp32 every operation is Hugging Face's own, in the same order, so the engine's tokens equal the
reference implementation's. In half precision (bf16/fp16, where a tolerance is documented) the
normalisation is one fused kernel instead of six passes over an fp32 copy of the activations, and the
residual additions and the feed-forward ReLU happen inside the matrix products' epilogues
(`add_linear_`, `FeedForward`). The ONNX graphs (`qace.export.graphs`) use the unfused form, which
exports as plain operators.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from qace.families.t5 import fp16_guard
from qace.families.t5 import rms_norm as norm_kernel

HALF = (torch.float16, torch.bfloat16)


def rms_norm(x: torch.Tensor, norm: Any, fused: bool, eager: bool = False) -> torch.Tensor:
    """T5LayerNorm (no mean, no bias). ``fused``: fp32 inside, rounded once, as one Triton kernel where
    it pays (`qace.families.t5.rms_norm.chosen`; ``eager``: the caller launches from Python, not from a
    CUDA graph), else ``F.rms_norm``; otherwise exactly Hugging Face's formula (fp32 variance, cast back
    for half weights)."""
    if fused:
        if norm_kernel.chosen(x, norm.weight, eager):
            return norm_kernel.rms_norm(x, norm.weight, norm.variance_epsilon)
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + norm.variance_epsilon)
    if norm.weight.dtype in HALF:
        x = x.to(norm.weight.dtype)
    return norm.weight * x


def clamp_fp16(h: torch.Tensor) -> torch.Tensor:
    """Hugging Face's T5 guard against fp16 overflow after each residual (a no-op in other dtypes); on a
    GPU two fused kernels that clamp in place (`qace.families.t5.fp16_guard`), elsewhere the formula."""
    if h.dtype != torch.float16:
        return h
    if fp16_guard.fused_available(h):
        return fp16_guard.clamp_fp16_(h)
    top = torch.finfo(h.dtype).max
    limit = torch.where(torch.isinf(h).any(), top - 1000, top)
    return torch.clamp(h, -limit, limit)


def fused_qkv(attention: Any) -> torch.Tensor:
    """A T5Attention's q, k and v weights stacked, so one matrix product projects all three."""
    return torch.cat([attention.q.weight, attention.k.weight, attention.v.weight])


def add_linear_(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``h += x @ weight.T`` in place, as one matrix product that adds ``h`` in its epilogue.

    A separate residual addition reads the product and ``h`` and writes a third tensor: at 2,048 x 48
    tokens of T5-base that is 450 MB of traffic a residual, three residuals a layer. Here ``h`` is read
    and written once, and the sum is rounded once instead of twice. ``h`` must be contiguous and owned.
    """
    h.view(-1, h.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]), weight.t())
    return h


class FeedForward:
    """A T5 feed-forward block in half precision that adds its output into the residual stream.

    ReLU checkpoints (T5 v1.0, the paper's) run ``wi`` with the ReLU in cuBLASLt's epilogue (the ReLU
    of the rounded product equals the rounded ReLU), saving a read and a write of the 4x-wide
    intermediate (1.2 GB a layer at 2,048 x 48 tokens of T5-base); gated-GELU ones keep their module.
    ``eager``: the block is launched from Python, not from a CUDA graph (`rms_norm`'s).
    """

    def __init__(self, ff: Any, norm: Any, eager: bool = False) -> None:
        self.ff, self.norm, self.eager = ff, norm, eager
        self.relu = isinstance(getattr(ff, "act", None), torch.nn.ReLU) and hasattr(ff, "wi")
        weight = ff.wo.weight
        self.zero = torch.zeros(weight.shape[1], dtype=weight.dtype, device=weight.device)
        """``_addmm_activation`` takes the ReLU epilogue only with a bias; T5 has none."""

    def add_(self, h: torch.Tensor) -> torch.Tensor:
        """``h += ff(norm(h))`` in place; returns ``h``."""
        x = rms_norm(h, self.norm, fused=True, eager=self.eager)
        if not self.relu:
            return h.add_(self.ff(x))
        inner = torch._addmm_activation(self.zero, x.reshape(-1, x.shape[-1]), self.ff.wi.weight.t())
        return add_linear_(h, inner, self.ff.wo.weight)
