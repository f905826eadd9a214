"""The half-precision building blocks compute what Hugging Face's T5 modules compute."""

from __future__ import annotations

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from qace.families.t5 import fp16_guard
from qace.families.t5.ops import FeedForward, add_linear_, clamp_fp16, rms_norm


def _block(gated: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=1, num_heads=4,
        feed_forward_proj="gated-gelu" if gated else "relu", dropout_rate=0.0,
    )  # fmt: skip
    layer = T5ForConditionalGeneration(config).eval().encoder.block[0].layer[-1]
    return layer.DenseReluDense, layer.layer_norm


def test_add_linear_adds_the_product_into_its_first_argument() -> None:
    torch.manual_seed(0)
    h, x, w = torch.randn(3, 5, 8), torch.randn(3, 5, 6), torch.randn(8, 6)
    want = h + x @ w.t()
    out = add_linear_(h, x, w)
    assert out is h  # in place: no new residual tensor
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("gated", [False, True])
def test_feed_forward_adds_what_the_module_adds(gated: bool) -> None:
    ff, norm = _block(gated)
    block = FeedForward(ff, norm)
    assert block.relu is not gated  # ReLU checkpoints take the epilogue path
    h = torch.randn(4, 7, 32)
    with torch.inference_mode():
        want = h + ff(rms_norm(h, norm, fused=True))
        got = block.add_(h.clone())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _formula(h: torch.Tensor) -> torch.Tensor:
    """Hugging Face T5's fp16 guard, written out as in ``T5LayerFF.forward``."""
    top = torch.finfo(torch.float16).max
    limit = torch.where(torch.isinf(h).any(), top - 1000, top)
    return torch.clamp(h, min=-limit, max=limit)


def _activations(device: str, case: str) -> torch.Tensor:
    h = torch.randn(3, 1000, 768, generator=torch.Generator().manual_seed(0)).mul_(20_000)
    h = h.clamp_(-65_000, 65_000).half()
    h[0, 0, :4] = torch.tensor([65_504.0, -65_504.0, 64_600.0, float("nan")], dtype=torch.float16)
    if case == "inf":
        h[2, 999, 767], h[1, 5, 0] = float("inf"), float("-inf")
    return h.to(device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("case", ["finite", "inf"])
def test_clamp_fp16_is_the_formula(case: str, device: str) -> None:
    """On the CPU the formula itself; on a GPU the fused kernels, bit for bit (NaN kept, in place)."""
    h = _activations(device, case)
    before = h.clone()
    want = _formula(before)
    got = clamp_fp16(h)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num()), device
    changed = not torch.equal(got.nan_to_num(), before.nan_to_num())
    assert changed == (case == "inf") and got.nan_to_num().abs().max().item() <= 65_504
    if device == "cuda":
        assert fp16_guard.fused_available(h) and got.data_ptr() == h.data_ptr()
