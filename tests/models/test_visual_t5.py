"""Visual-T5: release key layout, 102-position encoder input, question slots, decoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, T5Config

from qace.errors import FeatureError, InputError
from qace.models.visual_inputs import (
    DEFAULT_IMAGE_PREFIX_IDS,
    NUM_REGIONS,
    QUESTION_SLOTS,
    REGION_DIM,
    encoder_length,
    visual_question_inputs,
)
from qace.models.visual_t5 import VisualT5ForConditionalGeneration


def _tiny(**extra: object) -> VisualT5ForConditionalGeneration:
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=1100, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4,
        decoder_start_token_id=0, eos_token_id=1, pad_token_id=0, **extra,
    )  # fmt: skip
    return VisualT5ForConditionalGeneration(config).eval()


def _inputs(batch: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1000, (batch, QUESTION_SLOTS), generator=gen)
    mask = torch.ones(batch, QUESTION_SLOTS, dtype=torch.long)
    ids[-1, 7:] = 0
    mask[-1, 7:] = 0
    feats = torch.rand(batch, NUM_REGIONS, REGION_DIM, generator=gen)
    return ids, mask, feats


def test_img_emb_keys_match_release_layout() -> None:
    state = _tiny().state_dict()
    assert state["encoder.img_emb.weight"].shape == (32, REGION_DIM)
    assert state["encoder.img_emb.bias"].shape == (32,)
    assert [k for k in state if "img_emb" in k] == ["encoder.img_emb.weight", "encoder.img_emb.bias"]


def test_save_load_round_trip_keeps_img_emb_and_prefix(tmp_path) -> None:
    model = _tiny(image_prefix_ids=[5, 6])
    model.save_pretrained(tmp_path)
    loaded, info = VisualT5ForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(loaded.encoder.img_emb.weight, model.encoder.img_emb.weight)
    assert torch.equal(loaded.encoder.img_emb.bias, model.encoder.img_emb.bias)
    assert loaded.prefix_ids == (5, 6)


def test_default_prefix_ids() -> None:
    model = _tiny()
    assert model.prefix_ids == DEFAULT_IMAGE_PREFIX_IDS == (1023, 10)
    assert encoder_length(model.config) == 102


def test_encode_visual_builds_102_positions_and_mask() -> None:
    model = _tiny()
    ids, mask, feats = _inputs()
    with torch.no_grad():
        enc, full_mask = model.encode_visual(ids, mask, feats)
    assert enc.last_hidden_state.shape == (2, 102, 32)
    assert full_mask.shape == (2, 102)
    assert full_mask[0].sum() == 102
    assert full_mask[1].sum() == 7 + 2 + NUM_REGIONS
    assert torch.equal(full_mask[:, QUESTION_SLOTS:], torch.ones(2, 38, dtype=full_mask.dtype))


def test_encoding_for_training_after_scoring_in_inference_mode() -> None:
    """The prefix ids are made once per device; made by a scoring call in inference mode, they still serve
    a training step (an inference tensor cannot be saved for backward)."""
    from qace.models.visual_inputs import _prefix_tensor

    _prefix_tensor.cache_clear()
    model = _tiny()
    ids, mask, feats = _inputs()
    with torch.inference_mode():
        model.encode_visual(ids, mask, feats)
    enc, _ = model.encode_visual(ids, mask, feats)
    enc.last_hidden_state.sum().backward()
    assert model.encoder.img_emb.weight.grad is not None


def test_generate_and_forward_from_encoder_outputs() -> None:
    model = _tiny()
    ids, mask, feats = _inputs()
    with torch.no_grad():
        enc, full_mask = model.encode_visual(ids, mask, feats)
        out = model.generate(
            encoder_outputs=enc, attention_mask=full_mask, max_length=32, num_beams=1, do_sample=False
        )
        logits = model(
            encoder_outputs=enc,
            attention_mask=full_mask,
            decoder_input_ids=torch.zeros(2, 1, dtype=torch.long),
        ).logits
    assert out.shape[0] == 2 and out.shape[1] <= 32
    assert logits.shape == (2, 1, 1100)
    assert torch.allclose(logits[:, 0].argmax(-1), out[:, 1])


def test_shape_errors_are_input_errors() -> None:
    model = _tiny()
    ids, mask, feats = _inputs()
    with pytest.raises(InputError):
        model.encode_visual(ids[:, :10], mask[:, :10], feats)
    with pytest.raises(FeatureError):
        model.encode_visual(ids, mask, feats[:, :35])


def test_question_slots_padding_and_truncation(test_models_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "vqa")
    long_question = " ".join(["girl"] * 100)
    ids, mask, truncated = visual_question_inputs(tokenizer, ["what is the girl wearing ?", long_question])
    assert ids.shape == mask.shape == (2, QUESTION_SLOTS) and ids.dtype == torch.long
    assert truncated == [False, True]
    expected = tokenizer("visual answer: what is the girl wearing ?", add_special_tokens=False)["input_ids"]
    n = len(expected)
    assert ids[0, :n].tolist() == expected and tokenizer.eos_token_id not in ids[0].tolist()
    assert mask[0].sum() == n and ids[0, n:].eq(0).all() and mask[0, n:].eq(0).all()
    assert mask[1].sum() == QUESTION_SLOTS


def test_empty_and_string_questions(test_models_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "vqa")
    ids, mask, truncated = visual_question_inputs(tokenizer, [])
    assert ids.shape == (0, QUESTION_SLOTS) and truncated == []
    with pytest.raises(InputError):
        visual_question_inputs(tokenizer, "what is it ?")


def test_test_vqa_model_answers_vary_and_stop(test_models_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "vqa")
    model = VisualT5ForConditionalGeneration.from_pretrained(test_models_dir / "vqa").eval()
    questions = ["what is the girl wearing ?", "where does the dog run ?", "who sits on the grass ?",
                 "what does the man have ?"] * 2  # fmt: skip
    rng = np.random.default_rng(0)
    feats = np.abs(rng.normal(0, 0.3, (len(questions), NUM_REGIONS, REGION_DIM))).astype(np.float32)
    for row in range(len(questions)):
        block = 8 + (row * 5 % 30) * 16
        feats[row, row % NUM_REGIONS, block : block + 16] = 3.0
    ids, mask, _ = visual_question_inputs(tokenizer, questions)
    with torch.no_grad():
        enc, full_mask = model.encode_visual(ids, mask, torch.from_numpy(feats))
        out = model.generate(
            encoder_outputs=enc, attention_mask=full_mask, max_length=32, num_beams=1, do_sample=False
        )
    answers = tokenizer.batch_decode(out, skip_special_tokens=True)
    assert len(set(answers)) >= 3
    for row in out.tolist():
        assert tokenizer.eos_token_id in row and row.index(tokenizer.eos_token_id) < 10
