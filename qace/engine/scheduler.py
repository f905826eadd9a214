"""Packing work from many captions into padded batches (no torch here, so it is tested on CPU alone).

CTranslate2's recipe: sort longest first, then cut batches so that rows x padded length stays under a
token budget as well as a row cap. Sorting by length keeps padding small; the budget keeps memory flat
whatever the mix of short and long inputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Deduped(Generic[K]):
    """Unique work items and, for every original item, the index of its unique representative."""

    unique: list[K]
    inverse: np.ndarray

    def expand(self, values: Sequence[object] | np.ndarray) -> list[object]:
        """Results of the unique items mapped back onto the original items, in order."""
        return [values[i] for i in self.inverse]


def dedupe(keys: Sequence[K]) -> Deduped[K]:
    """First-occurrence de-duplication, so identical (question, context) pairs run once."""
    index: dict[K, int] = {}
    inverse = np.empty(len(keys), dtype=np.int64)
    for pos, key in enumerate(keys):
        inverse[pos] = index.setdefault(key, len(index))
    return Deduped(unique=list(index), inverse=inverse)


def plan_batches(
    lengths: Sequence[int] | np.ndarray, max_batch_tokens: int, max_batch_rows: int
) -> list[np.ndarray]:
    """Split items into batches of indices, longest first, each within both budgets.

    A batch's cost is its row count times its longest item (everything is padded to that). An item longer
    than the whole budget still gets a batch of its own rather than being dropped.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = max(int(lengths[order[start]]), 1)
        rows = max(1, min(max_batch_rows, max_batch_tokens // longest))
        batches.append(order[start : start + rows])
        start += rows
    return batches


def batch_shapes(lengths: Iterable[int], max_batch_tokens: int, max_batch_rows: int) -> list[tuple[int, int]]:
    """For each padded length, the most rows `plan_batches` puts in a batch of that length: every
    ``(rows, length)`` it can make has at most these rows (what a warm-up prepares for)."""
    return [(max(1, min(max_batch_rows, max_batch_tokens // max(n, 1))), n) for n in lengths]


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token id lists into ``(ids, attention_mask)`` int64 arrays (filled in one scatter)."""
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    width = int(lengths.max(initial=0))
    mask = np.arange(width)[None, :] < lengths[:, None]
    ids = np.full((len(sequences), width), pad_id, dtype=np.int64)
    flat = itertools.chain.from_iterable(sequences)
    ids[mask] = np.fromiter(flat, dtype=np.int64, count=int(lengths.sum()))
    return ids, mask.astype(np.int64)
