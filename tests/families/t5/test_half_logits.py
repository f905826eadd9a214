"""The LM head's scale in the product's epilogue gives the logits of scaling the product afterwards."""

from __future__ import annotations

import pytest
import torch

from qace.families.t5.decoder import half_logits


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 24, 300, 2048])
def test_scale_in_the_epilogue_is_bit_equal_to_scaling_after(dtype, rows) -> None:
    g = torch.Generator().manual_seed(rows)
    h = (torch.randn(rows, 768, generator=g) * 4).to("cuda", dtype)
    head = (torch.randn(32128, 768, generator=g) * 0.05).to("cuda", dtype)
    scale = 768**-0.5
    product = torch.mm(h, head.t(), out_dtype=torch.float32)
    assert torch.equal(half_logits(h, head, None), product)
    logits = half_logits(h, head, scale)
    assert logits.dtype == torch.float32
    assert torch.equal(logits, product * scale)
