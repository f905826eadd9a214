"""T5 building blocks shared by the engine's encoder and decoder and the ONNX export graphs.

In fp32 every operation is Hugging Face's own, in the same order, so the engine's tokens equal the
reference implementation's. In half precision (bf16/fp16, where a tolerance is documented) the
normalisation is one fused kernel instead of six passes over an fp32 copy of the activations. The ONNX
graphs (`qace.export.graphs`) use the unfused form, which exports as plain operators.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

HALF = (torch.float16, torch.bfloat16)


def rms_norm(x: torch.Tensor, norm: Any, fused: bool) -> torch.Tensor:
    """T5LayerNorm (no mean, no bias). ``fused``: ``F.rms_norm`` (fp32 inside, rounded once);
    otherwise exactly Hugging Face's formula (fp32 variance, cast back for half weights)."""
    if fused:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + norm.variance_epsilon)
    if norm.weight.dtype in HALF:
        x = x.to(norm.weight.dtype)
    return norm.weight * x


def clamp_fp16(h: torch.Tensor) -> torch.Tensor:
    """Hugging Face's T5 guard against fp16 overflow after each residual (a no-op in other dtypes)."""
    if h.dtype != torch.float16:
        return h
    top = torch.finfo(h.dtype).max
    limit = torch.where(torch.isinf(h).any(), top - 1000, top)
    return torch.clamp(h, -limit, limit)


def fused_qkv(attention: Any) -> torch.Tensor:
    """A T5Attention's q, k and v weights stacked, so one matrix product projects all three."""
    return torch.cat([attention.q.weight, attention.k.weight, attention.v.weight])
