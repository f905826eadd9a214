"""T5 attention for one query position, fused into one Triton kernel on CUDA in half precision.

A decoding step attends one query per row to the cached keys and values: for a T5-base step at 2,048
rows that is 3.6 GB of cross-attention keys and values over 12 layers. Written in PyTorch it is two
batched matrix-vector products plus an fp32 copy of the scores, a softmax and a copy back, five kernels a
layer running at about half the memory bandwidth. The kernel here reads each row's
keys and values once, keeps scores and probabilities in fp32 registers, and writes the heads already
merged for the output projection (FlashDecoding's idea, for the short keys of captions and regions).
Masked keys (the padding of a batch, Visual-T5's empty question slots, future cache positions) are not
read at all, so a row pays for its own length, not the batch's longest.

Numerics: scores, bias, softmax and the weighted sum stay in fp32 and only the output is rounded, where
Hugging Face's half forward rounds the scores and the probabilities to half as well; so it is at least as
close to fp32 as the reference's own half forward (tested on the GPU). fp32 models keep the PyTorch
products, whose tokens equal Hugging Face's exactly.
"""

from __future__ import annotations

import torch

from qace.families.t5.ops import HALF

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the PyTorch path is used
    triton = None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``(B, 1, H*D)``: one query ``q (B, H, 1, D)`` against ``k``/``v (B, H, S, D)``, T5-style (unscaled
    scores plus the additive ``bias``, broadcastable to ``(B, H, 1, S)``), heads merged."""
    if fused_available(q):
        return _fused(q, k, v, bias)
    scores = torch.matmul(q, k.transpose(-1, -2)) + bias
    o = torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)
    return o.transpose(1, 2).reshape(q.shape[0], 1, -1)


def fused_available(q: torch.Tensor) -> bool:
    """The fused kernel runs for half-precision CUDA tensors with a power-of-two head size."""
    d = q.shape[-1]
    return triton is not None and q.is_cuda and q.dtype in HALF and d & (d - 1) == 0


def _fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    rows, heads, _, d = q.shape
    keys = k.shape[2]
    bias = bias.expand(rows, heads, 1, keys)  # a view: broadcast dimensions get stride 0
    if bias.stride(-1) != 1:
        bias = bias.contiguous()
    out = torch.empty(rows, 1, heads * d, device=q.device, dtype=q.dtype)
    _kernel[(rows * heads,)](
        q, k, v, bias, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), bias.stride(0), bias.stride(1),
        heads, keys, torch.finfo(q.dtype).min / 2,
        D=d, BLOCK_S=max(16, triton.next_power_of_2(keys)), num_warps=2,
    )  # fmt: skip
    return out


if triton is not None:

    @triton.jit
    def _kernel(  # type: ignore[no-untyped-def]
        Q, K, V, BIAS, OUT,
        sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sb_b, sb_h,
        n_heads, n_keys, masked_at,
        D: tl.constexpr, BLOCK_S: tl.constexpr,
    ):  # fmt: skip
        """One program per (row, head): scores, softmax and the weighted sum of values in fp32.

        Keys whose bias is at or below ``masked_at`` (padding, future positions: the engine masks with
        the dtype's minimum) weigh exactly zero after the softmax, so they are not read at all.
        """
        pid = tl.program_id(0)
        b = (pid // n_heads).to(tl.int64)  # row offsets pass 2**31 elements in a stacked cache
        h = pid % n_heads
        d = tl.arange(0, D)
        s = tl.arange(0, BLOCK_S)
        bias = tl.load(BIAS + b * sb_b + h * sb_h + s, mask=s < n_keys, other=masked_at).to(tl.float32)
        keep = bias > masked_at
        q = tl.load(Q + b * sq_b + h * sq_h + d).to(tl.float32)
        k = tl.load(
            K + b * sk_b + h * sk_h + s[:, None] * sk_s + d[None, :], mask=keep[:, None], other=0.0
        ).to(tl.float32)
        scores = tl.where(keep, tl.sum(k * q[None, :], axis=1) + bias, float("-inf"))
        top = tl.max(scores, axis=0)
        p = tl.where(keep, tl.exp(scores - top), 0.0)  # a padding row of a bucket keeps nothing: zeros
        p = p / tl.maximum(tl.sum(p, axis=0), 1e-30)
        v = tl.load(
            V + b * sv_b + h * sv_h + s[:, None] * sv_s + d[None, :], mask=keep[:, None], other=0.0
        ).to(tl.float32)
        o = tl.sum(p[:, None] * v, axis=0)
        tl.store(OUT + (b * n_heads + h) * D + d, o.to(OUT.dtype.element_ty))
