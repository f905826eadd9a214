"""T5 encoder self-attention, fused into one Triton kernel on CUDA in half precision.

T5's attention adds a relative position bias to unscaled scores. PyTorch's kernels take that bias as a
``(batch, heads, length, length)`` tensor, so the fused encoder built one per batch (in fp32, then in
half: hundreds of MB at 2,048 rows) and its memory-efficient kernel read it in every layer, beside
q, k and v, and wrote heads that were then copied into the output projection's input. This kernel reads
q, k and v where the fused q/k/v product wrote them, looks each score's bias up in a per-head table of
the ``2 * length - 1`` relative positions (by each token's original position, so Visual-T5's packed rows
keep their biases), skips masked keys, and writes the heads merged, where the output projection reads
them. It is FlashAttention's loop (blocks of queries, an online softmax over blocks of keys): scores,
bias and softmax in fp32, the probabilities rounded to the values' dtype for their product, as PyTorch's
memory-efficient kernel does.

fp32 models and CPUs keep `qace.families.t5.encoder`'s PyTorch path.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from qace.families.t5.ops import HALF

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the PyTorch path is used
    triton = None


class LaunchShape(NamedTuple):
    """How `attend_packed` launches its kernel: ``queries`` and ``keys`` a block, ``warps`` a program.
    Every shape computes each query's attention alike but for the order in which key blocks accumulate,
    so shapes agree to rounding."""

    queries: int
    keys: int
    warps: int


def launch_shape(length: int) -> LaunchShape:
    """The launch shape for rows of ``length`` tokens: up to 32 tokens 32 queries and 32 keys a block on
    2 warps, else 64 and 64 on 4 (the fastest of sweeps on an H200; docs/performance.md)."""
    return LaunchShape(32, 32, 2) if length <= 32 else LaunchShape(64, 64, 4)


def fused_available(x: torch.Tensor, d_kv: int) -> bool:
    """The kernel runs for half-precision CUDA tensors with a power-of-two head size of at least 16."""
    return triton is not None and x.is_cuda and x.dtype in HALF and d_kv >= 16 and d_kv & (d_kv - 1) == 0


def relative_bias_table(bias_module: Any, length: int, device: torch.device) -> torch.Tensor:
    """``(heads, 2 * length - 1)``: the bias Hugging Face's ``compute_bias(length, length)`` gives a key
    ``r`` positions after its query (``r`` from ``1 - length`` to ``length - 1``) at index
    ``r + length - 1``, in the bias embedding's dtype, contiguous. T5's bias depends only on ``r``, so
    the last query's row and the first query's row hold every value."""
    bias = bias_module.compute_bias(length, length, device=device)[0]  # (H, L, L)
    return torch.cat([bias[:, -1, :], bias[:, 0, 1:]], dim=1).contiguous()


def attend_packed(
    qkv: torch.Tensor,
    out: torch.Tensor,
    table: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor | None,
    heads: int,
    d_kv: int,
    shape: LaunchShape | None = None,
) -> None:
    """Self-attention of a batch whose q, k and v are one product's output, written into ``out``.

    ``qkv``: ``(batch * length, 3 * heads * d_kv)`` or longer (rows past the batch's are not read), each
    token's q, then k, then v, heads in order (`qace.families.t5.ops.fused_qkv`); ``out``: ``(rows,
    heads * d_kv)``, whose first ``batch * length`` rows get each token's heads, merged; ``mask``: ``(batch,
    length)``, nonzero where a key is real; ``positions``: ``(batch, length)`` original positions of packed
    rows, or None for ``0 .. length - 1``; ``table``: `relative_bias_table` of the original length.
    ``shape``: the kernel's `LaunchShape`, by default `launch_shape`'s for the batch's length. Every
    query (padding ones too) attends to its row's real keys; a row without any gives zeros."""
    batch, length = mask.shape
    width = heads * d_kv
    if qkv.stride(1) != 1 or qkv.stride(0) != 3 * width or out.stride(1) != 1 or out.stride(0) != width:
        raise ValueError("attend_packed: qkv and out as contiguous rows of 3 * heads * d_kv and heads * d_kv")
    if table.shape[0] != heads or table.stride(1) != 1:
        raise ValueError("attend_packed: a contiguous (heads, 2 * length - 1) table")
    mask = mask if mask.is_contiguous() else mask.contiguous()
    if positions is not None and not positions.is_contiguous():
        positions = positions.contiguous()
    shape = shape or launch_shape(length)
    grid = (triton.cdiv(length, shape.queries), batch * heads)
    _self_attention[grid](
        qkv, out, table, mask, mask if positions is None else positions,
        heads, length, (table.shape[1] + 1) // 2, table.stride(0),
        D=d_kv, BLOCK_M=shape.queries, BLOCK_N=shape.keys, PACKED=positions is not None,
        num_warps=shape.warps,
    )  # fmt: skip


if triton is not None:

    @triton.jit
    def _self_attention(  # type: ignore[no-untyped-def]
        QKV, OUT, TABLE, MASK, POS,
        n_heads, length, table_length, s_table,
        D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PACKED: tl.constexpr,
    ):  # fmt: skip
        """One program per (block of queries, row and head): an online softmax over blocks of keys.
        Scores and bias in fp32; a key whose mask is 0 is not read and weighs exactly zero."""
        row_head = tl.program_id(1)
        b = (row_head // n_heads).to(tl.int64)
        h = row_head % n_heads
        width = n_heads * D
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        d = tl.arange(0, D)
        in_row = m < length
        first = b * length  # the row's first token
        stride = 3 * width  # a token's q, k and v
        q = tl.load(QKV + (first + m)[:, None] * stride + h * D + d[None, :], mask=in_row[:, None], other=0.0)
        if PACKED:
            q_pos = tl.load(POS + first + m, mask=in_row, other=0).to(tl.int32)
        else:
            q_pos = m
        top = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for start in tl.range(0, length, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            keep = tl.load(MASK + first + n, mask=n < length, other=0) != 0
            at = QKV + (first + n)[:, None] * stride + h * D + d[None, :]
            k = tl.load(at + width, mask=keep[:, None], other=0.0)
            v = tl.load(at + 2 * width, mask=keep[:, None], other=0.0)
            if PACKED:
                k_pos = tl.load(POS + first + n, mask=n < length, other=0).to(tl.int32)
            else:
                k_pos = n
            relative = k_pos[None, :] - q_pos[:, None] + (table_length - 1)
            both = in_row[:, None] & keep[None, :]
            bias = tl.load(TABLE + h * s_table + relative, mask=both, other=0.0).to(tl.float32)
            scores = tl.where(keep[None, :], tl.dot(q, tl.trans(k)) + bias, float("-inf"))
            new_top = tl.maximum(top, tl.max(scores, axis=1))
            shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # no key yet: nothing to rescale
            p = tl.exp(scores - shift[:, None])
            scale = tl.exp(top - shift)
            total = total * scale + tl.sum(p, axis=1)
            acc = acc * scale[:, None] + tl.dot(p.to(v.dtype), v)
            top = new_top
        o = acc / tl.maximum(total, 1e-30)[:, None]
        at = OUT + (first + m)[:, None] * width + h * D + d[None, :]
        tl.store(at, o.to(OUT.dtype.element_ty), mask=in_row[:, None])
