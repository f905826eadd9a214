"""One-query T5 attention: the PyTorch form everywhere, the fused Triton kernel against it on a GPU."""

from __future__ import annotations

import pytest
import torch

from qace.families.t5.decode_attention import attend, attend_step, fused_available


def _inputs(rows: int, heads: int, keys: int, dtype: torch.dtype, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, 1, 64, generator=g) * 2
    k = torch.randn(rows, heads, keys, 64, generator=g) * 2
    v = torch.randn(rows, heads, keys, 64, generator=g)
    cross = torch.where(torch.rand(rows, 1, 1, keys, generator=g) < 0.2, torch.finfo(dtype).min, 0.0)
    cross[..., 0] = 0.0  # every row has a key to attend to
    position = torch.randn(1, heads, 1, keys, generator=g) * 3
    return [t.to(device, dtype) for t in (q, k, v, cross, position)]


def _reference(q, k, v, bias) -> torch.Tensor:
    """The same attention in fp64: scores, bias, softmax, weighted sum; heads merged."""
    scores = q.double() @ k.double().transpose(-1, -2) + bias.double()
    o = torch.softmax(scores, dim=-1) @ v.double()
    return o.transpose(1, 2).reshape(q.shape[0], 1, -1)


def _hugging_face_half(q, k, v, bias) -> torch.Tensor:
    """Hugging Face's T5 attention in half precision: half scores, fp32 softmax rounded to half."""
    scores = torch.matmul(q, k.transpose(-1, -2)) + bias
    o = torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)
    return o.transpose(1, 2).reshape(q.shape[0], 1, -1)


def test_pytorch_form_merges_heads_in_order() -> None:
    q, k, v, cross, position = _inputs(5, 3, 7, torch.float32, "cpu")
    assert not fused_available(q)
    for bias in (cross, position):
        out = attend(q, k, v, bias)
        assert out.shape == (5, 1, 3 * 64)
        torch.testing.assert_close(out.double(), _reference(q, k, v, bias), atol=1e-5, rtol=1e-5)
    # head 1 of row 2 is columns 64..127 of that row
    alone = attend(q[2:3, 1:2], k[2:3, 1:2], v[2:3, 1:2], cross[2:3])
    torch.testing.assert_close(alone[0, 0], attend(q, k, v, cross)[2, 0, 64:128])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("keys", [8, 31, 48, 112])
def test_fused_kernel_is_at_least_as_close_as_the_half_pytorch_form(dtype, keys) -> None:
    q, k, v, cross, position = _inputs(300, 12, keys, dtype, "cuda", seed=keys)
    assert fused_available(q)
    window = k[:, :, : keys - 3]  # a window of a cache: strided, not contiguous
    for args in ((q, k, v, cross), (q, k, v, position), (q, window, v[:, :, : keys - 3], position[..., :-3])):
        expected = _reference(*args)
        fused = attend(*args)
        half = _hugging_face_half(*args)
        fused_err = (fused.double() - expected).abs().max().item()
        half_err = (half.double() - expected).abs().max().item()
        assert fused.dtype == dtype and fused.shape == expected.shape
        assert fused_err <= half_err * 1.01 + 1e-6, (fused_err, half_err)
    # masked keys are not read: NaN there changes nothing
    hidden = cross.expand(-1, 12, -1, -1).transpose(2, 3) == torch.finfo(dtype).min
    k_nan, v_nan = k.masked_fill(hidden, float("nan")), v.masked_fill(hidden, float("nan"))
    assert torch.equal(attend(q, k_nan, v_nan, cross), attend(q, k, v, cross))


