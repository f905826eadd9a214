"""Summary figures of the report: histograms, and compare mode's paired difference with its interval."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from qace.errors import ConfigError

BOOTSTRAP_SAMPLES = 2000
_BOOTSTRAP_CELLS = 4_000_000
"""Most resampled values drawn at once (memory stays bounded for any number of ids)."""


@dataclass(frozen=True)
class PairedDifference:
    """Mean of ``b - a`` over paired ids, its percentile bootstrap interval, and the win counts."""

    n: int
    mean: float
    low: float
    high: float
    level: float
    b_better: int
    ties: int
    a_better: int


def histogram(values: Sequence[float], bins: int = 20) -> tuple[list[float], list[int]]:
    """Bin edges (``bins + 1``) and counts over the values' range (a unit range around a single value)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return [0.0, 1.0], [0]
    low, high = float(data.min()), float(data.max())
    if low == high:
        low, high = low - 0.5, high + 0.5
    counts, edges = np.histogram(data, bins=bins, range=(low, high))
    return edges.tolist(), counts.tolist()


def paired_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    level: float = 0.95,
    n_boot: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> PairedDifference:
    """``mean(b - a)`` with the percentile interval of ``n_boot`` resamples of ids (deterministic for
    a ``seed``): the difference of two systems' means on the same ids, and how sure it is."""
    if not 0.0 < level < 1.0:
        raise ConfigError(f"confidence level must be in (0, 1), got {level}")
    diff = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    n = diff.size
    if n == 0:
        raise ConfigError("no paired scores to compare")
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    step = max(1, _BOOTSTRAP_CELLS // n)
    for start in range(0, n_boot, step):
        rows = min(step, n_boot - start)
        means[start : start + rows] = diff[rng.integers(0, n, (rows, n))].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return PairedDifference(
        n=n,
        mean=float(diff.mean()),
        low=float(low),
        high=float(high),
        level=level,
        b_better=int((diff > 0).sum()),
        ties=int((diff == 0).sum()),
        a_better=int((diff < 0).sum()),
    )
