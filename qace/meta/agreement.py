"""Reliability of human judgments: kappas, Krippendorff's alpha, percent agreement, gamma.

All functions take ratings as an (items, judges) array with NaN for a missing judgment, the
layout of a judgement file. Kappa and alpha measure whether judges give the *same* level;
Goodman-Kruskal gamma measures whether they *order* items the same way. Ordinal caption
ratings often disagree in level (one expert is harsher) while covarying almost perfectly, so
the report shows both kinds side by side.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from qace.errors import ConfigError, InputError
from qace.meta.scales import readings

logger = logging.getLogger(__name__)

ALPHA_LEVELS = ("nominal", "ordinal", "interval", "ratio")
#: Figures that are raw proportions (no chance correction): no scale reading applies.
_PROPORTIONS = {"percent_agreement"}
KAPPA_WEIGHTS = (None, "linear", "quadratic")


def _ratings(ratings: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    r = np.asarray(ratings, dtype=float)
    if r.ndim != 2 or r.shape[1] < 2:
        raise InputError(f"ratings must be (items, judges) with at least 2 judges, got shape {r.shape}")
    return r


def category_counts(
    ratings: np.ndarray, categories: Sequence[float] | np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(items x categories) count table and the sorted categories; NaN judgments are not counted."""
    r = _ratings(ratings)
    cats = np.unique(r[np.isfinite(r)]) if categories is None else np.asarray(categories, dtype=float)
    counts = np.stack([(r == c).sum(axis=1) for c in cats], axis=1)
    return counts, cats


def fleiss_kappa(ratings: np.ndarray, categories: Sequence[float] | np.ndarray | None = None) -> float:
    """Fleiss' (1971) kappa for any number of judges; items with < 2 judgments are skipped.

    With equal judges per item this is exactly Fleiss' formula; with unequal numbers each
    item's observed agreement uses its own judge count.
    """
    counts, _ = category_counts(ratings, categories)
    m = counts.sum(axis=1)
    counts, m = counts[m >= 2], m[m >= 2]
    if m.size == 0:
        raise InputError("no item has two or more judgments")
    p_obs = ((counts * (counts - 1)).sum(axis=1) / (m * (m - 1))).mean()
    p_cat = counts.sum(axis=0) / m.sum()
    p_exp = float((p_cat**2).sum())
    if p_exp >= 1.0:
        return float("nan")
    return float((p_obs - p_exp) / (1.0 - p_exp))


def cohen_kappa(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    weights: str | None = None,
    categories: Sequence[float] | np.ndarray | None = None,
) -> float:
    """Cohen's (1960) kappa between two judges; ``weights`` "linear"/"quadratic" for ordinal scales.

    Weighted kappa (Cohen 1968) penalises a 1-vs-4 disagreement more than a 3-vs-4 one, with
    disagreement weights |i - j| or (i - j)^2 over category *positions*.
    """
    if weights not in KAPPA_WEIGHTS:
        raise ConfigError(f"unknown kappa weights {weights!r}; choose from {KAPPA_WEIGHTS}")
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise InputError(f"the two judges rated different numbers of items ({x.size} vs {y.size})")
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    cats = np.unique(np.concatenate([x, y])) if categories is None else np.asarray(categories, float)
    k = cats.size
    table = np.zeros((k, k))
    np.add.at(table, (np.searchsorted(cats, x), np.searchsorted(cats, y)), 1.0)
    table /= table.sum()
    pos = np.arange(k, dtype=float)
    if weights is None:
        w = 1.0 - np.eye(k)
    elif weights == "linear":
        w = np.abs(pos[:, None] - pos[None, :])
    else:
        w = (pos[:, None] - pos[None, :]) ** 2
    expected = np.outer(table.sum(axis=1), table.sum(axis=0))
    denom = float((w * expected).sum())
    return float("nan") if denom == 0 else float(1.0 - (w * table).sum() / denom)


def _delta2(values: np.ndarray, totals: np.ndarray, level: str) -> np.ndarray:
    """Squared difference function of Krippendorff's alpha over the observed values."""
    c, k = values[:, None], values[None, :]
    if level == "nominal":
        return (c != k).astype(float)
    if level == "interval":
        return (c - k) ** 2
    if level == "ratio":
        s = c + k
        return np.where(s == 0, 0.0, ((c - k) / np.where(s == 0, 1.0, s)) ** 2)
    # ordinal: squared mass of the categories between c and k, halves at the ends
    cum = np.concatenate([[0.0], np.cumsum(totals)])
    i, j = np.arange(values.size)[:, None], np.arange(values.size)[None, :]
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    between = cum[hi + 1] - cum[lo] - (totals[lo] + totals[hi]) / 2.0
    return between**2


def krippendorff_alpha(ratings: np.ndarray, level: str = "interval") -> float:
    """Krippendorff's alpha (1980; 2011 computing notes) from the coincidence matrix.

    Handles missing judgments; units with fewer than two values are not pairable and are
    skipped. ``level`` picks the difference function: nominal, ordinal, interval or ratio.
    """
    if level not in ALPHA_LEVELS:
        raise ConfigError(f"unknown alpha level {level!r}; choose from {ALPHA_LEVELS}")
    counts, values = category_counts(ratings)
    m = counts.sum(axis=1)
    counts, m = counts[m >= 2].astype(float), m[m >= 2].astype(float)
    if m.size == 0:
        raise InputError("no item has two or more judgments")
    scaled = counts / (m - 1.0)[:, None]
    coincidence = scaled.T @ counts - np.diag(scaled.sum(axis=0))
    totals = coincidence.sum(axis=1)
    n = totals.sum()
    d2 = _delta2(values, totals, level)
    d_obs = (coincidence * d2).sum()
    d_exp = (np.outer(totals, totals) * d2).sum() / (n - 1.0)
    return float("nan") if d_exp == 0 else float(1.0 - d_obs / d_exp)


