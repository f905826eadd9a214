"""Correlation between a metric and human scores, with exact p-values and item-bootstrap intervals.

Kendall tau-c is the headline statistic of the caption-metric literature (Flickr8k-Expert tables
use it) because it is defined for tables that are not square: a continuous metric against a
four-point scale. Tau-b, Spearman and Pearson sit beside it because readers coming from other
fields expect them.

Three p-values are kept, all two-sided tests of "no association":

- ``p_value`` (the headline): scipy's own test of the method (exact or its asymptotic normal
  form for Kendall, the exact t-test for Pearson, the t approximation for Spearman) on the
  *independent units*: when several rows share a unit (the three expert judgments of one
  Flickr8k caption), the unit's rows are averaged first, so 16,992 judgments of 5,664 captions
  count as 5,664 observations, not 16,992.
- ``p_value_rows``: scipy's test on the rows as if independent (what most papers print).
- ``p_value_t``: the Student t-test on the row coefficient, ``t = r sqrt((n-2)/(1-r^2))`` on
  ``n-2`` degrees of freedom, as the QACE paper reports; exact for Pearson only.

Confidence intervals resample *items* (an image with all of its captions and judgments), not
rows, because the rows of one item share its metric scores and its judges. p-values below
``P_FLOOR`` underflow double precision; :func:`p_out` writes them as the string ``"<1e-300"`` in
JSON and Markdown alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
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
DISPLAY = {
    "kendall_c": "Kendall tau-c",
    "kendall_b": "Kendall tau-b",
    "spearman": "Spearman rho",
    "pearson": "Pearson r",
}
#: Smallest p-value printed as a number; smaller ones (denormals, 0.0) are written ``"<1e-300"``.
P_FLOOR = 1e-300
P_FLOOR_TEXT = "<1e-300"


def p_out(p: float | None) -> float | str | None:
    """A p-value for JSON: the number itself, ``"<1e-300"`` below :data:`P_FLOOR`, None if undefined."""
    if p is None or not np.isfinite(p):
        return None
    return P_FLOOR_TEXT if p < P_FLOOR else float(p)


def format_p(p: float | str | None) -> str:
    """A p-value for Markdown, consistent with :func:`p_out` (accepts its output too)."""
    v = p_out(p) if not isinstance(p, str) else p
    if v is None:
        return "–"
    return v if isinstance(v, str) else f"{v:.2g}" if v >= 1e-3 else f"{v:.1e}"


@dataclass(frozen=True)
class Correlation:
    """One coefficient with its tests; ``ci_low``/``ci_high`` are NaN when not bootstrapped.

    ``n`` rows (pairs) were used, grouped into ``n_units`` independent units (the p-value's
    sample) and ``n_items`` resampling items (the bootstrap's).
    """

    method: str
    value: float
    p_value: float
    p_value_rows: float
    p_value_t: float
    ci_low: float
    ci_high: float
    n: int
    n_units: int
    n_items: int
    n_boot: int

    @property
    def p_value_scipy(self) -> float:
        """Deprecated alias of :attr:`p_value_rows` (scipy's test on the rows)."""
        return self.p_value_rows

    def to_dict(self) -> dict:
        out = asdict(self)
        for k in ("p_value", "p_value_rows", "p_value_t"):
            out[k] = p_out(out[k])
        return out


def t_test_p(r: float, n: int) -> float:
    """Two-sided p-value of H0: no association, from the t statistic of coefficient ``r``."""
    if n <= 2 or not np.isfinite(r):
        return float("nan")
    if abs(r) >= 1.0:
        return 0.0
    t = r * np.sqrt((n - 2) / (1.0 - r * r))
    return float(2.0 * stats.t.sf(abs(t), df=n - 2))


def _clean(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, *groupings: np.ndarray | None
) -> tuple[np.ndarray, ...]:
    xa = np.asarray(x, dtype=float).ravel()
    ya = np.asarray(y, dtype=float).ravel()
    if xa.shape != ya.shape:
        raise InputError(f"metric and human scores differ in length ({xa.size} vs {ya.size})")
    ok = np.isfinite(xa) & np.isfinite(ya)
    if ok.sum() < 3:
        raise InputError(f"need at least 3 finite (metric, human) pairs, got {int(ok.sum())}")
    out = [xa[ok], ya[ok]]
    for g in groupings:
        ga = np.arange(xa.size) if g is None else np.asarray(g).ravel()
        if ga.shape != xa.shape:
            raise InputError(f"groups has {ga.size} entries for {xa.size} scores")
        out.append(ga[ok])
    return tuple(out)


def coefficient(x: np.ndarray, y: np.ndarray, method: str) -> tuple[float, float]:
    """(coefficient, scipy p-value) of one method; raises ConfigError on unknown names.

    A constant input has no defined coefficient: that is an InputError, never a NaN.
    """
    if method not in METHODS:
        raise ConfigError(f"unknown correlation {method!r}; choose from {list(METHODS)}")
    for what, v in (("metric", x), ("human", y)):
        if v.size and np.all(v == v[0]):
            raise InputError(
                f"the {what} scores are constant ({v[0]:g} on all {v.size} rows): "
                "no correlation is defined; check the column mapping"
            )
    r, p = METHODS[method](x, y)
    return float(r), float(p)


def resample_rows(groups: np.ndarray, n_boot: int, seed: int = 0) -> Iterator[np.ndarray]:
    """``n_boot`` bootstrap resamples of whole groups, as arrays of row indices.

    Each resample draws as many groups as there are, with replacement, and keeps all of their
    rows. Deterministic for a given ``seed``; the same ``groups`` and ``seed`` give the same
    draws, so statistics of several metrics computed on them are paired.
    """
    _, inverse = np.unique(np.asarray(groups), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        pick = rng.integers(0, counts.size, counts.size)
        lens = counts[pick]
        # Row k of the resample is offset (k - first row of its group) into its group's block.
        first = np.repeat(np.cumsum(lens) - lens, lens)
        yield order[np.repeat(starts[pick], lens) + np.arange(lens.sum()) - first]


def safe_coefficient(x: np.ndarray, y: np.ndarray, method: str) -> float:
    """The coefficient on the finite pairs, NaN where undefined (for resamples, not for reports)."""
    if method not in METHODS:
        raise ConfigError(f"unknown correlation {method!r}; choose from {list(METHODS)}")
    return fast_coefficients(x, y, [method])[method]


def percentile_ci(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of bootstrap ``values`` (undefined resamples ignored)."""
    if not 0.0 < level < 1.0:
        raise ConfigError(f"confidence level must be in (0, 1), got {level}")
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return float("nan"), float("nan")
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(finite, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


#: Up to this many distinct values in one variable, Kendall's S is counted level pair by level pair.
_FEW_LEVELS = 16


def _kendall_s(
    x: np.ndarray,
    y: np.ndarray,
    levels: tuple[np.ndarray, np.ndarray],
    other_levels: tuple[np.ndarray, np.ndarray],
) -> float | None:
    """Kendall's ``S`` (concordant minus discordant pairs) when ``y`` or ``x`` has few levels, else None.

    ``levels``/``other_levels``: (inverse, counts) of ``np.unique`` of ``y``/``x``. For levels
    ``a < b`` of the few-level variable, a pair across them is concordant when the other
    variable is larger at ``b``: ``S = sum over a < b of #(u_a < u_b) - #(u_a > u_b)``, counted
    with binary searches in the sorted values of the other variable.
    """
    for (inv, counts), other in ((levels, x), (other_levels, y)):
        if counts.size <= _FEW_LEVELS:
            order = np.argsort(inv, kind="stable")
            bounds = np.concatenate([[0], np.cumsum(counts)])
            groups = [np.sort(other[order[bounds[k] : bounds[k + 1]]]) for k in range(counts.size)]
            s = 0
            for a in range(counts.size):
                lo = groups[a]
                for b in range(a + 1, counts.size):
                    hi = groups[b]
                    s += int(np.searchsorted(lo, hi, "left").sum())
                    s -= int((lo.size - np.searchsorted(lo, hi, "right")).sum())
            return float(s)
    return None


def fast_coefficients(x: np.ndarray, y: np.ndarray, methods: Sequence[str]) -> dict[str, float]:
    """Every coefficient in ``methods`` of the finite pairs, NaN where undefined, with shared work.

    Equal to scipy's values: Kendall's ``S`` is counted once (by level pairs when one variable
    has few levels, as ratings do; else from scipy's tau-b), and tau-b and tau-c follow as
    ``S / sqrt((n0 - n1)(n0 - n2))`` and ``2 S / (n^2 (m - 1) / m)``; Spearman is Pearson's r
    of the average ranks. One ``np.unique`` per variable serves ties, ranks and levels. For
    resampling loops.
    """
    ok = np.isfinite(x) & np.isfinite(y)
    xa, ya = x[ok], y[ok]
    out = dict.fromkeys(methods, float("nan"))
    if xa.size < 3 or np.all(xa == xa[0]) or np.all(ya == ya[0]):
        return out
    ux = np.unique(xa, return_inverse=True, return_counts=True)[1:]
    uy = np.unique(ya, return_inverse=True, return_counts=True)[1:]
    if "kendall_b" in out or "kendall_c" in out:
        n = xa.size
        n0 = n * (n - 1) / 2
        n1, n2 = ((c * (c - 1) / 2).sum() for _, c in (ux, uy))
        norm_b = np.sqrt((n0 - n1) * (n0 - n2))
        s = _kendall_s(xa, ya, uy, ux)
        if s is None:
            s = float(stats.kendalltau(xa, ya).statistic) * norm_b
        out["kendall_b"] = s / norm_b
        m = min(ux[1].size, uy[1].size)
        out["kendall_c"] = 2 * s / (n * n * (m - 1) / m)
    if "spearman" in out:
        rx, ry = ((np.cumsum(c) - (c - 1) / 2.0)[inv] for inv, c in (ux, uy))
        out["spearman"] = float(np.corrcoef(rx, ry)[0, 1])
    if "pearson" in out:
        out["pearson"] = float(np.corrcoef(xa, ya)[0, 1])
    return {m: float(out[m]) for m in methods}


def bootstrap_all(
    x: np.ndarray,
    y: np.ndarray,
    methods: Sequence[str],
    groups: np.ndarray | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Each method's coefficient on each of ``n_boot`` item resamples (see :func:`resample_rows`)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown correlation(s) {unknown}; choose from {list(METHODS)}")
    xa, ya = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    g = np.arange(xa.size) if groups is None else np.asarray(groups).ravel()
    values = [fast_coefficients(xa[r], ya[r], methods) for r in resample_rows(g, n_boot, seed)]
    return {m: np.array([v[m] for v in values]) for m in methods}


def bootstrap_values(
    x: np.ndarray,
    y: np.ndarray,
    method: str,
    groups: np.ndarray | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> np.ndarray:
    """The coefficient on each of ``n_boot`` item resamples (see :func:`resample_rows`)."""
    return bootstrap_all(x, y, [method], groups, n_boot, seed)[method]


def bootstrap_ci(
    x: np.ndarray,
    y: np.ndarray,
    method: str,
    groups: np.ndarray | None = None,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile interval of ``method`` over ``n_boot`` resamples of whole items.

    ``groups[i]`` names the item row ``i`` belongs to; each resample draws items with
    replacement and keeps all of their rows. Deterministic for a given ``seed``.
    """
    if not 0.0 < level < 1.0:
        raise ConfigError(f"confidence level must be in (0, 1), got {level}")
    xa, ya, g = _clean(x, y, groups)
    return percentile_ci(bootstrap_values(xa, ya, method, g, n_boot, seed), level)


def unit_means(x: np.ndarray, y: np.ndarray, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean ``x`` and mean ``y`` of each unit, units in sorted order."""
    _, inv = np.unique(units, return_inverse=True)
    counts = np.bincount(inv)
    return np.bincount(inv, weights=x) / counts, np.bincount(inv, weights=y) / counts


def correlate(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    method: str = "kendall_c",
    groups: np.ndarray | None = None,
    n_boot: int = 0,
    level: float = 0.95,
    seed: int = 0,
    units: np.ndarray | None = None,
    boot: np.ndarray | None = None,
) -> Correlation:
    """Coefficient, exact and row p-values, and (``n_boot > 0``) an item-bootstrap interval.

    ``groups`` name each row's resampling item (default: the row); ``units`` name each row's
    independent unit for the headline p-value (default: the row; rows of a unit are averaged).
    Non-finite pairs are dropped first, so a metric that failed on a few captions still gets
    a coefficient over the rest (``n`` says how many pairs were used). ``boot``: this method's
    values from :func:`bootstrap_all` on the same rows, when already computed.
    """
    xa, ya, g, u = _clean(x, y, groups, units)
    r, p_rows = coefficient(xa, ya, method)
    n_units = int(np.unique(u).size)
    p = p_rows
    if n_units < xa.size:
        ux, uy = unit_means(xa, ya, u)
        p = coefficient(ux, uy, method)[1] if n_units >= 3 else float("nan")
    lo = hi = float("nan")
    if boot is not None:
        lo, hi = percentile_ci(boot, level)
    elif n_boot > 0:
        lo, hi = percentile_ci(bootstrap_values(xa, ya, method, g, n_boot, seed), level)
    return Correlation(
        method=method,
        value=r,
        p_value=p,
        p_value_rows=p_rows,
        p_value_t=t_test_p(r, xa.size),
        ci_low=lo,
        ci_high=hi,
        n=int(xa.size),
        n_units=n_units,
        n_items=int(np.unique(g).size),
        n_boot=n_boot,
    )


def correlate_all(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    methods: Sequence[str] = tuple(METHODS),
    groups: np.ndarray | None = None,
    n_boot: int = 0,
    level: float = 0.95,
    seed: int = 0,
    units: np.ndarray | None = None,
) -> dict[str, Correlation]:
    """:func:`correlate` for each method, keyed by method name (one bootstrap loop serves all)."""
    xa, ya, g = _clean(x, y, groups)
    boots = bootstrap_all(xa, ya, methods, g, n_boot, seed) if n_boot > 0 else {}
    return {
        m: correlate(
            x, y, m, groups=groups, n_boot=n_boot, level=level, seed=seed, units=units, boot=boots.get(m)
        )
        for m in methods
    }


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
