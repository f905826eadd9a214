"""VisCE²'s pure parts on hand-made inputs: prompts, rating parsing, expected rating, batch plans."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from qace.engine.scheduler import plan_batches
from qace.judges import visce2_prompts as prompts
from qace.judges.rating import NumberTokens, expected_rating, parse_rating

CONTRACT = Path(__file__).resolve().parents[3] / "shared" / "docs" / "OTHER_JUDGES.md"


@pytest.mark.skipif(not CONTRACT.is_file(), reason="shared/docs/OTHER_JUDGES.md is not here")
def test_prompts_are_the_papers_verbatim():
    quoted = set(re.findall(r"`([^`]+)`", CONTRACT.read_text()))
    for text in (
        prompts.CONTEXT_PROMPT,
        prompts.DESCRIPTION_PROMPT,
        prompts.RATING_PROMPT,
        prompts.VANILLA_PROMPT,
        prompts.COT_SUFFIX,
    ):
        assert text in quoted


def test_rating_text_fills_caption_and_context_by_variant():
    with_context = prompts.rating_text(prompts.VARIANTS["visce2"], "a {dog}", "Object 1: a dog")
    assert "Candidate caption: a {dog} Use the image" in with_context
    assert "Visual context: Object 1: a dog Your final rating" in with_context
    cot = prompts.rating_text(prompts.VARIANTS["cot"], "a cat", None)
    assert cot.endswith("between 0 and 100. Let's think step by step.")
    assert prompts.VARIANTS["description"].context_prompt == prompts.DESCRIPTION_PROMPT
    with pytest.raises(ValueError, match="visual context"):
        prompts.rating_text(prompts.VARIANTS["visce2"], "a cat", None)


@pytest.mark.parametrize(
    ("text", "value", "span"),
    [
        ("85", 85, (0, 2)),
        ("Rating: 100.", 100, (8, 11)),
        ("I would rate it 7/10", 7, (16, 17)),
        ("2024 was the year; score 64", 64, (25, 27)),
        ("7.5", 7, (0, 1)),
        ("score 007", 7, (6, 9)),
        ("0", 0, (0, 1)),
        ("8450 then 101 then 33", 33, (19, 21)),
    ],
)
def test_parse_rating_takes_the_first_integer_0_to_100(text, value, span):
    parsed = parse_rating(text)
    assert parsed is not None
    assert (parsed.value, (parsed.start, parsed.end)) == (value, span)
    assert text[parsed.start : parsed.end].lstrip("0") == str(value).lstrip("0")


@pytest.mark.parametrize("text", ["", "no number here", "8450", "one hundred", "-", "101 and 999"])
def test_parse_rating_finds_none(text):
    assert parse_rating(text) is None


def _digit_table() -> NumberTokens:
    """Llama-style vocabulary: ``▁`` and the digits 0-9 as single tokens, plus words."""
    tokens = ["<s>", "▁", "▁the", *list("0123456789"), "▁rating", "5a", "▁"]
    return NumberTokens.from_token_strings(tokens)


def test_number_tokens_are_1_to_3_digits_with_or_without_space_markers():
    table = NumberTokens.from_token_strings(["a", "▁7", "Ġ42", "100", "1000", "x1", "٣", None, "07"])
    assert table.ids.tolist() == [1, 2, 3, 8]
    assert table.values.tolist() == [7, 42, 100, 7]
    assert table.digits.tolist() == [1, 2, 3, 2]


def test_expected_rating_digit_wise_for_split_digits():
    table = _digit_table()
    assert table.values.tolist() == list(range(10))
    probs = np.zeros((2, 10))
    probs[0, 8], probs[0, 7] = 0.6, 0.2  # tens: E = (0.6*8 + 0.2*7) / 0.8 = 7.75
    probs[1, 5], probs[1, 0] = 0.5, 0.5  # units: E = 2.5
    assert expected_rating(["8", "5"], probs, table) == pytest.approx(77.5 + 2.5)


def test_expected_rating_one_token_uses_all_values_up_to_100():
    table = NumberTokens.from_token_strings(["▁", "50", "100", "7", "250", "▁90"])
    probs = np.array([[0.2, 0.2, 0.1, 0.4, 0.1]])  # 250 is not a rating: excluded and renormalised
    want = (0.2 * 50 + 0.2 * 100 + 0.1 * 7 + 0.1 * 90) / 0.6
    assert expected_rating(["▁90"], probs, table) == pytest.approx(want)


def test_expected_rating_is_clipped_and_undefined_cases_are_none():
    table = _digit_table()
    probs = np.full((3, 10), 0.1)
    assert expected_rating(["1", "0", "0"], probs, table) == 100.0  # 450 + 45 + 4.5 clipped
    assert expected_rating(["8", "5a"], np.full((2, 10), 0.1), table) is None  # not a number token
    assert expected_rating(["8"], np.zeros((1, 10)), table) is None  # no mass on numbers
    assert expected_rating([], np.zeros((0, 10)), table) is None
    assert expected_rating(["8", "5"], np.full((1, 10), 0.1), table) is None  # shape mismatch


def test_visce2_batches_come_from_the_engine_planner_on_prompt_plus_answer_widths():
    """VisCE² plans on each row's padded width (prompt + new tokens) with the engine's planner: longest
    first, both caps kept, a row over the budget still runs alone."""
    lengths = np.array([10, 50, 30, 50, 20, 40])
    plan = [b.tolist() for b in plan_batches(lengths + 10, 130, 3)]
    assert [i for batch in plan for i in batch] == [1, 3, 5, 2, 4, 0]
    for batch in plan:
        assert len(batch) <= 3
        assert len(batch) * (max(lengths[i] for i in batch) + 10) <= 130 or len(batch) == 1
    assert [b.tolist() for b in plan_batches(np.array([500]) + 10, 100, 8)] == [[0]]
