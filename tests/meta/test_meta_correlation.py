"""Correlations against scipy and a hand-computed tau-c; bootstrap resamples whole items."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from qace.errors import ConfigError, InputError
from qace.meta.correlation import (
    bootstrap_ci,
    correlate,
    correlate_all,
    expand_judgments,
    t_test_p,
)


@pytest.fixture(scope="module")
def xy() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=300)
    y = np.clip(np.round(x + rng.normal(size=300)), -2, 2)  # ordinal with ties, like ratings
    return x, y


def test_coefficients_match_scipy(xy: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = xy
    got = correlate_all(x, y)
    assert got["kendall_c"].value == pytest.approx(stats.kendalltau(x, y, variant="c")[0], abs=1e-12)
    assert got["kendall_b"].value == pytest.approx(stats.kendalltau(x, y, variant="b")[0], abs=1e-12)
    assert got["spearman"].value == pytest.approx(stats.spearmanr(x, y)[0], abs=1e-12)
    assert got["pearson"].value == pytest.approx(stats.pearsonr(x, y)[0], abs=1e-12)
    assert got["kendall_b"].p_value_scipy == pytest.approx(stats.kendalltau(x, y)[1], rel=1e-9)


def test_tau_c_hand_example() -> None:
    # x = 1..4, y = 1 2 1 2: concordant pairs (1,2) (1,4) (3,4), discordant (2,3); m = 2 rows of y
    # tau-c = 2 (C - D) / (n^2 (m - 1) / m) = 2 * 2 / (16 * 1/2) = 0.5
    assert correlate([1, 2, 3, 4], [1, 2, 1, 2], "kendall_c").value == pytest.approx(0.5)


def test_t_test_equals_pearson_exact_p(xy: tuple[np.ndarray, np.ndarray]) -> None:
    # scipy's Pearson p-value comes from the exact null distribution of r, which is the t-test.
    x, y = xy
    r, p = stats.pearsonr(x, y)
    assert t_test_p(r, x.size) == pytest.approx(p, rel=1e-6)
    assert correlate(x, y, "pearson").p_value == pytest.approx(p, rel=1e-6)
    # textbook: r = 0.5, n = 27 -> t = 0.5 * 5 / sqrt(0.75) = 2.8868 on 25 df
    assert t_test_p(0.5, 27) == pytest.approx(2 * stats.t.sf(2.886751, 25), rel=1e-5)
    assert t_test_p(1.0, 10) == 0.0
    assert np.isnan(t_test_p(0.3, 2))


def test_bootstrap_is_deterministic_and_covers(xy: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = xy
    c = correlate(x, y, "kendall_c", n_boot=200, seed=3)
    again = correlate(x, y, "kendall_c", n_boot=200, seed=3)
    assert (c.ci_low, c.ci_high) == (again.ci_low, again.ci_high)
    assert c.ci_low < c.value < c.ci_high
    assert c.n_boot == 200 and c.n == 300


def test_bootstrap_resamples_items_not_rows() -> None:
    # Every item's rows are identical pairs: resampling items keeps the within-item structure, so
    # an item-level bootstrap of perfectly monotone data always yields tau = 1.
    metric = np.arange(50, dtype=float)
    human = np.stack([metric, metric, metric], axis=1)
    x, y, g = expand_judgments(metric, human)
    assert x.size == 150 and np.array_equal(g, np.repeat(np.arange(50), 3))
    lo, hi = bootstrap_ci(x, y, "kendall_b", groups=g, n_boot=50)
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.0)


def test_expand_judgments_drops_missing() -> None:
    x, y, g = expand_judgments(np.array([0.1, 0.2]), np.array([[1, np.nan], [3, 4]]))
    assert x.tolist() == [0.1, 0.2, 0.2] and y.tolist() == [1, 3, 4] and g.tolist() == [0, 1, 1]


def test_non_finite_pairs_dropped_and_errors() -> None:
    c = correlate([1, 2, np.nan, 4, 5], [1, 2, 3, 5, 4], "spearman")
    assert c.n == 4
    with pytest.raises(InputError):
        correlate([1, 2], [1, 2])
    with pytest.raises(InputError):
        correlate([1, 2, 3], [1, 2])
    with pytest.raises(ConfigError):
        correlate([1, 2, 3], [1, 2, 3], "kendall_z")


def test_fast_coefficients_equal_scipy(xy: tuple[np.ndarray, np.ndarray]) -> None:
    from qace.meta.correlation import METHODS, fast_coefficients

    x, y = xy
    rng = np.random.default_rng(8)
    cases = [
        (np.round(x, 1), y),  # ties in both; y has 5 levels (counted by level pairs)
        (x, np.round(x + rng.normal(size=x.size), 1)),  # many levels on both sides: scipy's S
        (y, x),
    ]  # the few-level variable first
    for a, b in cases:
        got = fast_coefficients(a, b, list(METHODS))
        assert got["kendall_c"] == pytest.approx(stats.kendalltau(a, b, variant="c")[0], abs=1e-12)
        assert got["kendall_b"] == pytest.approx(stats.kendalltau(a, b, variant="b")[0], abs=1e-12)
        assert got["spearman"] == pytest.approx(stats.spearmanr(a, b)[0], abs=1e-12)
        assert got["pearson"] == pytest.approx(stats.pearsonr(a, b)[0], abs=1e-12)
    assert np.isnan(fast_coefficients(np.ones(5), np.arange(5.0), ["pearson"])["pearson"])


def test_bootstrap_ci_for_every_method_resamples_items() -> None:
    # correlate_all: one bootstrap loop, an interval for each of tau-c, tau-b, Spearman and Pearson
    rng = np.random.default_rng(4)
    metric = rng.normal(size=120)
    human = np.clip(np.round(metric[:, None] + rng.normal(size=(120, 3))), -2, 2)
    x, y, caption = expand_judgments(metric, human)
    images = caption // 4
    got = correlate_all(x, y, groups=images, units=caption, n_boot=200, seed=1)
    for m, c in got.items():
        assert c.ci_low < c.value < c.ci_high, m
        assert c.n_items == 30 and c.n_units == 120 and c.n == 360
        lo, hi = bootstrap_ci(x, y, m, groups=images, n_boot=200, seed=1)
        assert (c.ci_low, c.ci_high) == pytest.approx((lo, hi), abs=1e-12)
