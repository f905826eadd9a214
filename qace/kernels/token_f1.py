"""SQuAD token F1 between answer pairs (spec section 6, ``F1_i``).

Normalisation stays in Python because it must match the official SQuAD v2 script byte for byte;
the per-pair bag-of-tokens overlap runs in one Numba kernel over CSR-packed integer token ids.
Each distinct string is normalised and tokenised once: QA answers repeat heavily across a corpus,
so string dedup is what makes a million pairs cheap.
"""

from __future__ import annotations

import itertools
import logging
import re
import string
from collections.abc import Sequence

import numba
import numpy as np

from qace.errors import InputError

logger = logging.getLogger(__name__)

__all__ = ["normalize_answer", "token_f1"]

# Same character set as the official script's ``set(string.punctuation)`` (ASCII only).
_PUNCT_TABLE = str.maketrans("", "", string.punctuation)
# Official script: re.compile(r'\b(a|an|the)\b', re.UNICODE), replaced by a single space.
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lowercase, strip ASCII punctuation, drop articles, collapse whitespace (SQuAD v2 eval order).

    The order matters and is the official one: punctuation goes before articles, so "the-cat"
    becomes "thecat" (kept) while "the cat" becomes "cat".
    """
    text = s.lower().translate(_PUNCT_TABLE)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


@numba.njit(cache=True)
def _sort_segments(ids: np.ndarray, offsets: np.ndarray) -> None:
    """Sort each string's token ids in place so pair overlap becomes a linear merge."""
    for i in range(offsets.shape[0] - 1):
        lo, hi = offsets[i], offsets[i + 1]
        if hi - lo > 1:
            ids[lo:hi] = np.sort(ids[lo:hi])


@numba.njit(cache=True)
def _pair_f1(ids: np.ndarray, offsets: np.ndarray, pred: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Bag-of-tokens F1 for each (pred, gold) string-index pair; segments must be sorted.

    Arithmetic mirrors the official script (P = c/|pred|, R = c/|gold|, 2PR/(P+R)) so results are
    bit-identical to it, not merely close.
    """
    n = pred.shape[0]
    out = np.empty(n, dtype=np.float64)
    for k in range(n):
        p_lo, p_hi = offsets[pred[k]], offsets[pred[k] + 1]
        g_lo, g_hi = offsets[gold[k]], offsets[gold[k] + 1]
        n_pred = p_hi - p_lo
        n_gold = g_hi - g_lo
        if n_pred == 0 or n_gold == 0:
            # Official: int(gold_toks == pred_toks); with one side empty that is "both empty".
            out[k] = 1.0 if n_pred == n_gold else 0.0
            continue
        common = 0
        i, j = p_lo, g_lo
        while i < p_hi and j < g_hi:
            if ids[i] == ids[j]:
                common += 1
                i += 1
                j += 1
            elif ids[i] < ids[j]:
                i += 1
            else:
                j += 1
        if common == 0:
            out[k] = 0.0
            continue
        precision = common / n_pred
        recall = common / n_gold
        out[k] = (2.0 * precision * recall) / (precision + recall)
    return out


def _index_strings(a: Sequence[str], b: Sequence[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Map every answer to the index of its distinct string, rejecting non-strings by position."""
    index: dict[str, int] = {}
    both = (*a, *b)
    try:
        pos = np.fromiter((index.setdefault(s, len(index)) for s in both), dtype=np.int64, count=len(both))
        bad = next((k for k, s in enumerate(index) if not isinstance(s, str)), None)
    except TypeError:  # unhashable, so certainly not a str
        bad = -1
    if bad is not None:  # report the first non-string by its position
        k = next(k for k, s in enumerate(both) if not isinstance(s, str))
        side, i = ("a", k) if k < len(a) else ("b", k - len(a))
        raise InputError(f"token_f1: {side}[{i}] is {type(both[k]).__name__}, expected str")
    return list(index), pos[: len(a)], pos[len(a) :]


_SEPARATOR = "\x00"


def _normalized_tokens(strings: list[str]) -> list[list[str]]:
    """``normalize_answer(s).split()`` of every string, the string operations run once on all of them.

    The strings are joined with NUL, which every step treats as the end of a string: it is not cased
    (``lower``'s final-sigma rule stops at it), not punctuation, not a word character (``\\b``) and not
    whitespace. Strings that contain NUL themselves are normalised one by one.
    """
    joined = _SEPARATOR.join(strings)
    if joined.count(_SEPARATOR) != max(len(strings) - 1, 0):
        return [normalize_answer(s).split() for s in strings]
    text = _ARTICLES.sub(" ", joined.lower().translate(_PUNCT_TABLE))
    return [part.split() for part in text.split(_SEPARATOR)]


def _pack_tokens(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Normalise and tokenise each distinct string once; CSR arrays of token ids shared by the batch."""
    tokens = _normalized_tokens(strings)
    vocab: dict[str, int] = {}
    flat = [vocab.setdefault(tok, len(vocab)) for tok in itertools.chain.from_iterable(tokens)]
    offsets = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in tokens], out=offsets[1:])
    return np.asarray(flat, dtype=np.int64), offsets


def token_f1(a: Sequence[str], b: Sequence[str]) -> np.ndarray:
    """SQuAD token F1 of each pair ``(a[i], b[i])``, ``a`` the prediction and ``b`` the gold answer.

    Two answers that both normalise to nothing score 1.0, exactly one empty scores 0.0 (as the
    official script). Returns float64 of length ``len(a)``; deterministic.
    """
    if isinstance(a, str) or isinstance(b, str):
        raise InputError("token_f1: pass sequences of answers, not a single string (wrap it in a list)")
    if len(a) != len(b):
        raise InputError(
            f"token_f1: got {len(a)} predictions but {len(b)} gold answers; pass equal-length lists"
        )
    if len(a) == 0:
        return np.empty(0, dtype=np.float64)
    strings, pred, gold = _index_strings(a, b)
    ids, offsets = _pack_tokens(strings)
    _sort_segments(ids, offsets)
    logger.debug("token_f1: %d pairs, %d distinct strings, %d tokens", len(a), len(strings), ids.size)
    return _pair_f1(ids, offsets, pred, gold)
