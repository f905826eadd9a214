"""Decoding generated ids: the fast path gives exactly what Hugging Face's batch_decode gives."""

from __future__ import annotations

import numpy as np
from transformers import AutoTokenizer

from qace.engine.tokenize import decode


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
