"""token_f1 against a line-by-line port of the official SQuAD v2 evaluation script."""

from __future__ import annotations

import collections
import random
import re
import string

import numpy as np
import pytest

from qace.errors import InputError
from qace.kernels.token_f1 import _normalized_tokens, normalize_answer, token_f1


# --- reference: official SQuAD v2 eval script (evaluate-v2.0.py), unchanged logic ---
def squad_normalize_answer(s: str) -> str:
    def remove_articles(text: str) -> str:
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text: str) -> str:
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def squad_get_tokens(s: str) -> list[str]:
    if not s:
        return []
    return squad_normalize_answer(s).split()


def squad_compute_f1(a_gold: str, a_pred: str) -> float:
    gold_toks = squad_get_tokens(a_gold)
    pred_toks = squad_get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


# --- random answer-like strings that stress every normalisation step ---
_WORDS = [
    "a",
    "an",
    "the",
    "The",
    "THE",
    "An",
    "cat",
    "cats",
    "dog",
    "red",
    "Red",
    "two",
    "2",
    "man",
    "woman",
    "théâtre",
    "Über",
    "naïve",
    "東京",
    "кошка",
    "the-cat",
    "a.m.",
    "U.S.",
    "don't",
    "it's",
    "an_apple",
    "theater",
    "another",
    "ana",
    "x",
    "y",
    "y",
    "ß",
    "İstanbul",
    "ǅ",
    "1,000",
    "3.5",
]
_SEPS = [
    " ",
    "  ",
    "\t",
    "\n",
    ",",
    ", ",
    ".",
    "!",
    "?",
    "-",
    "'",
    '"',
    "(",
    ")",
    "\u00a0",
    "\u3000",
    "…",
    "",
]


def _random_answer(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.05:
        return ""
    if roll < 0.10:
        return rng.choice([" ", "...", "the", "a an the", "!?", "\t", "The.", "\u00a0"])
    n = rng.randint(1, 8)
    parts = []
    for _ in range(n):
        parts.append(rng.choice(_WORDS))
        parts.append(rng.choice(_SEPS))
    if rng.random() < 0.1:
        parts.append(rng.choice(string.punctuation))
    return "".join(parts)


def test_matches_official_script_on_random_strings() -> None:
    rng = random.Random(20261126)
    a = [_random_answer(rng) for _ in range(20000)]
    b = [_random_answer(rng) for _ in range(20000)]
    # Force some identical pairs and shared strings, as in real QA output.
    b[::7] = a[::7]
    got = token_f1(a, b)
    want = np.array([squad_compute_f1(gold, pred) for pred, gold in zip(a, b, strict=True)])
    assert got.dtype == np.float64 and got.shape == (len(a),)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # Both extremes and the middle actually occur, so the comparison is not vacuous.
    assert (got == 1.0).any() and (got == 0.0).any() and ((got > 0) & (got < 1)).any()


def test_normalize_matches_official_script() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        s = _random_answer(rng)
        assert normalize_answer(s) == squad_normalize_answer(s), repr(s)


def test_strings_normalised_together_equal_one_by_one() -> None:
    """The batched normalisation (strings joined with NUL) changes nothing, at the edges either:
    final sigma, characters that lower() lengthens, articles and punctuation at both ends, NUL inside."""
    rng = random.Random(11)
    edge = ["ΟΔΟΣ", "ΣΑ", "Σ", "İstanbul", "the", "An", "a.", ".the", "x\na", "", "  ", "Ünïcode’s the ΑΣ"]
    strings = edge + [_random_answer(rng) for _ in range(3000)]
    want = [normalize_answer(s).split() for s in strings]
    assert _normalized_tokens(strings) == want
    with_nul = [*strings, "a\x00the cat"]
    assert _normalized_tokens(with_nul) == [*want, ["\x00", "cat"]]  # falls back to one by one


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("The cat", "a cat", 1.0),
        ("cat sat", "cat sat on the mat", 2 * 1.0 * 0.5 / 1.5),  # P=1, R=2/4
        ("red red dog", "red dog dog", 2 / 3),  # common = {red:1, dog:1} -> P=R=2/3
        ("Paris.", "paris", 1.0),
        ("the-cat", "cat", 0.0),  # punctuation goes first: "thecat" is one token
        ("two dogs", "three cats", 0.0),
        ("an apple", "Apple pie!", 2 * 1.0 * 0.5 / 1.5),
    ],
)
def test_hand_computed(pred: str, gold: str, expected: float) -> None:
    assert token_f1([pred], [gold])[0] == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("", "", 1.0),
        ("the", "a", 1.0),  # both normalise to empty
        ("...", "  ", 1.0),
        ("", "cat", 0.0),
        ("cat", "", 0.0),
        ("an", "dog", 0.0),
    ],
)
def test_empty_rules(pred: str, gold: str, expected: float) -> None:
    assert token_f1([pred], [gold])[0] == expected


def test_symmetric_and_deterministic() -> None:
    rng = random.Random(3)
    a = [_random_answer(rng) for _ in range(2000)]
    b = [_random_answer(rng) for _ in range(2000)]
    first = token_f1(a, b)
    np.testing.assert_array_equal(first, token_f1(a, b))
    np.testing.assert_allclose(first, token_f1(b, a), rtol=0, atol=1e-15)
    # Batch composition does not matter: scoring one pair at a time gives the same bits.
    single = np.array([token_f1([x], [y])[0] for x, y in zip(a[:200], b[:200], strict=True)])
    np.testing.assert_array_equal(first[:200], single)


def test_empty_batch() -> None:
    out = token_f1([], [])
    assert out.dtype == np.float64 and out.shape == (0,)


def test_bad_input() -> None:
    with pytest.raises(InputError, match="2 predictions but 1"):
        token_f1(["a", "b"], ["c"])
    with pytest.raises(InputError, match=r"b\[1\] is NoneType"):
        token_f1(["a", "b"], ["c", None])  # type: ignore[list-item]
    with pytest.raises(InputError, match="single string"):
        token_f1("abc", "abd")
