"""The engine's T5 encoder: its fused forward computes what Hugging Face's computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from qace.engine.scheduler import pad_batch
from qace.families.t5.encoder import T5Encoder
from qace.models.loading import load_seq2seq, load_visual_t5
from qace.models.visual_inputs import visual_question_inputs

PROMPTS = [
    "answer: young girl  context: a young girl in a red dress runs on the beach </s>",
    "answer: park  context: two dogs play with a ball in the park </s>",
    "question: who sits on the grass ?  context: a old man in a blue coat sits on the grass </s>",
    "answer: dog  context: a dog </s>",
]


def _batch(tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    ids, mask = pad_batch(tokenizer(PROMPTS)["input_ids"], tokenizer.pad_token_id)
    assert (mask == 0).any()  # padding is part of what is tested
    return torch.from_numpy(ids), torch.from_numpy(mask)


def _hf(model, ids, mask) -> torch.Tensor:
    with torch.inference_mode():
        return model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("gated", [False, True])
def test_fused_forward_equals_hugging_face_in_fp32(gated: bool) -> None:
    """Same weights, same arithmetic: fp32 agrees to rounding (relu and gated-gelu T5s)."""
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=3, num_heads=4,
        feed_forward_proj="gated-gelu" if gated else "relu", dropout_rate=0.0,
    )  # fmt: skip
    model = T5ForConditionalGeneration(config).eval()
    ids = torch.randint(2, 64, (5, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[3, 2:] = 0
    fused, fused_mask = T5Encoder(model, fused=True)(mask, input_ids=ids)
    assert torch.equal(fused_mask, mask)  # the longest row fills the batch: nothing to pack
    want = _hf(model, ids, mask)
    real = mask.bool()
    torch.testing.assert_close(fused[real], want[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("packed", [False, True])
def test_products_on_padded_rows_give_the_same_states(packed: bool) -> None:
    """`few_shapes` runs the products on the tokens plus zero rows up to `padded_rows` (default on a
    GPU): the real tokens' states are those of the unpadded forward, to rounding, packed rows too."""
    torch.manual_seed(0)
    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=3, num_heads=4, dropout_rate=0.0)
    model = T5ForConditionalGeneration(config).eval()
    ids = torch.randint(2, 64, (7, 13))  # 91 tokens: padded to 92 rows; packed, 7 x 8 = 56 -> 64
    mask = torch.ones_like(ids)
    if packed:
        mask[:, 6:] = 0
        mask[2, 4:] = 0
    plain, plain_mask = T5Encoder(model, fused=True, few_shapes=False)(mask, input_ids=ids)
    padded, padded_mask = T5Encoder(model, fused=True, few_shapes=True)(mask, input_ids=ids)
    assert torch.equal(padded_mask, plain_mask) and padded.shape == plain.shape
    assert plain.shape[1] == (8 if packed else 13)
    real = plain_mask.bool()
    torch.testing.assert_close(padded[real], plain[real], rtol=1e-5, atol=1e-6)
    assert not T5Encoder(model, fused=True).few_shapes  # on the CPU, off by default


def test_warm_up_runs_every_padded_row_count_and_changes_nothing(monkeypatch) -> None:
    """The warm-up runs a layer's products at each count `row_counts` gives (the shapes a padded batch
    can meet), with the model's weights, and leaves the encoder's output as it was; an encoder whose
    batches are not padded has nothing to warm."""
    from qace.engine.gemm_rows import row_counts

    torch.manual_seed(0)
    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, dropout_rate=0.0)
    model = T5ForConditionalGeneration(config).eval()
    ids = torch.randint(2, 64, (3, 9))
    mask = torch.ones_like(ids)
    encoder = T5Encoder(model, fused=True, few_shapes=True)
    before, _ = encoder(mask, input_ids=ids)
    rows_seen: list[tuple[int, int]] = []
    linear = torch.nn.functional.linear

    def counting(x, weight, *args):
        rows_seen.append((x.shape[0], weight.shape[0]))
        return linear(x, weight, *args)

    monkeypatch.setattr("qace.families.t5.encoder.F.linear", counting)
    assert encoder.warm_up(300) == len(row_counts(300))
    assert rows_seen == [(rows, 3 * 32) for rows in row_counts(300)]  # q, k and v of every count
    monkeypatch.undo()
    after, _ = encoder(mask, input_ids=ids)
    assert torch.equal(after, before)
    assert T5Encoder(model, fused=True, few_shapes=False).warm_up(300) == 0
    assert T5Encoder(model).warm_up(300) == 0  # fp32 on the CPU: Hugging Face's forward


