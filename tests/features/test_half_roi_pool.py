"""RoIPool of a half-precision feature map (`qace.features.half_roi_pool`): its bin edges on any device,
its Triton kernel on a GPU, both against torchvision's kernel written out (`_roi_pool_by_definition`)."""

from __future__ import annotations

import pytest
import torch

from qace.features import half_roi_pool, ops
from tests.features.test_detector import _roi_pool_by_definition


def _rois(count: int, images: int, seed: int) -> torch.Tensor:
    """Regions inside, across and outside a map of up to 20 x 24 cells at 1/16, degenerate ones, and
    corners on half cells (x / 16 = k + 0.5, where C's round and round-half-even differ)."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(count, 2, generator=g) * 420 - 30
    image = torch.randint(0, images, (count, 1), generator=g).float()
    rois = torch.cat([image, xy, xy + torch.rand(count, 2, generator=g) * 200], dim=1)
    halves = torch.tensor([[0.0, 8, 40, 72, 104], [images - 1, 24, 8, 24, 8], [0, 300, 200, 100, 50]])
    return torch.cat([rois, halves])


def _pool_by_edges(x: torch.Tensor, rois: torch.Tensor, size: int) -> torch.Tensor:
    """RoIPool from `bin_edges`' bins (a maximum per bin, 0 where a bin is empty)."""
    image, row0, row1, col0, col1 = half_roi_pool.bin_edges(rois, size, 1 / 16, x.shape[2], x.shape[3])
    out = torch.zeros(len(rois), x.shape[1], size, size)
    for k in range(len(rois)):
        for ph in range(size):
            for pw in range(size):
                h0, h1, w0, w1 = int(row0[k, ph]), int(row1[k, ph]), int(col0[k, pw]), int(col1[k, pw])
                if h1 > h0 and w1 > w0:
                    out[k, :, ph, pw] = x[int(image[k]), :, h0:h1, w0:w1].amax(dim=(1, 2))
    return out


@pytest.mark.parametrize("size", [2, 7])
def test_bin_edges_are_torchvisions(size: int) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 20, 24, generator=g)
    rois = _rois(60, 2, seed=size)
    assert torch.equal(_pool_by_edges(x, rois, size), _roi_pool_by_definition(x, rois, size, 1 / 16))


def test_rounding_is_cs_round() -> None:
    assert half_roi_pool._round_half_away(torch.tensor([0.5, 1.5, 2.5, -0.5, 2.4999998, 3.0])).tolist() == [
        1.0, 2.0, 3.0, -1.0, 2.0, 3.0,
    ]  # fmt: skip


def test_the_kernel_is_for_half_maps_on_a_gpu() -> None:
    assert not half_roi_pool.fused_available(torch.zeros(1, 2, 3, 3, dtype=torch.bfloat16))
    if torch.cuda.is_available() and half_roi_pool.triton is not None:
        assert half_roi_pool.fused_available(torch.zeros(1, 2, 3, 3, dtype=torch.float16, device="cuda"))
        assert not half_roi_pool.fused_available(torch.zeros(1, 2, 3, 3, device="cuda"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_map_without_the_kernel_is_pooled_in_float32_and_cast_back(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 20, 24, generator=g).to(dtype)
    rois = _rois(30, 2, seed=1)
    out = ops.roi_pool(x, rois, 7, 1 / 16)
    assert out.dtype == dtype and torch.equal(out, ops.roi_pool(x.float(), rois, 7, 1 / 16).to(dtype))
    assert torch.equal(out.float(), _roi_pool_by_definition(x.float(), rois, 7, 1 / 16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("channels", "size"), [(1024, 14), (100, 7), (3, 2)])
def test_kernel_equals_torchvision_on_the_float32_copy(dtype: torch.dtype, channels: int, size: int) -> None:
    """Bit for bit: the half map pooled by the kernel, against torchvision's (or the reference's) float32
    pooling of the same values cast back; channels-last output; a map given in NCHW gives the same."""
    g = torch.Generator().manual_seed(channels)
    x = torch.randn(3, channels, 20, 24, generator=g).to(dtype).cuda()
    rois = _rois(200, 3, seed=channels).cuda()
    expected = ops.roi_pool(x.float(), rois, size, 1 / 16).to(dtype)
    on_gpu, on_cpu = (half_roi_pool.bin_edges(r, size, 1 / 16, 20, 24) for r in (rois, rois.cpu()))
    assert all(torch.equal(g.cpu(), c) for g, c in zip(on_gpu, on_cpu, strict=True))
    for features in (x.contiguous(memory_format=torch.channels_last), x):
        out = half_roi_pool.roi_pool_half(features, rois, size, 1 / 16)
        assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(out, expected)
        assert torch.equal(ops.roi_pool(features, rois, size, 1 / 16), out)  # the dispatch picks the kernel
    assert half_roi_pool.roi_pool_half(x, rois[:0], size, 1 / 16).shape == (0, channels, size, size)