@pytest.mark.gpu
def test_fused_kernel_reads_a_stacked_cache_past_two_billion_elements() -> None:
    """The decoder's cross-attention keys and values are views of one buffer holding every layer's
    (`StaticT5Decoder.cross_views`): at 2,048 rows of 64 positions of T5-base its rows start past
    element 2**31, where 32-bit offsets would wrap. The last layer's view reads what a copy reads."""
    from transformers import T5Config, T5ForConditionalGeneration

    from qace.families.t5.decoder import StaticT5Decoder

    config = T5Config(
        d_model=768, d_kv=64, num_heads=12, num_layers=1, num_decoder_layers=12, vocab_size=8,
        decoder_start_token_id=0, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    with torch.device("cuda"):  # random weights, unused here: made on the GPU, not a CPU core (seconds)
        model = T5ForConditionalGeneration(config)
    decoder = StaticT5Decoder(model.to(torch.bfloat16))
    rows, length = 2048, 64
    buffer = torch.randn(rows, length, 2 * 12 * 768, device="cuda", dtype=torch.bfloat16)
    assert buffer.numel() > 2**31
    k, v = decoder.cross_views(buffer)[-1]
    q = torch.randn(rows, 12, 1, 64, device="cuda", dtype=torch.bfloat16)
    bias = torch.zeros(rows, 1, 1, length, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(attend(q, k, v, bias), attend(q, k.contiguous(), v.contiguous(), bias))


def _step_inputs(rows: int, dtype: torch.dtype, device: str, pos: int, window: int):
    """A decoding step's self-attention as the decoder makes it: q/k/v views of one fused projection, a
    window of a 31-position cache, the future masked; the cache past ``pos`` holds NaN (never written)."""
    g = torch.Generator().manual_seed(pos)
    heads, d = 12, 64
    qkv = (torch.randn(rows, 1, 3 * heads * d, generator=g) * 2).to(device, dtype)
    q, k, v = qkv.view(rows, 1, -1, d).transpose(1, 2).chunk(3, dim=1)
    cache = (torch.randn(2, rows, heads, 31, d, generator=g) * 2).to(device, dtype)
    cache[:, :, :, pos:] = float("nan")
    bias = (torch.randn(1, heads, 1, 31, generator=g) * 3).to(device, dtype)
    bias[..., pos + 1 :] = torch.finfo(dtype).min
    return q, k, v, cache[0, :, :, :window], cache[1, :, :, :window], bias[..., :window]


def test_attend_step_writes_the_step_into_the_cache_then_attends() -> None:
    q, k, v, keys, values, bias = _step_inputs(5, torch.float32, "cpu", pos=3, window=8)
    keys[:, :, 4:], values[:, :, 4:] = 0.0, 0.0  # the PyTorch form reads every position
    before = keys.clone()
    out = attend_step(q, k, v, keys, values, torch.tensor([3]), bias)
    assert torch.equal(keys[:, :, 3:4], k) and torch.equal(values[:, :, 3:4], v)
    assert torch.equal(keys[:, :, :3], before[:, :, :3])
    torch.testing.assert_close(out.double(), _reference(q, keys, values, bias), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("pos", "window"), [(0, 8), (5, 8), (9, 16), (30, 31)])
def test_fused_step_equals_copying_then_attending(dtype, pos, window) -> None:
    """The fused kernel's write and attention equal two index copies and the fused attention, bit for
    bit, and it reads no position past ``pos`` (NaN there)."""
    q, k, v, keys, values, bias = _step_inputs(300, dtype, "cuda", pos, window)
    assert fused_available(q)
    where = torch.tensor([pos], device="cuda")
    keys_copy, values_copy = keys.clone(), values.clone()
    keys_copy.index_copy_(2, where, k)
    values_copy.index_copy_(2, where, v)
    expected = attend(q, keys_copy, values_copy, bias)  # NaN past pos: masked, so not read
    out = attend_step(q, k, v, keys, values, where, bias)
    assert torch.equal(out, expected)
    assert torch.equal(keys[:, :, : pos + 1], keys_copy[:, :, : pos + 1])
    assert torch.equal(values[:, :, : pos + 1], values_copy[:, :, : pos + 1])
    assert not out.isnan().any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ended_rows_read_nothing_and_leave_the_others_unchanged(dtype) -> None:
    q, k, v, cross, _ = _inputs(300, 12, 48, dtype, "cuda", seed=7)
    ended = torch.rand(300, device="cuda") < 0.4
    k_nan = k.masked_fill(ended[:, None, None, None], float("nan"))
    v_nan = v.masked_fill(ended[:, None, None, None], float("nan"))
    out = attend(q, k_nan, v_nan, cross, ended)
    assert torch.equal(out[~ended], attend(q, k, v, cross)[~ended])
    assert torch.equal(out[ended], torch.zeros_like(out[ended]))
    step = _step_inputs(300, dtype, "cuda", pos=9, window=16)
    where = torch.tensor([9], device="cuda")
    plain = attend_step(*(t.clone() for t in step[:5]), where, step[5])
    skipped = attend_step(*step[:5], where, step[5], ended)
    assert torch.equal(skipped[~ended], plain[~ended])
    assert torch.equal(skipped[ended], torch.zeros_like(skipped[ended]))
