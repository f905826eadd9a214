"""Correlation at three levels: segment (every row), system (means per system), item-grouped.

- Segment level is :func:`qace.meta.correlation.correlate` on the rows.
- System level (:func:`system_level`) averages the metric and the human scores per system and
  correlates the means, as WMT and system-ranking papers do. With few systems the asymptotic
  p-values mean nothing, so the p-value is a permutation test of the system means: exact (all
  ``n!`` orderings) up to :data:`MAX_EXACT_SYSTEMS` systems, Monte Carlo beyond.
- Item-grouped (:func:`item_grouped`) correlates within each item (the captions of one image)
  and averages the per-item coefficients, as several caption-metric papers report; items
  whose metric or human scores are constant within the item have no coefficient and are
  skipped (and counted).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from qace.errors import ConfigError, InputError
from qace.meta.correlation import METHODS, coefficient, p_out, percentile_ci, resample_rows, safe_coefficient

#: Up to this many systems the permutation p-value enumerates every ordering (8! = 40,320).
MAX_EXACT_SYSTEMS = 8
#: Below this many systems the report warns that system-level figures rest on few points.
FEW_SYSTEMS = 10


@dataclass(frozen=True)
class LevelResult:
    """A coefficient at one level; ``p_value`` is NaN where no test applies."""

    level: str
    method: str
    value: float
    p_value: float
    p_method: str
    ci_low: float
    ci_high: float
    n: int
    n_skipped: int
    note: str

    def to_dict(self) -> dict:
        out = asdict(self)
        out["p_value"] = p_out(out["p_value"])
        return out


def _perm_statistic(x: np.ndarray, ys: np.ndarray, method: str) -> np.ndarray:
    """A statistic monotone in ``method``'s coefficient of ``x`` with each row of ``ys``.

    Every row of ``ys`` is a permutation of the same values, so each method's denominator is
    fixed and only its numerator moves: Pearson (Spearman on ranks) sum of centred products,
    Kendall tau-b/tau-c the concordance sum ``S``.
    """
    if method in ("pearson", "spearman"):
        if method == "spearman":
            x = stats.rankdata(x)
            ys = stats.rankdata(ys, axis=1)
        return (ys - ys.mean(axis=1, keepdims=True)) @ (x - x.mean())
    i, j = np.triu_indices(x.size, 1)
    return np.sign(ys[:, i] - ys[:, j]) @ np.sign(x[i] - x[j])


def permutation_p(
    x: np.ndarray, y: np.ndarray, method: str, n_perm: int = 10_000, seed: int = 0
) -> tuple[float, bool]:
    """(two-sided p, exact?) of a permutation test of no association between ``x`` and ``y``.

    Exact over all orderings of ``y`` when ``len(y) <= MAX_EXACT_SYSTEMS``, else ``n_perm``
    random orderings with ``p = (1 + hits) / (1 + n_perm)``.
    """
    if method not in METHODS:
        raise ConfigError(f"unknown correlation {method!r}; choose from {list(METHODS)}")
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    observed = abs(_perm_statistic(xa, ya[None, :], method)[0])
    tol = 1e-9 * max(1.0, observed)
    if xa.size <= MAX_EXACT_SYSTEMS:
        perms = np.array(list(itertools.permutations(range(xa.size))))
        hits = np.sum(np.abs(_perm_statistic(xa, ya[perms], method)) >= observed - tol)
        return float(hits / perms.shape[0]), True
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((n_perm, xa.size)), axis=1)
    hits = np.sum(np.abs(_perm_statistic(xa, ya[perms], method)) >= observed - tol)
    return float((1 + hits) / (1 + n_perm)), False


def _system_means(
    x: np.ndarray, y: np.ndarray, sys_idx: np.ndarray, n_sys: int
) -> tuple[np.ndarray, np.ndarray]:
    counts = np.bincount(sys_idx, minlength=n_sys).astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (
            np.bincount(sys_idx, weights=x, minlength=n_sys) / counts,
            np.bincount(sys_idx, weights=y, minlength=n_sys) / counts,
        )


def system_level(
    x: np.ndarray,
    y: np.ndarray,
    systems: np.ndarray,
    method: str,
    groups: np.ndarray | None = None,
    n_boot: int = 0,
    n_perm: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> LevelResult:
    """Correlation of per-system means of ``x`` and ``y`` (rows with either non-finite dropped).

    The bootstrap (``n_boot``) resamples items (``groups``) and recomputes the system means.
    """
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    s = np.asarray(systems)
    ok = np.isfinite(xa) & np.isfinite(ya)
    names, sys_idx = np.unique(s[ok], return_inverse=True)
    if names.size < 3:
        raise InputError(
            f"system-level correlation needs at least 3 systems, got {names.size}: {list(names)}"
        )
    xa, ya = xa[ok], ya[ok]
    mx, my = _system_means(xa, ya, sys_idx, names.size)
    value = coefficient(mx, my, method)[0]
    p, exact = permutation_p(mx, my, method, n_perm=n_perm, seed=seed)
    lo = hi = float("nan")
    if n_boot > 0:
        g = np.arange(xa.size) if groups is None else np.asarray(groups)[ok]
        vals = []
        for rows in resample_rows(g, n_boot, seed):
            bx, by = _system_means(xa[rows], ya[rows], sys_idx[rows], names.size)
            vals.append(safe_coefficient(bx, by, method))
        lo, hi = percentile_ci(np.array(vals), level)
    kind = (
        f"exact permutation over all {math.factorial(names.size)} orderings"
        if exact
        else (f"Monte Carlo permutation ({n_perm} orderings)")
    )
    note = f"{names.size} systems" + (" (few: read with care)" if names.size < FEW_SYSTEMS else "")
    return LevelResult(
        level="system",
        method=method,
        value=value,
        p_value=p,
        p_method=kind,
        ci_low=lo,
        ci_high=hi,
        n=int(names.size),
        n_skipped=0,
        note=note,
    )


def item_grouped(
    x: np.ndarray,
    y: np.ndarray,
    items: np.ndarray,
    method: str,
    n_boot: int = 0,
    level: float = 0.95,
    seed: int = 0,
) -> LevelResult:
    """Mean over items of the within-item coefficient; the CI resamples the per-item values."""
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    it = np.asarray(items)
    ok = np.isfinite(xa) & np.isfinite(ya)
    names, inv = np.unique(it[ok], return_inverse=True)
    xa, ya = xa[ok], ya[ok]
    order = np.argsort(inv, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(inv, minlength=names.size))])
    per_item = []
    for k in range(names.size):
        rows = order[bounds[k] : bounds[k + 1]]
        if rows.size >= 2:
            per_item.append(safe_coefficient(xa[rows], ya[rows], method))
    values = np.array([v for v in per_item if np.isfinite(v)])
    skipped = names.size - values.size
    if values.size == 0:
        raise InputError(
            f"no item has two or more rows with varying metric and human scores "
            f"({names.size} items): item-grouped correlation is undefined"
        )
    lo = hi = float("nan")
    if n_boot > 0:
        rng = np.random.default_rng(seed)
        boots = values[rng.integers(0, values.size, (n_boot, values.size))].mean(axis=1)
        lo, hi = percentile_ci(boots, level)
    return LevelResult(
        level="item",
        method=method,
        value=float(values.mean()),
        p_value=float("nan"),
        p_method="",
        ci_low=lo,
        ci_high=hi,
        n=int(values.size),
        n_skipped=int(skipped),
        note=f"mean of {values.size} per-item coefficients; {skipped} items skipped "
        "(fewer than 2 rows, or constant metric or human scores within the item)",
    )
