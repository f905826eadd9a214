"""T5's RMS norm as one Triton kernel: against fp64 and ``F.rms_norm`` on a GPU, at every launch shape."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qace.families.t5 import rms_norm as norm_kernel
from qace.families.t5.ops import rms_norm

EPS = 1e-6
WIDTH = 768


def _case(rows: int, dtype: torch.dtype, seed: int, width: int = WIDTH) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations of a trained T5's spread (a few large channels) and a weight near its values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=g) * torch.rand(width, generator=g).mul(8).exp()
    w = torch.rand(width, generator=g) * 2 + 0.05
    return x.to("cuda", dtype), w.to("cuda", dtype)


def _fp64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xd = x.double()
    return w.double() * (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS))


def _check_against_fp64_and_torch(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """Every output within one step of the half type of fp64 on the same half inputs (subnormals: one
    step at the smallest normal), the mean error at most F.rms_norm's (2% slack), one step at most where
    the two differ, and agreement on almost every element."""
    dtype = x.dtype
    torch_out = F.rms_norm(x, (x.shape[-1],), w, EPS)
    want = _fp64(x, w)
    assert got.shape == x.shape and got.dtype == dtype
    finfo = torch.finfo(dtype)
    step = finfo.eps * want.abs().clamp_min(finfo.smallest_normal)
    assert ((got.double() - want).abs() <= step).all()  # rounded once from fp32: half a step and a bit
    kernel_err = (got.double() - want).abs().mean().item()
    torch_err = (torch_out.double() - want).abs().mean().item()
    assert kernel_err <= torch_err * 1.02, (kernel_err, torch_err)
    differ = got != torch_out
    assert ((got.double() - torch_out.double()).abs()[differ] <= step[differ] * 1.0001).all()
    assert differ.double().mean().item() < 0.02


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 2048, 40_000])
def test_kernel_is_as_close_to_fp64_as_f_rms_norm(dtype: torch.dtype, rows: int) -> None:
    """Decoding steps' row counts and an encoder batch's, at the launch shape."""
    x, w = _case(rows, dtype, seed=rows)
    assert norm_kernel.fused_available(x, w)
    _check_against_fp64_and_torch(norm_kernel.rms_norm(x, w, EPS), x, w)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_launch_shape_is_as_close_as_f_rms_norm(dtype: torch.dtype) -> None:
    """Each shape the benchmark sweeps (another count of warps sums a row in another order): a row count
    no shape divides; and a width that is not a power of two (the last block masked)."""
    x, w = _case(1001, dtype, seed=3)
    for shape in norm_kernel.SHAPES:
        _check_against_fp64_and_torch(norm_kernel.rms_norm(x, w, EPS, shape=shape), x, w)
    odd, w_odd = _case(33, dtype, seed=4, width=300)
    _check_against_fp64_and_torch(norm_kernel.rms_norm(odd, w_odd, EPS), odd, w_odd)


@pytest.mark.gpu
def test_ops_rms_norm_takes_the_kernel_in_graphs_and_eagerly_for_large_inputs() -> None:
    """The engine's fused norm: the kernel's bits for contiguous half CUDA tensors (3-d too), where the
    caller launches from Python (``eager``) only from `EAGER_MIN_ROWS` rows; F.rms_norm's otherwise,
    for a non-contiguous view and for fp32."""
    norm = torch.nn.Module()
    big, norm.weight = _case(norm_kernel.EAGER_MIN_ROWS, torch.bfloat16, seed=5)
    norm.variance_epsilon = EPS
    states = big.view(-1, 8, WIDTH)
    kernel = norm_kernel.rms_norm(states, norm.weight, EPS)
    assert torch.equal(rms_norm(states, norm, fused=True, eager=True), kernel)
    assert not torch.equal(kernel, F.rms_norm(states, (WIDTH,), norm.weight, EPS))  # the test can tell
    small = big[:64]
    torch_small = F.rms_norm(small, (WIDTH,), norm.weight, EPS)
    assert torch.equal(rms_norm(small, norm, fused=True, eager=True), torch_small)
    assert torch.equal(rms_norm(small, norm, fused=True), norm_kernel.rms_norm(small, norm.weight, EPS))
    strided = big.t().contiguous().t()
    assert not norm_kernel.chosen(strided, norm.weight, eager=False)
    assert torch.equal(rms_norm(strided, norm, fused=True), F.rms_norm(strided, (WIDTH,), norm.weight, EPS))
    assert not norm_kernel.chosen(big.float(), norm.weight.float(), eager=False)


def test_kernel_runs_only_for_contiguous_half_cuda_tensors_of_its_weight_dtype() -> None:
    x, w = torch.zeros(2, 8, dtype=torch.float16), torch.ones(8, dtype=torch.float16)
    assert not norm_kernel.fused_available(x, w)  # CPU
    if torch.cuda.is_available():
        x, w = x.cuda(), w.cuda()
        assert norm_kernel.fused_available(x, w)
        assert not norm_kernel.fused_available(x.float(), w.float())
        assert not norm_kernel.fused_available(x, w.bfloat16())
        assert not norm_kernel.fused_available(x.t(), w[:2])


def test_launch_shape_is_one_the_benchmark_sweeps() -> None:
    assert norm_kernel.LAUNCH_SHAPE in norm_kernel.SHAPES