def test_fp32_models_keep_hugging_faces_forward(test_models_dir) -> None:
    model, tokenizer = load_seq2seq(test_models_dir / "qg", role="qg", dtype=torch.float32)
    encoder = T5Encoder(model)
    assert not encoder.fused
    ids, mask = _batch(tokenizer)
    hidden, hidden_mask = encoder(mask, input_ids=ids)
    assert torch.equal(hidden, _hf(model, ids, mask)) and hidden_mask is mask


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_as_close_to_fp32_as_hugging_faces_half(test_models_dir, dtype, device) -> None:
    """On a GPU, through the memory-efficient kernel; the test prompts' length is not a multiple of 16."""
    exact, tokenizer = load_seq2seq(test_models_dir / "qg", role="qg", dtype=torch.float32, device=device)
    half, _ = load_seq2seq(test_models_dir / "qg", role="qg", dtype=dtype, device=device)
    ids, mask = (t.to(device) for t in _batch(tokenizer))
    assert ids.shape[1] % 16
    real = mask.bool()
    want = _hf(exact, ids, mask)[real]
    encoder = T5Encoder(half)
    assert encoder.fused
    ours = (encoder(mask, input_ids=ids)[0][real].float() - want).abs()
    hf_half = load_seq2seq(test_models_dir / "qg", role="qg", dtype=torch.float32, device=device)[0].to(dtype)
    theirs = (_hf(hf_half, ids, mask)[real].float() - want).abs()
    scale = want.abs().max()
    assert float(ours.max()) <= 2 * float(theirs.max()) + 1e-3 * float(scale)
    assert float(ours.mean()) <= 2 * float(theirs.mean()) + 1e-4 * float(scale)


def test_visual_inputs_pack_their_question_slots_and_encode_as_encode_visual(test_models_dir) -> None:
    """Visual-T5's empty question slots are dropped: each kept position's state equals Hugging Face's
    (relative positions kept), and greedy decoding on the packed states gives the same tokens."""
    from qace.families.t5.decoder import StaticT5Decoder

    model, tokenizer = load_visual_t5(test_models_dir / "vqa", dtype=torch.float32)
    questions = ["what is on the grass ?", "who runs ?", "what does the young girl in a red dress hold ?"]
    ids, mask, _ = visual_question_inputs(tokenizer, questions)
    rng = np.random.default_rng(0)
    features = torch.from_numpy(rng.standard_normal((3, 36, 2054)).astype(np.float32))
    with torch.inference_mode():
        want, want_mask = model.encode_visual(ids, mask, features)
        embeds, full_mask = model.visual_embeds(ids, mask, features)
    assert torch.equal(full_mask, want_mask)
    got, packed_mask = T5Encoder(model, fused=True)(full_mask, inputs_embeds=embeds)
    kept = packed_mask.sum(dim=1)
    assert got.shape[1] < full_mask.shape[1] and got.shape[1] % 8 == 0
    assert torch.equal(kept, full_mask.sum(dim=1))
    for row in range(3):  # row i's kept states, in order, are its unmasked positions' states
        real = full_mask[row].bool()
        torch.testing.assert_close(
            got[row, : kept[row]], want.last_hidden_state[row, real], rtol=1e-5, atol=1e-5
        )
    decoder = StaticT5Decoder(model)
    packed_tokens, packed_an = decoder.generate(got, packed_mask, max_new_tokens=8, unanswerable_id=5)
    full_tokens, full_an = decoder.generate(
        want.last_hidden_state, full_mask, max_new_tokens=8, unanswerable_id=5
    )
    assert torch.equal(packed_tokens, full_tokens)
    torch.testing.assert_close(packed_an, full_an, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_the_runner_sizes_packed_batches_from_the_host_mask(test_models_dir, device) -> None:
    """The runner hands the encoder the longest row's unmasked positions counted on the host, so packing
    never reads the mask back from the device; the states and mask equal those of reading it there."""
    from qace.engine.batches import VisualBatch
    from qace.families import torch_runner
    from qace.families.t5 import T5Encoding

    model, tokenizer = load_visual_t5(test_models_dir / "vqa", dtype=torch.bfloat16, device=device)
    questions = ["what is on the grass ?", "who runs ?", "what does the young girl in a red dress hold ?"]
    ids, mask, _ = visual_question_inputs(tokenizer, questions)
    features = np.random.default_rng(0).standard_normal((3, 36, 2054)).astype(np.float32)
    runner = torch_runner(model, device=device)
    family = runner.encoder
    assert isinstance(family, T5Encoding) and family.encoder.fused
    seen: list[int | None] = []

    def spy(*args, kept=None):
        seen.append(kept)
        return family(*args, kept=kept)

    runner.encoder = spy
    got, got_mask = runner.encode(VisualBatch(ids.numpy(), mask.numpy(), features))
    assert seen == [int(mask.sum(dim=1).max())]
    device_features = torch.from_numpy(features).to(device)
    want, want_mask = family(ids.to(device), mask.to(device), device_features)  # kept read on the device
    assert got.shape[1] < 100 and torch.equal(got_mask, want_mask) and torch.equal(got, want)
