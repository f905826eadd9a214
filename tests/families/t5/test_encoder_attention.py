"""T5 encoder self-attention: the bias table everywhere, the fused Triton kernel against fp64 on a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import T5Config, T5ForConditionalGeneration

from qace.families.t5.encoder_attention import (
    LaunchShape,
    attend_packed,
    fused_available,
    launch_shape,
    relative_bias_table,
)

HEADS, D = 12, 64


def _attention_module(heads: int = HEADS, d_kv: int = D) -> torch.nn.Module:
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=64, d_model=heads * d_kv, d_kv=d_kv, d_ff=64, num_layers=1, num_heads=heads,
        dropout_rate=0.0,
    )  # fmt: skip
    model = T5ForConditionalGeneration(config).eval()
    attention = model.get_encoder().block[0].layer[0].SelfAttention
    with torch.no_grad():  # random biases of a trained model's size, not the initial small ones
        attention.relative_attention_bias.weight.normal_(0.0, 3.0)
    return attention


def test_table_holds_compute_bias_by_relative_position() -> None:
    attention = _attention_module(heads=4, d_kv=8)
    length = 37
    full = attention.compute_bias(length, length)[0]  # (H, L, L)
    table = relative_bias_table(attention, length, torch.device("cpu"))
    assert table.shape == (4, 2 * length - 1) and table.is_contiguous() and table.dtype == full.dtype
    i, j = torch.meshgrid(torch.arange(length), torch.arange(length), indexing="ij")
    assert torch.equal(table[:, j - i + length - 1], full)


def _case(batch: int, length: int, packed: bool, dtype: torch.dtype, seed: int):
    """q/k/v rows as the fused product writes them (a few spare rows after the batch), a key mask with
    a half-padded row and a row without any key, and for packed rows sorted original positions."""
    g = torch.Generator().manual_seed(seed)
    rows = batch * length
    qkv = torch.randn(rows + 5, 3 * HEADS * D, generator=g) * 1.5
    mask = torch.ones(batch, length, dtype=torch.int64)
    mask[1, length // 2 :] = 0
    mask[2] = 0
    original = length + 9 if packed else length
    positions = None
    if packed:
        picks = [torch.randperm(original, generator=g)[:length].sort().values for _ in range(batch)]
        positions = torch.stack(picks)
    return qkv.to("cuda", dtype), mask.cuda(), positions if positions is None else positions.cuda(), original


def _positions(positions, batch: int, length: int, device) -> torch.Tensor:
    return positions if positions is not None else torch.arange(length, device=device).expand(batch, length)


def _reference(qkv, mask, positions, table, batch, length) -> torch.Tensor:
    """The same attention in fp64 on the half inputs: ``(batch * length, heads * d)``, zeros for a row
    without a key."""
    q, k, v = qkv[: batch * length].double().view(batch, length, 3, HEADS, D).permute(2, 0, 3, 1, 4)
    pos = _positions(positions, batch, length, qkv.device)
    relative = pos[:, None, :] - pos[:, :, None] + (table.shape[1] + 1) // 2 - 1  # (B, Lq, Lk)
    bias = table.double()[:, relative].transpose(0, 1)  # (B, H, Lq, Lk)
    scores = (q @ k.transpose(-1, -2) + bias).masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
    o = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v
    return o.transpose(1, 2).reshape(batch * length, HEADS * D)


def _memory_efficient(qkv, mask, positions, table, batch, length) -> torch.Tensor:
    """What the fused encoder ran before the kernel: the bias laid out ``(B, H, L, L)`` in half, padded
    keys at the dtype's minimum, PyTorch's memory-efficient kernel."""
    q, k, v = qkv[: batch * length].view(batch, length, 3, HEADS, D).permute(2, 0, 3, 1, 4)
    pos = _positions(positions, batch, length, qkv.device)
    relative = pos[:, None, :] - pos[:, :, None] + (table.shape[1] + 1) // 2 - 1
    bias = table.float()[:, relative].transpose(0, 1)
    bias = bias + torch.where(mask[:, None, None, :].bool(), 0.0, torch.finfo(qkv.dtype).min)
    bias = F.pad(bias.to(qkv.dtype).contiguous(), (0, -length % 16))[..., :length]
    o = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, False, scale=1.0)[0]
    return o.transpose(1, 2).reshape(batch * length, HEADS * D)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("length", "packed"), [(11, False), (48, True), (70, False), (150, True)])
def test_kernel_is_at_least_as_close_to_fp64_as_the_memory_efficient_kernel(dtype, length, packed) -> None:
    """One or several blocks of keys, packed rows with their original positions' biases: the kernel's
    heads are as close to fp64 on the same inputs as PyTorch's memory-efficient kernel's (the path the
    fused encoder took before); the row without a key gives zeros; rows past the batch stay untouched."""
    batch = 6
    attention = _attention_module().cuda().to(dtype)
    qkv, mask, positions, original = _case(batch, length, packed, dtype, seed=length)
    table = relative_bias_table(attention, original, qkv.device)
    assert fused_available(qkv, D)
    out = torch.full((batch * length + 5, HEADS * D), 7.0, device="cuda", dtype=dtype)
    attend_packed(qkv, out, table, mask, positions, HEADS, D)
    expected = _reference(qkv, mask, positions, table, batch, length)
    has_keys = mask.bool().any(dim=1).repeat_interleave(length)
    kernel_err = (out[: batch * length].double() - expected)[has_keys].abs().max().item()
    efficient = _memory_efficient(qkv, mask, positions, table, batch, length)
    efficient_err = (efficient.double() - expected)[has_keys].abs().max().item()
    assert kernel_err <= efficient_err * 1.05 + 1e-6, (kernel_err, efficient_err)
    assert kernel_err < 0.05
    assert torch.equal(out[: batch * length][~has_keys], torch.zeros_like(out[: batch * length][~has_keys]))
    assert torch.equal(out[batch * length :], torch.full_like(out[batch * length :], 7.0))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape",
    [LaunchShape(32, 32, 2), LaunchShape(64, 32, 4), LaunchShape(32, 128, 8), LaunchShape(128, 64, 8)],
)
def test_every_launch_shape_is_as_close_to_fp64_as_the_default(shape: LaunchShape) -> None:
    """Other blocks of queries and keys and other warps (what `benchmarks.encoder_attention --sweep`
    times): one and several key blocks, packed rows; the heads within 1.05x of the default shape's or
    the memory-efficient kernel's error against fp64 (the larger), the row without a key zeros, the rows
    past the batch untouched."""
    batch, dtype = 6, torch.bfloat16
    attention = _attention_module().cuda().to(dtype)
    for length, packed in ((11, False), (48, True), (150, False)):
        qkv, mask, positions, original = _case(batch, length, packed, dtype, seed=length)
        table = relative_bias_table(attention, original, qkv.device)
        expected = _reference(qkv, mask, positions, table, batch, length)
        has_keys = mask.bool().any(dim=1).repeat_interleave(length)
        efficient = _memory_efficient(qkv, mask, positions, table, batch, length)
        errors = [(efficient.double() - expected)[has_keys].abs().max().item()]
        for chosen in (launch_shape(length), shape):
            out = torch.full((batch * length + 5, HEADS * D), 7.0, device="cuda", dtype=dtype)
            attend_packed(qkv, out, table, mask, positions, HEADS, D, shape=chosen)
            heads = out[: batch * length]
            errors.append((heads.double() - expected)[has_keys].abs().max().item())
            assert torch.equal(heads[~has_keys], torch.zeros_like(heads[~has_keys]))
            assert torch.equal(out[batch * length :], torch.full_like(out[batch * length :], 7.0))
        assert errors[2] <= max(errors[:2]) * 1.05 + 1e-6, (length, errors)


@pytest.mark.gpu
def test_kernel_refuses_rows_it_cannot_address() -> None:
    attention = _attention_module().cuda().half()
    qkv, mask, _, _ = _case(3, 11, False, torch.float16, seed=0)
    table = relative_bias_table(attention, 11, qkv.device)
    out = torch.empty(33, HEADS * D, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="contiguous rows"):
        attend_packed(qkv.t().contiguous().t(), out, table, mask, None, HEADS, D)  # column-major


def test_kernel_runs_only_for_half_cuda_tensors_with_power_of_two_heads() -> None:
    x = torch.zeros(2, 2, dtype=torch.float16)
    assert not fused_available(x, 64)  # CPU
    assert not fused_available(x.float(), 64)
    if torch.cuda.is_available():
        assert not fused_available(x.cuda(), 48) and not fused_available(x.cuda(), 8)
