"""Correlation between a metric and human scores, with p-values and bootstrap intervals.

Kendall tau-c is the headline statistic of the caption-metric literature (Flickr8k-Expert tables
use it) because it is defined for tables that are not square: a continuous metric against a
four-point scale. Tau-b, Spearman and Pearson sit beside it because readers coming from other
fields expect them. The p-value reported first is the Student t-test on the coefficient
(``t = r * sqrt((n - 2) / (1 - r^2))``, ``n - 2`` degrees of freedom), the test the QACE paper
reports; scipy's own p-value (exact or normal approximation, per method) is kept beside it.
Confidence intervals resample *items* (a caption with all of its judgments), not rows, because
the rows of one caption share its metric score and are not independent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from qace.errors import ConfigError, InputError

logger = logging.getLogger(__name__)

#: Correlation methods by name; values are functions returning (coefficient, scipy p-value).
METHODS: dict[str, Callable[[np.ndarray, np.ndarray], tuple[float, float]]] = {
    "kendall_c": lambda x, y: tuple(stats.kendalltau(x, y, variant="c")),  # type: ignore[dict-item]
    "kendall_b": lambda x, y: tuple(stats.kendalltau(x, y, variant="b")),  # type: ignore[dict-item]
    "spearman": lambda x, y: tuple(stats.spearmanr(x, y)),  # type: ignore[dict-item]
    "pearson": lambda x, y: tuple(stats.pearsonr(x, y)),  # type: ignore[dict-item]
}
DISPLAY = {"kendall_c": "Kendall tau-c", "kendall_b": "Kendall tau-b", "spearman": "Spearman rho",
           "pearson": "Pearson r"}


@dataclass(frozen=True)
class Correlation:
    """One coefficient with its tests; ``ci_low``/``ci_high`` are NaN when not bootstrapped."""

    method: str
    value: float
    p_value: float
    p_value_scipy: float
    ci_low: float
    ci_high: float
    n: int
    n_items: int
    n_boot: int

    def to_dict(self) -> dict:
        return asdict(self)


def t_test_p(r: float, n: int) -> float:
    """Two-sided p-value of H0: no association, from the t statistic of coefficient ``r``."""
    if n <= 2 or not np.isfinite(r):
        return float("nan")
    if abs(r) >= 1.0:
        return 0.0
    t = r * np.sqrt((n - 2) / (1.0 - r * r))
    return float(2.0 * stats.t.sf(abs(t), df=n - 2))


def _clean(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
           groups: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xa = np.asarray(x, dtype=float).ravel()
    ya = np.asarray(y, dtype=float).ravel()
    if xa.shape != ya.shape:
        raise InputError(f"metric and human scores differ in length ({xa.size} vs {ya.size})")
    g = np.arange(xa.size) if groups is None else np.asarray(groups).ravel()
    if g.shape != xa.shape:
        raise InputError(f"groups has {g.size} entries for {xa.size} scores")
    ok = np.isfinite(xa) & np.isfinite(ya)
    if ok.sum() < 3:
        raise InputError(f"need at least 3 finite (metric, human) pairs, got {int(ok.sum())}")
    return xa[ok], ya[ok], g[ok]


def coefficient(x: np.ndarray, y: np.ndarray, method: str) -> tuple[float, float]:
    """(coefficient, scipy p-value) of one method; raises ConfigError on unknown names."""
    if method not in METHODS:
        raise ConfigError(f"unknown correlation {method!r}; choose from {list(METHODS)}")
    r, p = METHODS[method](x, y)
    return float(r), float(p)


def bootstrap_ci(
    x: np.ndarray, y: np.ndarray, method: str, groups: np.ndarray | None = None,
    n_boot: int = 1000, level: float = 0.95, seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of ``method`` over ``n_boot`` resamples of whole items.

    ``groups[i]`` names the item row ``i`` belongs to; each resample draws items with
    replacement and keeps all of their rows. Deterministic for a given ``seed``.
    """
    if not 0.0 < level < 1.0:
        raise ConfigError(f"confidence level must be in (0, 1), got {level}")
    xa, ya, g = _clean(x, y, groups)
    _, inverse = np.unique(g, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rng = np.random.default_rng(seed)
    values = np.empty(n_boot)
    for b in range(n_boot):
        pick = rng.integers(0, counts.size, counts.size)
        lens = counts[pick]
        # Row k of the resample is offset (k - first row of its item) into its item's block.
        first = np.repeat(np.cumsum(lens) - lens, lens)
        rows = order[np.repeat(starts[pick], lens) + np.arange(lens.sum()) - first]
        values[b] = coefficient(xa[rows], ya[rows], method)[0]
    alpha = (1.0 - level) / 2.0
    lo, hi = np.nanquantile(values, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def correlate(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, method: str = "kendall_c",
    groups: np.ndarray | None = None, n_boot: int = 0, level: float = 0.95, seed: int = 0,
) -> Correlation:
    """Coefficient, t-test and scipy p-values, and (``n_boot > 0``) a bootstrap interval.

    Non-finite pairs are dropped first, so a metric that failed on a few captions still gets
    a coefficient over the rest (``n`` says how many pairs were used).
    """
    xa, ya, g = _clean(x, y, groups)
    r, p_native = coefficient(xa, ya, method)
    lo = hi = float("nan")
    if n_boot > 0:
        lo, hi = bootstrap_ci(xa, ya, method, g, n_boot=n_boot, level=level, seed=seed)
    return Correlation(method=method, value=r, p_value=t_test_p(r, xa.size), p_value_scipy=p_native,
                       ci_low=lo, ci_high=hi, n=int(xa.size), n_items=int(np.unique(g).size),
                       n_boot=n_boot)


def correlate_all(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
    methods: Sequence[str] = tuple(METHODS), groups: np.ndarray | None = None, n_boot: int = 0,
    level: float = 0.95, seed: int = 0,
) -> dict[str, Correlation]:
    """:func:`correlate` for each method, keyed by method name."""
    return {m: correlate(x, y, m, groups=groups, n_boot=n_boot, level=level, seed=seed) for m in methods}


def expand_judgments(metric: np.ndarray, human: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row per (caption, judgment): the Flickr8k-Expert protocol's 3 x 5,664 = 16,992 pairs.

    Returns (metric repeated per judge, human flattened, item index) with missing judgments dropped.
    """
    h = np.asarray(human, dtype=float)
    if h.ndim == 1:
        h = h[:, None]
    m = np.asarray(metric, dtype=float)
    if m.shape[0] != h.shape[0]:
        raise InputError(f"{m.shape[0]} metric scores for {h.shape[0]} judged captions")
    x = np.repeat(m, h.shape[1])
    y = h.reshape(-1)
    g = np.repeat(np.arange(h.shape[0]), h.shape[1])
    keep = np.isfinite(y)
    return x[keep], y[keep], g[keep]
