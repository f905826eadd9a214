"""RoIPool of a half-precision, channels-last feature map as one Triton kernel on a GPU.

The detector pools 300 proposals an image from res4 (1,024 channels) into 14 x 14 bins. torchvision's
kernel takes float32 in NCHW: the bf16 res4 is copied to float32, each of the 963 million outputs of a
16-image batch is one thread that reads its bin with a stride of a whole channel plane, an argmax is
written beside every output for a backward pass that never runs, and the result is cast back to bf16
in channels-last for res5 (23.8 ms of a 105 ms batch on an H100). Here one program pools one bin of one
region over a block of channels: it reads the bin's pixels as contiguous channel vectors of res4 in its
own dtype and writes the output straight in the layout res5 reads.

Exactness: a maximum of bf16 or fp16 values is one of them, so pooling the half map gives exactly the
half cast of pooling its float32 copy, for finite values (the detector's res4 follows a ReLU). The bin
edges are computed as torchvision's kernel computes them (`bin_edges`: float32 products, C ``round``,
IEEE division, which PyTorch's CUDA division by a scalar is not), and an empty bin gives 0, as there.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: torchvision's kernel or the reference pools instead
    triton = None

HALF = (torch.float16, torch.bfloat16)


def fused_available(features: Tensor) -> bool:
    """The kernel runs on half-precision CUDA feature maps when Triton is installed."""
    return triton is not None and features.is_cuda and features.dtype in HALF


def _round_half_away(x: Tensor) -> Tensor:
    """C's ``round`` on float32: halves away from zero (``torch.round`` rounds them to even)."""
    whole = torch.trunc(x)
    return whole + torch.where((x - whole).abs() >= 0.5, torch.sign(x), torch.zeros_like(x))


def bin_edges(rois: Tensor, size: int, spatial_scale: float, height: int, width: int) -> tuple[Tensor, ...]:
    """Each region's ``size`` bins as torchvision's RoIPool kernel places them: (K,) image indices and
    (K, size) first and past-last rows, then columns, int32, clipped to the map. ``rois`` (K, 5) are
    ``(image, x1, y1, x2, y2)`` in input pixels. Float32 throughout, as the kernel: corners scaled and
    rounded, a bin's extent the region's (at least 1) over ``size``, edges floored and ceiled."""
    r = rois.float()
    corners = _round_half_away(r[:, 1:] * torch.tensor(spatial_scale, dtype=torch.float32)).int()
    steps = torch.arange(size + 1, device=rois.device, dtype=torch.float32)

    def edges(start: Tensor, end: Tensor, limit: int) -> tuple[Tensor, Tensor]:
        extent = torch.clamp(end - start + 1, min=1).float()
        # divided by a tensor: PyTorch's CUDA division by a scalar multiplies by its reciprocal instead
        extent = extent / torch.full_like(extent, size)
        first = torch.floor(steps[None, :-1] * extent[:, None]).int() + start[:, None]
        last = torch.ceil(steps[None, 1:] * extent[:, None]).int() + start[:, None]
        return first.clamp(0, limit).int(), last.clamp(0, limit).int()

    rows = edges(corners[:, 1], corners[:, 3], height)
    cols = edges(corners[:, 0], corners[:, 2], width)
    return (r[:, 0].int(), *rows, *cols)


def roi_pool_half(features: Tensor, rois: Tensor, size: int, spatial_scale: float) -> Tensor:
    """RoIPool of ``features`` (N, C, H, W) half precision on a GPU (`fused_available`): (K, C, size,
    size) in ``features``' dtype and channels-last, equal to torchvision's ``roi_pool`` of its float32
    copy cast back (module docstring)."""
    n, channels, height, width = features.shape
    x = features.contiguous(memory_format=torch.channels_last)
    image, row0, row1, col0, col1 = bin_edges(rois, size, spatial_scale, height, width)
    out = torch.empty((len(rois), size, size, channels), device=x.device, dtype=x.dtype)
    if len(rois):
        block = min(1024, triton.next_power_of_2(channels))
        grid = (len(rois) * size * size, triton.cdiv(channels, block))
        _roi_pool[grid](
            x, image, row0, row1, col0, col1, out,
            channels, x.stride(0), x.stride(2), x.stride(3),
            SIZE=size, BLOCK_C=block, num_warps=4,
        )  # fmt: skip
    return out.permute(0, 3, 1, 2)


if triton is not None:

    @triton.jit
    def _roi_pool(  # type: ignore[no-untyped-def]
        X, IMAGE, ROW0, ROW1, COL0, COL1, OUT,
        channels, s_n, s_h, s_w,
        SIZE: tl.constexpr, BLOCK_C: tl.constexpr,
    ):  # fmt: skip
        """One program per (region, bin row, bin column) and block of channels: the maximum over the
        bin's pixels, each a contiguous vector of channels; 0 for an empty bin."""
        pid = tl.program_id(0)
        k = pid // (SIZE * SIZE)
        ph = (pid // SIZE) % SIZE
        pw = pid % SIZE
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        inside = c < channels
        h0 = tl.load(ROW0 + k * SIZE + ph)
        h1 = tl.load(ROW1 + k * SIZE + ph)
        w0 = tl.load(COL0 + k * SIZE + pw)
        w1 = tl.load(COL1 + k * SIZE + pw)
        base = X + tl.load(IMAGE + k).to(tl.int64) * s_n + c
        top = tl.full((BLOCK_C,), float("-inf"), tl.float32)
        for h in range(h0, h1):
            for w in range(w0, w1):
                v = tl.load(base + h * s_h + w * s_w, mask=inside, other=float("-inf"))
                top = tl.maximum(top, v.to(tl.float32))
        top = tl.where((h1 <= h0) | (w1 <= w0), 0.0, top)
        tl.store(OUT + pid.to(tl.int64) * channels + c, top.to(OUT.dtype.element_ty), mask=inside)