def percent_agreement(ratings: np.ndarray) -> float:
    """Share of agreeing judge pairs, averaged over items (Fleiss' observed agreement P-bar)."""
    counts, _ = category_counts(ratings)
    m = counts.sum(axis=1)
    counts, m = counts[m >= 2], m[m >= 2]
    return float(((counts * (counts - 1)).sum(axis=1) / (m * (m - 1))).mean())


def goodman_kruskal_gamma(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Goodman & Kruskal's (1954) gamma = (C - D) / (C + D) over item pairs, ties ignored.

    Counts concordant and discordant pairs from the contingency table of the two variables
    (O(#x-values * #y-values) memory), so it suits ratings and metric-versus-rating alike.
    """
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xa.shape != ya.shape:
        raise InputError(f"gamma needs paired scores, got {xa.size} and {ya.size}")
    ok = np.isfinite(xa) & np.isfinite(ya)
    xv, xi = np.unique(xa[ok], return_inverse=True)
    yv, yi = np.unique(ya[ok], return_inverse=True)
    if xv.size * yv.size > 50_000_000:
        raise InputError(f"gamma table would be {xv.size} x {yv.size}; round the scores first")
    table = np.zeros((xv.size, yv.size))
    np.add.at(table, (xi, yi), 1.0)
    # below_left[i, j] = mass at rows < i and columns < j; below_right: rows < i, columns > j.
    cum = table.cumsum(axis=0).cumsum(axis=1)
    below_left = np.zeros_like(table)
    below_left[1:, 1:] = cum[:-1, :-1]
    rows_above = np.zeros_like(table)
    rows_above[1:, :] = table.cumsum(axis=0)[:-1, :]
    below_right = rows_above.sum(axis=1, keepdims=True) - rows_above.cumsum(axis=1)
    concordant = float((table * below_left).sum())
    discordant = float((table * below_right).sum())
    total = concordant + discordant
    return float("nan") if total == 0 else (concordant - discordant) / total


def pairwise(
    ratings: np.ndarray, fn: Callable[[np.ndarray, np.ndarray], float], judges: Sequence[str] | None = None
) -> dict[str, float]:
    """``fn`` for every pair of judges, keyed ``"j1-j2"``, plus their ``"mean"``."""
    r = _ratings(ratings)
    names = list(judges) if judges is not None else [f"j{i + 1}" for i in range(r.shape[1])]
    out = {
        f"{names[i]}-{names[j]}": fn(r[:, i], r[:, j])
        for i, j in itertools.combinations(range(r.shape[1]), 2)
    }
    out["mean"] = float(np.nanmean(list(out.values())))
    return out


@dataclass
class AgreementReport:
    """Every agreement figure of one judged set, with its scale readings."""

    n_items: int
    judges: list[str]
    figures: dict[str, float] = field(default_factory=dict)
    pairwise: dict[str, dict[str, float]] = field(default_factory=dict)

    def readings(self) -> dict[str, dict[str, str]]:
        """Scale readings of every figure and of every pairwise mean (gamma read as a correlation)."""

        def kind(name: str) -> str:
            return "proportion" if name in _PROPORTIONS else "correlation" if name == "gamma" else "agreement"

        out = {k: readings(v, kind(k)) for k, v in self.figures.items()}
        for name, pairs in self.pairwise.items():
            out[f"{name}_mean"] = readings(pairs["mean"], kind(name))
        return out

    def to_dict(self) -> dict:
        return {
            "n_items": self.n_items,
            "judges": self.judges,
            "figures": self.figures,
            "pairwise": self.pairwise,
            "readings": self.readings(),
        }


def agreement_report(ratings: np.ndarray, judges: Sequence[str] | None = None) -> AgreementReport:
    """Fleiss, Krippendorff (3 levels), percent agreement, and pairwise Cohen/weighted/gamma."""
    r = _ratings(ratings)
    names = list(judges) if judges is not None else [f"j{i + 1}" for i in range(r.shape[1])]
    rep = AgreementReport(n_items=int(r.shape[0]), judges=names)
    rep.figures = {
        "fleiss_kappa": fleiss_kappa(r),
        "krippendorff_alpha_nominal": krippendorff_alpha(r, "nominal"),
        "krippendorff_alpha_ordinal": krippendorff_alpha(r, "ordinal"),
        "krippendorff_alpha_interval": krippendorff_alpha(r, "interval"),
        "percent_agreement": percent_agreement(r),
    }
    cats = np.unique(r[np.isfinite(r)])
    rep.pairwise = {
        "cohen_kappa": pairwise(r, lambda a, b: cohen_kappa(a, b, None, cats), names),
        "cohen_kappa_linear": pairwise(r, lambda a, b: cohen_kappa(a, b, "linear", cats), names),
        "cohen_kappa_quadratic": pairwise(r, lambda a, b: cohen_kappa(a, b, "quadratic", cats), names),
        "percent_agreement": pairwise(r, lambda a, b: percent_agreement(np.stack([a, b], 1)), names),
        "gamma": pairwise(r, goodman_kruskal_gamma, names),
    }
    return rep
