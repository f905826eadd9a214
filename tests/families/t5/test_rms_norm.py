"""T5's RMS norm as one Triton kernel: against fp64 and ``F.rms_norm`` on a GPU, every launch shape alike."""

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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 2048, 6000])
def test_kernel_is_as_close_to_fp64_as_f_rms_norm(dtype: torch.dtype, rows: int) -> None:
    """Decoding steps' row counts and encoder batches' (both launch shapes): every output is within one
    step of the half type of fp64 on the same half inputs, the mean error is at most F.rms_norm's (2%
    slack), where the two differ it is by one step, and they agree on almost every element."""
    x, w = _case(rows, dtype, seed=rows)
    assert norm_kernel.fused_available(x, w)
    got = norm_kernel.rms_norm(x, w, EPS)
    torch_out = F.rms_norm(x, (WIDTH,), w, EPS)
    want = _fp64(x, w)
    assert got.shape == x.shape and got.dtype == dtype
    relative = ((got.double() - want).abs() / want.abs().clamp_min(1e-6)).max().item()
    assert relative <= torch.finfo(dtype).eps, relative  # rounded once from fp32: half a step and a bit
    kernel_err = (got.double() - want).abs().mean().item()
    torch_err = (torch_out.double() - want).abs().mean().item()
    assert kernel_err <= torch_err * 1.02, (kernel_err, torch_err)
    step = torch.finfo(dtype).eps * torch_out.double().abs()  # one step of the half type at each value
    differ = got != torch_out
    assert ((got.double() - torch_out.double()).abs()[differ] <= step[differ] * 1.0001).all()
    assert differ.double().mean().item() < 0.02


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_launch_shape_gives_the_same_bits(dtype: torch.dtype) -> None:
    """Each row is reduced by one program whatever the shape, so the benchmark's sweep compares like
    with like and `launch_shape` may choose any of them; a width that is not a power of two (the
    last block masked) and a row count no shape divides."""
    x, w = _case(1001, dtype, seed=3, width=WIDTH)
    first = norm_kernel.rms_norm(x, w, EPS, shape=norm_kernel.SHAPES[0])
    for shape in norm_kernel.SHAPES[1:]:
        assert torch.equal(norm_kernel.rms_norm(x, w, EPS, shape=shape), first), shape
    odd, w_odd = _case(33, dtype, seed=4, width=300)
    torch.testing.assert_close(
        norm_kernel.rms_norm(odd, w_odd, EPS), F.rms_norm(odd, (300,), w_odd, EPS), rtol=0.01, atol=0
    )


@pytest.mark.gpu
def test_ops_rms_norm_takes_the_kernel_for_half_and_f_rms_norm_otherwise() -> None:
    """The engine's fused norm: the kernel's bits for contiguous half CUDA tensors (3-d decoder states
    too); a non-contiguous view or fp32 goes to F.rms_norm."""
    norm = torch.nn.Module()
    x, norm.weight = _case(64, torch.bfloat16, seed=5)
    norm.variance_epsilon = EPS
    states = x.view(64, 1, WIDTH)
    assert torch.equal(rms_norm(states, norm, fused=True), norm_kernel.rms_norm(states, norm.weight, EPS))
    strided = x.t().contiguous().t()
    assert not norm_kernel.fused_available(strided, norm.weight)
    assert torch.equal(rms_norm(strided, norm, fused=True), F.rms_norm(strided, (WIDTH,), norm.weight, EPS))


def test_kernel_runs_only_for_contiguous_half_cuda_tensors_of_its_weight_dtype() -> None:
    x, w = torch.zeros(2, 8, dtype=torch.float16), torch.ones(8, dtype=torch.float16)
    assert not norm_kernel.fused_available(x, w)  # CPU
    if torch.cuda.is_available():
        x, w = x.cuda(), w.cuda()
        assert norm_kernel.fused_available(x, w)
        assert not norm_kernel.fused_available(x.float(), w.float())
        assert not norm_kernel.fused_available(x, w.bfloat16())
        assert not norm_kernel.fused_available(x.t(), w[:2])


def test_launch_shape_by_rows() -> None:
    assert norm_kernel.launch_shape(1) == norm_kernel.launch_shape(4096) == (2, 4)
    assert norm_kernel.launch_shape(4097) == norm_kernel.launch_shape(80_000) == (8, 8)
    assert set(norm_kernel.SHAPES) >= {norm_kernel.launch_shape(1), norm_kernel.launch_shape(80_000)}
