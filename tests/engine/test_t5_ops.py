"""The half-precision building blocks compute what Hugging Face's T5 modules compute."""

from __future__ import annotations

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from qace.engine.t5_ops import FeedForward, add_linear_, rms_norm


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
