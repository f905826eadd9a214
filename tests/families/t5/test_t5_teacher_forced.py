"""The engine's fused T5 encoder and static decoder against Hugging Face, teacher-forced, in fp32, bf16 and
fp16: on the CPU at a small shape, on a GPU (marked ``gpu``) at T5-base's shape with random weights.

Both sides get the same random encoder inputs (with padding) and the same decoder input tokens, so every
position's logits can be compared. The reference is Hugging Face's fp32 forward. Bounds, as the maximum
over all positions of ``|logits - reference|`` (and of the encoder's hidden states) relative to the
reference's largest magnitude:

- fp32: at most 1e-4 (only the summation order differs; PyTorch's default keeps TF32 off);
- bf16 and fp16: at most twice Hugging Face's own error in the same precision plus 1e-3 (the engine's
  rounding is no worse than the library's), and the mean error at most twice Hugging Face's plus 1e-4.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from qace.families.t5.decoder import StaticT5Decoder
from qace.families.t5.encoder import T5Encoder

T5_BASE = dict(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12)
SMALL = dict(vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
CASES = [
    pytest.param("cpu", SMALL, id="cpu-small"),
    pytest.param("cuda", T5_BASE, id="cuda-t5-base", marks=pytest.mark.gpu),
]
ROWS, LENGTH, STEPS = 48, 40, 12


def _model(shape: dict[str, int]) -> T5ForConditionalGeneration:
    """The shape's model with seeded random weights (the same on every call)."""
    torch.manual_seed(0)
    config = T5Config(
        **shape, feed_forward_proj="relu", dropout_rate=0.0, decoder_start_token_id=0, eos_token_id=1,
        pad_token_id=0,
    )  # fmt: skip
    return T5ForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def fp32_model() -> Callable[[str, dict[str, int]], T5ForConditionalGeneration]:
    """A copy of `_model` in fp32 on a device, each shape built once per module: T5-base's random
    initialisation takes seconds on a CPU core, and a case's three precisions start from the same
    weights."""
    built: dict[tuple[str, tuple[tuple[str, int], ...]], T5ForConditionalGeneration] = {}

    def get(device: str, shape: dict[str, int]) -> T5ForConditionalGeneration:
        key = (device, tuple(sorted(shape.items())))
        if key not in built:
            built[key] = _model(shape).to(device)
        return copy.deepcopy(built[key])

    return get


def _inputs(vocab: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, vocab, (ROWS, LENGTH), generator=g)
    lengths = torch.randint(LENGTH // 4, LENGTH + 1, (ROWS,), generator=g)
    lengths[0] = LENGTH
    mask = (torch.arange(LENGTH)[None, :] < lengths[:, None]).long()
    ids = ids * mask
    decoder_ids = torch.randint(2, vocab, (ROWS, STEPS), generator=g)
    decoder_ids[:, 0] = 0  # the decoder start token
    return ids.to(device), mask.to(device), decoder_ids.to(device)


@torch.inference_mode()
def _hugging_face(model, ids, mask, decoder_ids) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    logits = model(encoder_outputs=(hidden,), attention_mask=mask, decoder_input_ids=decoder_ids).logits
    return hidden.float(), logits.float()


@torch.inference_mode()
def _engine(model, ids, mask, decoder_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's encoder, then its decoder's step fed ``decoder_ids`` one position at a time."""
    hidden, hidden_mask = T5Encoder(model)(mask, input_ids=ids)
    decoder = StaticT5Decoder(model, cuda_graphs=False)
    dtype, device = hidden.dtype, hidden.device
    shape = (ROWS, decoder.heads, STEPS, decoder.d_kv)
    keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in decoder.layers]
    values = [torch.zeros(shape, device=device, dtype=dtype) for _ in decoder.layers]
    cross, cross_bias = decoder.cross_cache(hidden), decoder.cross_bias(hidden_mask, dtype)
    self_bias = decoder.self_bias(STEPS, device, dtype)
    logits = [
        decoder.step(
            decoder_ids[:, s], torch.tensor([s], device=device), keys, values, cross, cross_bias, self_bias
        )
        for s in range(STEPS)
    ]
    return hidden.float(), torch.stack(logits, dim=1).float()


def _errors(got: torch.Tensor, want: torch.Tensor, real: torch.Tensor) -> tuple[float, float]:
    """Max and mean absolute error over the ``real`` positions, relative to the reference's max."""
    diff = (got[real] - want[real]).abs()
    scale = float(want[real].abs().max())
    return float(diff.max()) / scale, float(diff.mean()) / scale


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("device", "shape"), CASES)
def test_teacher_forced_logits_match_hugging_face(
    fp32_model, device: str, shape: dict[str, int], dtype
) -> None:
    assert not torch.backends.cuda.matmul.allow_tf32  # PyTorch's default: fp32 products stay fp32
    exact = fp32_model(device, shape)
    ids, mask, decoder_ids = _inputs(shape["vocab_size"], device)
    want_hidden, want_logits = _hugging_face(exact, ids, mask, decoder_ids)
    model = exact if dtype == torch.float32 else copy.deepcopy(exact).to(dtype)
    hidden, logits = _engine(model, ids, mask, decoder_ids)
    assert torch.isfinite(hidden).all() and torch.isfinite(logits).all()
    real, every = mask.bool(), torch.ones(logits.shape[:2], dtype=torch.bool, device=device)
    ours = {"hidden": _errors(hidden, want_hidden, real), "logits": _errors(logits, want_logits, every)}
    if dtype == torch.float32:
        for name, (worst, _) in ours.items():
            assert worst <= 1e-4, (name, worst)
        return
    their_hidden, their_logits = _hugging_face(model, ids, mask, decoder_ids)
    theirs = {
        "hidden": _errors(their_hidden, want_hidden, real),
        "logits": _errors(their_logits, want_logits, every),
    }
    for name in ours:
        (worst, mean), (their_worst, their_mean) = ours[name], theirs[name]
        assert worst <= 2 * their_worst + 1e-3, (name, ours[name], theirs[name])
        assert mean <= 2 * their_mean + 1e-4, (name, ours[name], theirs[name])
