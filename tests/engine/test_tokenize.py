"""Tokenisation fast paths give exactly what Hugging Face's ``__call__`` and ``batch_decode`` give."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from qace.engine.tokenize import decode, token_ids


def _expected(tokenizer, rows):
    return [t.strip() for t in tokenizer.batch_decode(rows, skip_special_tokens=True)]


def test_decode_equals_batch_decode(test_models_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    rng = np.random.default_rng(0)
    texts = ["a young girl in a red dress", "unanswerable", "who sits on the grass ?", "two dogs , a ball"]
    rows = [tokenizer(t)["input_ids"] for t in texts]
    rows += [rng.integers(0, len(tokenizer), size=rng.integers(0, 12)).tolist() for _ in range(200)]
    rows += [[0, 1, 2], []]  # only special tokens; nothing at all
    assert not tokenizer.clean_up_tokenization_spaces  # so this takes the backend path
    assert decode(tokenizer, rows) == _expected(tokenizer, rows)
    tokenizer.clean_up_tokenization_spaces = True  # a tokenizer that cleans up goes through batch_decode
    assert decode(tokenizer, rows) == _expected(tokenizer, rows)


TEXTS = [
    "answer: a dog  context: A dog runs on the grass . </s>",
    "visual answer: who is wearing a red shirt ?",
    "naïve café in São Paulo, 1,000 people!",
    "",
    "   ",
    "unanswerable",
    "x" * 300,
]


def _tokenizers(test_models_dir):
    yield AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    minilm = pytest.importorskip("qace.kernels.bertscore").default_model_dir()
    if minilm.is_dir():
        yield AutoTokenizer.from_pretrained(minilm)


@pytest.mark.parametrize("special_tokens", [True, False])
def test_token_ids_equal_call(test_models_dir, special_tokens: bool) -> None:
    for tokenizer in _tokenizers(test_models_dir):
        want = tokenizer(TEXTS, add_special_tokens=special_tokens)["input_ids"]
        assert token_ids(tokenizer, TEXTS, special_tokens=special_tokens) == want
    assert token_ids(tokenizer, []) == []


@pytest.mark.parametrize("setting", ["truncation", "padding"])
def test_token_ids_of_a_backend_saved_with_padding_or_truncation(
    test_models_dir, monkeypatch, setting: str
) -> None:
    """A backend that keeps padding or truncation (all-MiniLM-L6-v2 pads to 128 under transformers 5.24)
    still takes the fast path, gives ``__call__``'s ids, and is left as it was."""
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    want = tokenizer(TEXTS)["input_ids"]
    backend = tokenizer.backend_tokenizer
    if setting == "truncation":
        backend.enable_truncation(4)
    else:
        backend.enable_padding(length=64, pad_id=tokenizer.pad_token_id, pad_token=tokenizer.pad_token)
    before = (backend.truncation, backend.padding)

    def no_call(*args, **kwargs):
        raise AssertionError("token_ids went through __call__")

    monkeypatch.setattr(type(tokenizer), "__call__", no_call)
    assert token_ids(tokenizer, TEXTS) == want
    assert token_ids(tokenizer, TEXTS, special_tokens=False) == [x[:-1] for x in want]  # T5: EOS only
    assert (backend.truncation, backend.padding) == before
    assert tokenizer.backend_tokenizer is backend


def test_decode_only_pad_eos_keeps_unknown_tokens() -> None:
    """Spec 2/3: questions and text-QA answers drop ``<pad>``/``</s>`` only; a T5 ``<unk>`` (a character
    outside the vocabulary, here ``狗``) stays in the text. The default drops every special token."""
    from qace.testing.qace_models import build_tokenizer

    tokenizer = build_tokenizer(["a dog runs on the grass"])
    ids = tokenizer("a dog { 狗 runs")["input_ids"]
    assert tokenizer.unk_token_id in ids  # the tokenizer does emit <unk>
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    rows = [[pad, *ids, pad, pad], [pad, eos], [tokenizer.unk_token_id, eos], ids[:-1], np.asarray(ids)]
    kept = decode(tokenizer, rows, only_pad_eos=True)  # rows with and without those ids, and an array
    assert kept == ["a dog { <unk> runs", "", "<unk>", "a dog { <unk> runs", "a dog { <unk> runs"]
    assert decode(tokenizer, rows) == [
        t.strip() for t in tokenizer.batch_decode(rows, skip_special_tokens=True)
    ]
    assert "<unk>" not in decode(tokenizer, rows)[0]
    tokenizer.clean_up_tokenization_spaces = True  # the batch_decode path keeps <unk> as well
    assert decode(tokenizer, rows, only_pad_eos=True)[0].count("<unk>") == 1
