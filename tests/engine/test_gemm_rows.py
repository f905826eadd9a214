"""Row counts for products of changing shapes: few of them, and never many more rows than asked."""

from __future__ import annotations

from qace.engine.gemm_rows import FEWEST, STEPS_PER_OCTAVE, padded_rows, row_counts


def test_a_count_grows_by_at_most_one_step_of_its_octave() -> None:
    for n in range(1, 70_000):
        m = padded_rows(n)
        assert n <= m <= max(FEWEST, n + n / STEPS_PER_OCTAVE), n


def test_each_octave_has_at_most_32_counts_and_the_rounding_is_monotone() -> None:
    for octave in range(6, 17):
        counts = [padded_rows(n) for n in range(2**octave + 1, 2 ** (octave + 1) + 1)]
        assert len(set(counts)) <= STEPS_PER_OCTAVE, octave
        assert counts == sorted(counts)
        assert all(padded_rows(m) == m for m in counts)  # a padded count stays as it is
    assert {padded_rows(n) for n in range(1, FEWEST + 1)} == {FEWEST}


def test_row_counts_are_every_padded_count_up_to_the_bound() -> None:
    for up_to in (1, 64, 65, 1000, 4096, 20_001):
        counts = row_counts(up_to)
        assert counts == sorted({padded_rows(n) for n in range(1, up_to + 1)}), up_to
    assert row_counts(64) == [64] and row_counts(65) == [64, 66]
