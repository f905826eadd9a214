"""T5 attention for one query position, fused into one Triton kernel on CUDA in half precision.

A decoding step attends one query per row to the cached keys and values: for a T5-base step at 2,048
rows that is 3.6 GB of cross-attention keys and values over 12 layers. Written in PyTorch it is two
batched matrix-vector products plus an fp32 copy of the scores, a softmax and a copy back, five kernels a
layer running at about half the memory bandwidth. The kernel here reads each row's
keys and values once, keeps scores and probabilities in fp32 registers, and writes the heads already
merged for the output projection (FlashDecoding's idea, for the short keys of captions and regions).
Masked keys (the padding of a batch, Visual-T5's empty question slots, future cache positions) are not
read at all, so a row pays for its own length, not the batch's longest. Self-attention (`attend_step`)
also writes the step's own key and value into the cache in the same kernel, where two index copies a
layer cost more than the attention itself at 2,048 rows.

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


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    ended: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(B, 1, H*D)``: one query ``q (B, H, 1, D)`` against ``k``/``v (B, H, S, D)``, T5-style (unscaled
    scores plus the additive ``bias``, broadcastable to ``(B, H, 1, S)``), heads merged.

    ``ended`` (bool ``(B,)``): rows whose output is not used (decoding rows that have ended, a bucket's
    padding rows). The fused kernel reads nothing for them and gives zeros; the PyTorch form ignores it.
    Every other row's output is the same either way, bit for bit."""
    if fused_available(q):
        return _fused(q, k, v, bias, ended)
    return pytorch_form(q, k, v, bias)


def pytorch_form(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`attend` in PyTorch operations, every row computed: two batched products and an fp32 softmax
    (fp32 models, CPUs, and the benchmarks' baseline for the kernel)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) + bias
    o = torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)
    return o.transpose(1, 2).reshape(q.shape[0], 1, -1)


def attend_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    pos: torch.Tensor,
    bias: torch.Tensor,
    ended: torch.Tensor | None = None,
) -> torch.Tensor:
    """Self-attention of a decoding step: writes this step's ``k``/``v (B, H, 1, D)`` into the caches
    ``keys``/``values (B, H, S, D)`` at position ``pos`` (a one-element tensor), then `attend` over the
    caches (``ended`` as there). The fused kernel does both at once and reads no cache position the
    ``bias`` masks, so the cache past ``pos`` need not be initialised; the PyTorch form reads every
    position."""
    if fused_available(q):
        return _fused(q, keys, values, bias, ended, (k, v, pos))
    keys.index_copy_(2, pos, k)
    values.index_copy_(2, pos, v)
    return attend(q, keys, values, bias)


SINGLE_WARP_KEYS = 64
"""Up to this many key slots (a power of two) a program is one warp, else two: one warp is faster at the
decoder's key counts (docs/performance.md, "The decoding step against its memory bound"); longer keys
were not measured with one."""


def fused_available(q: torch.Tensor) -> bool:
    """The fused kernel runs for half-precision CUDA tensors with a power-of-two head size."""
    d = q.shape[-1]
    return triton is not None and q.is_cuda and q.dtype in HALF and d & (d - 1) == 0


def _fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    ended: torch.Tensor | None,
    step: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The kernel; ``step``: this step's ``(key, value, pos)`` to write into ``k``/``v`` (`attend_step`)."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    if step is None:
        k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))  # copies: nothing written
        new_k, new_v, pos = q, q, q  # unused: WRITE is off
    else:
        new_k, new_v, pos = step
        if k.stride(-1) != 1 or v.stride(-1) != 1 or new_k.stride() != new_v.stride():
            raise ValueError("attend_step: caches with contiguous heads and matching key/value strides")
    rows, heads, _, d = q.shape
    keys = k.shape[2]
    bias = bias.expand(rows, heads, 1, keys)  # a view: broadcast dimensions get stride 0
    if bias.stride(-1) != 1:
        bias = bias.contiguous()
    out = torch.empty(rows, 1, heads * d, device=q.device, dtype=q.dtype)
    block = max(16, triton.next_power_of_2(keys))
    _kernel[(rows * heads,)](
        q, k, v, bias, out, new_k, new_v, pos, q if ended is None else ended,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), bias.stride(0), bias.stride(1),
        new_k.stride(0), new_k.stride(1), heads, keys, torch.finfo(q.dtype).min / 2,
        D=d, BLOCK_S=block, WRITE=step is not None, SKIP=ended is not None,
        num_warps=1 if block <= SINGLE_WARP_KEYS else 2,
    )  # fmt: skip
    return out


if triton is not None:

    @triton.jit
    def _kernel(  # type: ignore[no-untyped-def]
        Q, K, V, BIAS, OUT, NEW_K, NEW_V, POS, ENDED,
        sq_b, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sb_b, sb_h, sn_b, sn_h,
        n_heads, n_keys, masked_at,
        D: tl.constexpr, BLOCK_S: tl.constexpr, WRITE: tl.constexpr, SKIP: tl.constexpr,
    ):  # fmt: skip
        """One program per (row, head): scores, softmax and the weighted sum of values in fp32.

        Keys whose bias is at or below ``masked_at`` (padding, future positions: the engine masks with
        the dtype's minimum) weigh exactly zero after the softmax, so they are not read at all. With
        ``WRITE``, the key and value at ``POS`` are ``NEW_K``/``NEW_V``: stored into the caches and used
        from registers, not read back. With ``SKIP``, a row flagged in ``ENDED`` keeps no key: it reads
        no key or value and writes zeros.
        """
        pid = tl.program_id(0)
        b = (pid // n_heads).to(tl.int64)  # row offsets pass 2**31 elements in a stacked cache
        h = pid % n_heads
        d = tl.arange(0, D)
        s = tl.arange(0, BLOCK_S)
        bias = tl.load(BIAS + b * sb_b + h * sb_h + s, mask=s < n_keys, other=masked_at).to(tl.float32)
        keep = bias > masked_at
        if SKIP:
            keep = keep & (tl.load(ENDED + b).to(tl.int32) == 0)
        read = keep
        if WRITE:
            pos = tl.load(POS)
            new_k = tl.load(NEW_K + b * sn_b + h * sn_h + d)
            new_v = tl.load(NEW_V + b * sn_b + h * sn_h + d)
            tl.store(K + b * sk_b + h * sk_h + pos * sk_s + d, new_k)
            tl.store(V + b * sv_b + h * sv_h + pos * sv_s + d, new_v)
            read = keep & (s != pos)
        q = tl.load(Q + b * sq_b + h * sq_h + d).to(tl.float32)
        k = tl.load(K + b * sk_b + h * sk_h + s[:, None] * sk_s + d[None, :], mask=read[:, None], other=0.0)
        if WRITE:
            k = tl.where((s == pos)[:, None], new_k[None, :], k)
        k = k.to(tl.float32)
        scores = tl.where(keep, tl.sum(k * q[None, :], axis=1) + bias, float("-inf"))
        top = tl.max(scores, axis=0)
        p = tl.where(keep, tl.exp(scores - top), 0.0)  # a padding row of a bucket keeps nothing: zeros
        p = p / tl.maximum(tl.sum(p, axis=0), 1e-30)
        v = tl.load(V + b * sv_b + h * sv_h + s[:, None] * sv_s + d[None, :], mask=read[:, None], other=0.0)
        if WRITE:
            v = tl.where((s == pos)[:, None], new_v[None, :], v)
        o = tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        tl.store(OUT + (b * n_heads + h) * D + d, o.to(OUT.dtype.element_ty))
