"""Is metric A's correlation with the humans higher than metric B's? Tests for paired metrics.

Both metrics are correlated with the *same* human scores, so their two coefficients are
dependent and overlap in one variable; comparing their confidence intervals, or testing them as
independent, is wrong. Three tests are offered:

- :func:`williams_test` (Williams 1959; Steiger 1980, eq. 7): the closed-form t-test for two
  dependent Pearson correlations sharing a variable, used for metric comparisons by Graham &
  Baldwin (2014) and the WMT metrics tasks. It assumes Pearson's r on roughly normal data.
- :func:`paired_bootstrap`: resample *items* (all rows of an image together) and look at the
  distribution of the difference of the two coefficients; any method.
- :func:`paired_permutation`: under H0 the two metrics are exchangeable, so for each item either
  keep or swap the two metrics' (standardised) scores, as in Deutsch, Dror & Roth (2021); any
  method.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from qace.errors import ConfigError, InputError
from qace.meta.correlation import (
    bootstrap_all,
    coefficient,
    p_out,
    percentile_ci,
    resample_rows,
    safe_coefficient,
    unit_means,
)


@dataclass(frozen=True)
class Comparison:
    """Metric ``a`` against metric ``b`` on one method: ``delta = r_a - r_b`` and its tests."""

    a: str
    b: str
    method: str
    delta: float
    p_bootstrap: float
    ci_low: float
    ci_high: float
    p_permutation: float
    p_williams: float
    n: int
    n_items: int
    n_boot: int
    n_perm: int

    def to_dict(self) -> dict:
        out = asdict(self)
        for k in ("p_bootstrap", "p_permutation", "p_williams"):
            out[k] = p_out(out[k])
        return out


def williams_test(r12: float, r13: float, r23: float, n: int, two_sided: bool = True) -> tuple[float, float]:
    """Williams' t (df ``n - 3``) for H0: r12 = r13, where variable 1 is shared (the humans).

    ``r12``/``r13``: each metric's correlation with the humans; ``r23``: the metrics' correlation
    with each other; ``n``: the number of observations. Returns (t, p), p two-sided unless
    ``two_sided`` is False (then one-sided for r12 > r13, as Graham & Baldwin 2014 report it).
    """
    if n <= 3:
        raise InputError(f"Williams' test needs more than 3 observations, got {n}")
    for name, r in (("r12", r12), ("r13", r13), ("r23", r23)):
        if not -1.0 <= r <= 1.0:
            raise InputError(f"{name} = {r} is not a correlation")
    det = 1.0 - r12**2 - r13**2 - r23**2 + 2.0 * r12 * r13 * r23
    rbar = (r12 + r13) / 2.0
    denom = 2.0 * (n - 1) / (n - 3) * det + rbar**2 * (1.0 - r23) ** 3
    if denom <= 0:
        return float("nan"), float("nan")
    t = (r12 - r13) * np.sqrt((n - 1) * (1.0 + r23) / denom)
    df = n - 3
    p = 2.0 * stats.t.sf(abs(t), df) if two_sided else stats.t.sf(t, df)
    return float(t), float(p)


def _paired_inputs(
    xa: np.ndarray, xb: np.ndarray, y: np.ndarray, groups: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    a, b, h = (np.asarray(v, dtype=float).ravel() for v in (xa, xb, y))
    if not a.shape == b.shape == h.shape:
        raise InputError(f"paired tests need equal lengths, got {a.size}, {b.size}, {h.size}")
    g = np.arange(a.size) if groups is None else np.asarray(groups).ravel()
    if g.shape != a.shape:
        raise InputError(f"groups has {g.size} entries for {a.size} scores")
    ok = np.isfinite(a) & np.isfinite(b) & np.isfinite(h)
    if ok.sum() < 4:
        raise InputError(
            f"need at least 4 rows where both metrics and the humans are defined, got {ok.sum()}"
        )
    return a[ok], b[ok], h[ok], g[ok]


def paired_bootstrap(
    xa: np.ndarray,
    xb: np.ndarray,
    y: np.ndarray,
    method: str,
    groups: np.ndarray | None = None,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float, float]:
    """(delta, p, ci_low, ci_high) of ``r(a, y) - r(b, y)`` over item resamples (same draws for both).

    p is two-sided, from the bootstrap distribution shifted to the null (Efron & Tibshirani
    1993, sec. 16.4): ``(1 + #{|d_b - delta| >= |delta|}) / (1 + B)``.
    """
    a, b, h, g = _paired_inputs(xa, xb, y, groups)
    delta = coefficient(a, h, method)[0] - coefficient(b, h, method)[0]
    d = np.array(
        [
            safe_coefficient(a[r], h[r], method) - safe_coefficient(b[r], h[r], method)
            for r in resample_rows(g, n_boot, seed)
        ]
    )
    return (delta, *bootstrap_difference(delta, d, level))


def bootstrap_difference(delta: float, d: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(p, ci_low, ci_high) from paired bootstrap differences ``d`` of an observed ``delta``.

    ``d[b]`` must come from resample ``b`` for both metrics (same draws); see :func:`paired_bootstrap`.
    """
    d = d[np.isfinite(d)]
    if d.size == 0:
        return float("nan"), float("nan"), float("nan")
    p = (1 + np.sum(np.abs(d - delta) >= abs(delta) - 1e-12)) / (1 + d.size)
    lo, hi = percentile_ci(d, level)
    return float(min(1.0, p)), lo, hi


def _standardise(v: np.ndarray) -> np.ndarray:
    sd = v.std()
    return (v - v.mean()) / (sd if sd > 0 else 1.0)


def paired_permutation(
    xa: np.ndarray,
    xb: np.ndarray,
    y: np.ndarray,
    method: str,
    groups: np.ndarray | None = None,
    n_perm: int = 1000,
    seed: int = 0,
) -> tuple[float, float]:
    """(delta, p) of a permutation test that swaps the two metrics' scores item by item.

    Scores are z-standardised first so the swapped values are on one scale (rank methods are
    unaffected within a metric). p is two-sided: ``(1 + #{|d_perm| >= |delta|}) / (1 + n_perm)``.
    """
    a, b, h, g = _paired_inputs(xa, xb, y, groups)
    delta = coefficient(a, h, method)[0] - coefficient(b, h, method)[0]
    za, zb = _standardise(a), _standardise(b)
    _, inv = np.unique(g, return_inverse=True)
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(n_perm):
        swap = rng.random(inv.max() + 1)[inv] < 0.5
        pa, pb = np.where(swap, zb, za), np.where(swap, za, zb)
        d = safe_coefficient(pa, h, method) - safe_coefficient(pb, h, method)
        hits += bool(np.isfinite(d) and abs(d) >= abs(delta) - 1e-12)
    return float(delta), float((1 + hits) / (1 + n_perm))


def williams_on_units(a: np.ndarray, b: np.ndarray, h: np.ndarray, units: np.ndarray | None) -> float:
    """Two-sided Williams p of Pearson ``r(a, h)`` vs ``r(b, h)`` over independent units.

    Rows of one unit (the judgments of one caption) are averaged first, so ``n`` is the number
    of units, not of rows.
    """
    if units is not None and np.unique(units).size < a.size:
        ua, uh = unit_means(a, h, units)
        ub, _ = unit_means(b, h, units)
        a, b, h = ua, ub, uh
    return williams_test(
        coefficient(a, h, "pearson")[0],
        coefficient(b, h, "pearson")[0],
        coefficient(a, b, "pearson")[0],
        a.size,
    )[1]


def compare_metrics(
    scores: dict[str, np.ndarray],
    y: np.ndarray,
    method: str,
    groups: np.ndarray | None = None,
    n_boot: int = 1000,
    n_perm: int = 0,
    seed: int = 0,
    names: Sequence[str] | None = None,
    units: np.ndarray | None = None,
) -> list[Comparison]:
    """Every pair (a, b), a before b in ``names``: bootstrap, permutation and Williams tests.

    Resampling and swapping go by ``groups`` (items). Williams' test is a test for Pearson's r:
    it is given for ``method == "pearson"`` only (NaN otherwise), on ``units`` (see
    :func:`williams_on_units`).
    """
    if n_boot < 0 or n_perm < 0:
        raise ConfigError("resample counts must be >= 0")
    order = list(names) if names is not None else list(scores)
    y_arr = np.asarray(y, dtype=float)
    u_all = np.arange(y_arr.size) if units is None else np.asarray(units)
    g_all = np.arange(y_arr.size) if groups is None else np.asarray(groups)
    masks = {n: np.isfinite(np.asarray(scores[n], dtype=float)) & np.isfinite(y_arr) for n in order}
    # Metrics defined on the same rows share one bootstrap each: same draws, so differences are paired.
    shared = n_boot > 0 and all(np.array_equal(masks[n], masks[order[0]]) for n in order)
    boots = (
        {
            n: bootstrap_all(
                np.asarray(scores[n], dtype=float)[masks[n]],
                y_arr[masks[n]],
                [method],
                g_all[masks[n]],
                n_boot,
                seed,
            )[method]
            for n in order
        }
        if shared
        else {}
    )
    out = []
    nan = float("nan")
    for i, na in enumerate(order):
        for nb in order[i + 1 :]:
            ok = masks[na] & masks[nb]
            u = u_all[ok]
            a, b, h, g = _paired_inputs(scores[na], scores[nb], y, groups)
            delta = coefficient(a, h, method)[0] - coefficient(b, h, method)[0]
            pb = lo = hi = nan
            if shared:
                pb, lo, hi = bootstrap_difference(delta, boots[na] - boots[nb])
            elif n_boot:
                delta, pb, lo, hi = paired_bootstrap(a, b, h, method, g, n_boot, seed=seed)
            pp = paired_permutation(a, b, h, method, g, n_perm, seed)[1] if n_perm else nan
            pw = williams_on_units(a, b, h, u) if method == "pearson" else nan
            out.append(
                Comparison(
                    a=na,
                    b=nb,
                    method=method,
                    delta=delta,
                    p_bootstrap=pb,
                    ci_low=lo,
                    ci_high=hi,
                    p_permutation=pp,
                    p_williams=pw,
                    n=int(a.size),
                    n_items=int(np.unique(g).size),
                    n_boot=n_boot,
                    n_perm=n_perm,
                )
            )
    return out
