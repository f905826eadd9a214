"""Read a judge's rating out of generated text, and its probability-weighted expectation.

Pure functions over plain values (no torch), so the rules are tested on hand-made inputs.

**Parsed rating.** The first integer from 0 to 100 in the output: digit runs are read left to right
and the first whose value is at most 100 wins (``"Rating: 85"`` -> 85, ``"2024 ... 7"`` -> 7,
``"7.5"`` -> 7). No such run: no rating (the record is reported, not scored as 0).

**Expected rating.** At the positions where the greedy output wrote that number, the model's
distribution over *number tokens* (tokens whose text is 1-3 digits) gives a smoother score than
the argmax:

- the number is one token (whole-number vocabularies, or a one-digit rating): the expectation of
  the values 0-100 over the number tokens at that position, renormalised over them;
- the number spans several tokens (Llama/LLaVA-1.5 split digits): digit-wise, as FLEUR's score
  smoothing does, ``sum_k E_k * 10**(digits after token k)`` where ``E_k`` is the expectation over the
  number tokens of the same digit count as the greedy token ``k`` (later positions are conditioned
  on the greedy prefix, so this is an approximation of the full expectation, which would need a
  decoding tree). The result is clipped to [0, 100].
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_RATING = 100
_DIGIT_RUN = re.compile(r"\d+")
_NUMBER_TOKEN = re.compile(r"^\d{1,3}$")
_TOKEN_SPACE_MARKERS = "▁Ġ \t\n"
"""Word-boundary markers of SentencePiece (``▁``) and byte-level BPE (``Ġ``) token strings."""


@dataclass(frozen=True)
class ParsedRating:
    """The rating found in a text and where: ``text[start:end]`` are its digits."""

    value: int
    start: int
    end: int


def parse_rating(text: str) -> ParsedRating | None:
    """The first integer 0-100 in ``text`` (see the module docstring), or None."""
    for match in _DIGIT_RUN.finditer(text):
        value = int(match.group())
        if value <= MAX_RATING:
            return ParsedRating(value, match.start(), match.end())
    return None


@dataclass(frozen=True)
class NumberTokens:
    """The vocabulary's number tokens: ids, integer values and digit counts, in matching order."""

    ids: np.ndarray
    values: np.ndarray
    digits: np.ndarray

    @classmethod
    def from_token_strings(cls, tokens: Sequence[str | None]) -> NumberTokens:
        """Pick the number tokens out of ``tokens`` (token strings by id, as ``convert_ids_to_tokens``)."""
        ids, values, digits = [], [], []
        for token_id, token in enumerate(tokens):
            text = (token or "").strip(_TOKEN_SPACE_MARKERS)
            if _NUMBER_TOKEN.match(text) and text.isascii():
                ids.append(token_id)
                values.append(int(text))
                digits.append(len(text))
        return cls(np.asarray(ids, np.int64), np.asarray(values, np.float64), np.asarray(digits, np.int64))

    def __len__(self) -> int:
        return len(self.ids)


def expected_rating(pieces: Sequence[str], probs: np.ndarray, table: NumberTokens) -> float | None:
    """The expected rating over the number tokens (module docstring), or None if it is undefined.

    ``pieces`` are the texts of the greedy tokens that wrote the parsed number, in order, and
    ``probs[k, j]`` is the probability of number token ``table.ids[j]`` at the position of piece ``k``.
    Undefined when a piece is not a pure number token or the model puts no mass on number tokens.
    """
    if not pieces or probs.shape != (len(pieces), len(table)):
        return None
    counts = []
    for piece in pieces:
        text = piece.strip(_TOKEN_SPACE_MARKERS)
        if not _NUMBER_TOKEN.match(text):
            return None
        counts.append(len(text))
    if len(pieces) == 1:
        masks = [table.values <= MAX_RATING]
    else:
        masks = [table.digits == n for n in counts]
    total = 0.0
    remaining = sum(counts)
    for k, mask in enumerate(masks):
        mass = float(probs[k, mask].sum())
        if mass <= 0.0:
            return None
        remaining -= counts[k]
        total += float((probs[k, mask] * table.values[mask]).sum()) / mass * 10.0**remaining
    return float(min(max(total, 0.0), MAX_RATING))
