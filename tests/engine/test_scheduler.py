"""Scheduler: budgets, ordering, de-duplication and padding, on hand-made inputs (no models)."""

from __future__ import annotations

import numpy as np
import pytest

from qace.engine.batches import cut_at_eos
from qace.engine.scheduler import batch_shapes, dedupe, pad_batch, plan_batches


@pytest.mark.parametrize("seed", range(5))
def test_batches_cover_every_item_once_within_budget(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 90, size=500)
    batches = plan_batches(lengths, max_batch_tokens=512, max_batch_rows=32)
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(500))
    for batch in batches:
        assert len(batch) <= 32
        assert len(batch) * lengths[batch].max() <= 512


@pytest.mark.parametrize("seed", range(5))
def test_batch_shapes_bound_every_batch_the_plan_makes(seed):
    """What a warm-up prepares for (`QACE.warm_up`) covers every batch shape of a real plan."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 90, size=2000)
    most = {n: rows for rows, n in batch_shapes(range(1, 90), max_batch_tokens=1024, max_batch_rows=48)}
    batches = plan_batches(lengths, max_batch_tokens=1024, max_batch_rows=48)
    assert all(len(b) <= most[int(lengths[b].max())] for b in batches)
    assert any(len(b) == most[int(lengths[b].max())] for b in batches)  # the bound is reached
    assert batch_shapes([2000], 1024, 48) == [(1, 2000)]  # longer than the budget: a batch of one


def test_batches_are_longest_first_so_padding_is_small():
    lengths = [3, 50, 4, 49, 5, 48]
    batches = plan_batches(lengths, max_batch_tokens=100, max_batch_rows=8)
    assert [b.tolist() for b in batches] == [[1, 3], [5, 4], [2, 0]]


def test_item_longer_than_budget_gets_its_own_batch():
    batches = plan_batches([1000, 2], max_batch_tokens=100, max_batch_rows=8)
    assert [b.tolist() for b in batches] == [[0], [1]]


def test_dedupe_keeps_first_occurrence_and_maps_back():
    unique = dedupe(["b", "a", "b", "c", "a"])
    assert unique.unique == ["b", "a", "c"]
    assert unique.inverse.tolist() == [0, 1, 0, 2, 1]
    assert unique.expand(["B", "A", "C"]) == ["B", "A", "B", "C", "A"]


def test_pad_batch_right_pads_with_mask():
    ids, mask = pad_batch([[5, 6, 1], [7, 1]], pad_id=0)
    assert ids.tolist() == [[5, 6, 1], [7, 1, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]


@pytest.mark.parametrize("seed", range(5))
def test_pad_batch_matches_a_row_by_row_fill(seed):
    rng = np.random.default_rng(seed)
    rows = [rng.integers(1, 500, size=rng.integers(0, 40)).tolist() for _ in range(int(rng.integers(1, 30)))]
    ids, mask = pad_batch(rows, pad_id=3)
    assert ids.shape == mask.shape == (len(rows), max(map(len, rows)))
    for row, got, m in zip(rows, ids, mask, strict=True):
        assert got.tolist() == row + [3] * (ids.shape[1] - len(row))
        assert m.tolist() == [1] * len(row) + [0] * (ids.shape[1] - len(row))
    assert ids.dtype == mask.dtype == np.int64
    empty_ids, empty_mask = pad_batch([], pad_id=0)
    assert empty_ids.shape == empty_mask.shape == (0, 0)


@pytest.mark.parametrize("seed", range(5))
def test_cut_at_eos_keeps_ids_before_the_first_eos(seed):
    rng = np.random.default_rng(seed)
    out = rng.integers(2, 9, size=(50, 12))
    for row in out:  # a decoder writes -1 after the step where the row emitted EOS (id 1)
        end = int(rng.integers(0, 14))
        if end < 12:
            row[end] = 1
            row[end + 1 :] = -1
    expected = []
    for row in out:
        ids = row[row >= 0].tolist()
        expected.append(ids[: ids.index(1)] if 1 in ids else ids)
    assert cut_at_eos(out, eos_id=1) == expected
    assert all(type(i) is int for row in cut_at_eos(out, eos_id=1) for i in row)


def test_cut_at_eos_of_no_rows():
    assert cut_at_eos(np.zeros((0, 5), dtype=np.int64), eos_id=1) == []
