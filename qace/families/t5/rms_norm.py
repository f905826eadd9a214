"""T5's layer norm (an RMS norm: no mean, no bias) as one Triton kernel, half precision on CUDA.

PyTorch's ``F.rms_norm`` kernel is the engine's norm elsewhere (`qace.families.t5.ops.rms_norm`). On the
H200 it read and wrote encoder batches at 2.2-2.5 TB/s, against about 4 TB/s for a copy of the same
bytes (9-13% of the encoders' kernel time went to norms), and took 3.3 µs a call inside decoding steps'
graphs. This kernel reads each row once into registers, sums its squares in fp32, and writes ``weight *
(x * rsqrt(mean + eps))`` computed in fp32 and rounded once to the input's dtype (round to nearest even),
as ``F.rms_norm`` does; only the order of the sum's additions differs, so where the two differ it is by
one step of the half type (`tests/families/t5/test_rms_norm.py` bounds it).

fp32 models, CPUs, tracing and export keep ``F.rms_norm`` or Hugging Face's formula.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: ops.rms_norm uses F.rms_norm
    triton = None

SHAPES = ((1, 2), (2, 4), (4, 4), (4, 8), (8, 8), (16, 8))
"""Launch shapes ``(rows a program, warps)`` the benchmark sweeps (`benchmarks.rms_norm`)."""

LAUNCH_SHAPE = (2, 4)
"""The launch shape: as fast as the sweep's best, within its spread, from 256 to 122,880 rows on an H200."""

EAGER_MIN_ROWS = 32_768
"""Launched from Python, the kernel runs from this many rows. A Triton launch costs the host about 25-40
µs against ``F.rms_norm``'s 10-15, which the device's saving (a third of ``F.rms_norm``'s time) repays
only on large inputs; launched from a CUDA graph (decoding steps), it costs the host nothing. Decoding
steps take the kernel when they run eagerly too (CUDA graphs off), so both ways round their norms alike."""


def fused_available(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """The kernel runs for contiguous half-precision CUDA tensors with a weight of the same dtype,
    outside tracing, compilation and ONNX export."""
    return (
        triton is not None
        and x.is_cuda
        and x.dtype in (torch.float16, torch.bfloat16)
        and weight.dtype == x.dtype
        and x.is_contiguous()
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
        and not torch.onnx.is_in_onnx_export()
    )


def chosen(x: torch.Tensor, weight: torch.Tensor, eager: bool) -> bool:
    """Whether `qace.families.t5.ops.rms_norm` runs the kernel: for `fused_available` inputs, and where
    the caller launches from Python (``eager``: the encoders), only of at least `EAGER_MIN_ROWS` rows."""
    if not fused_available(x, weight):
        return False
    return not eager or x.numel() >= EAGER_MIN_ROWS * x.shape[-1]


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, shape: tuple[int, int] | None = None
) -> torch.Tensor:
    """``F.rms_norm(x, (x.shape[-1],), weight, eps)`` as one kernel (`fused_available` inputs), a new
    tensor of ``x``'s shape. ``shape``: a launch shape ``(rows a program, warps)``, by default
    `LAUNCH_SHAPE`; the warps change the order of a row's sum, so shapes may differ by a step of the half
    type where a sum falls near a rounding boundary."""
    width = x.shape[-1]
    if weight.shape != (width,):
        shape_of = list(weight.shape)
        raise ValueError(f"rms_norm: a weight of shape ({width},) for rows of {width}, not {shape_of}")
    flat = x.view(-1, width)
    rows = flat.shape[0]
    out = torch.empty_like(flat)
    if rows == 0:
        return out.view(x.shape)
    block_rows, warps = shape or LAUNCH_SHAPE
    grid = (triton.cdiv(rows, block_rows),)
    _rms_norm[grid](
        flat, weight, out, rows, width, eps,
        BLOCK_ROWS=block_rows, BLOCK_D=triton.next_power_of_2(width), num_warps=warps,
    )  # fmt: skip
    return out.view(x.shape)


if triton is not None:

    @triton.jit
    def _rms_norm(X, W, OUT, rows, width, eps, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):  # type: ignore[no-untyped-def]
        """One program per ``BLOCK_ROWS`` rows, each row whole in registers."""
        r = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        d = tl.arange(0, BLOCK_D)
        inside = (r < rows)[:, None] & (d < width)[None, :]
        at = r[:, None] * width + d[None, :]
        x = tl.load(X + at, mask=inside, other=0.0).to(tl.float32)
        w = tl.load(W + d, mask=d < width, other=0.0).to(tl.float32)
        scale = tl.math.rsqrt(tl.sum(x * x, axis=1) / width + eps)
        y = w[None, :] * (x * scale[:, None])
        tl.store(OUT + at, y.to(OUT.dtype.element_ty), mask=inside)
