"""Metric-versus-metric tests and the system/item levels, each against an independent computation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from qace.errors import InputError
from qace.meta.correlation import bootstrap_values, correlate
from qace.meta.levels import item_grouped, permutation_p, system_level
from qace.meta.significance import (
    compare_metrics,
    paired_bootstrap,
    paired_permutation,
    williams_test,
)


def test_williams_worked_example_howell() -> None:
    # Howell, D. C. (2007). Statistical Methods for Psychology, 6th ed., p. 262 (reproduced with the
    # SPSS syntax of B. Weaver, "Williams1959.sps"): r12 = .80, r13 = .72, r23 = .89, n = 26
    # -> t = 1.361 on 23 df, two-sided p = .187. Graham & Baldwin (2014) use this test one-sided.
    t, p = williams_test(0.80, 0.72, 0.89, 26)
    assert t == pytest.approx(1.361, abs=5e-4)
    assert p == pytest.approx(0.187, abs=5e-4)
    t1, p1 = williams_test(0.80, 0.72, 0.89, 26, two_sided=False)
    assert t1 == t and p1 == pytest.approx(p / 2)
    assert williams_test(0.72, 0.80, 0.89, 26)[0] == pytest.approx(-t)


def test_williams_matches_determinant_form() -> None:
    # Independent form: Steiger (1980), eq. 7, with |R| the determinant of the 3 x 3 correlation matrix.
    rng = np.random.default_rng(5)
    data = rng.multivariate_normal(np.zeros(3), [[1, 0.6, 0.4], [0.6, 1, 0.5], [0.4, 0.5, 1]], size=80)
    r = np.corrcoef(data.T)
    n = 80
    det = np.linalg.det(r)
    rbar = (r[0, 1] + r[0, 2]) / 2
    t_ref = (r[0, 1] - r[0, 2]) * np.sqrt(
        (n - 1) * (1 + r[1, 2]) / (2 * (n - 1) / (n - 3) * det + rbar**2 * (1 - r[1, 2]) ** 3)
    )
    t, p = williams_test(r[0, 1], r[0, 2], r[1, 2], n)
    assert t == pytest.approx(t_ref, rel=1e-12)
    assert p == pytest.approx(2 * stats.t.sf(abs(t_ref), n - 3), rel=1e-12)
    # compare_metrics runs it on Pearson r of the data: human = column 0
    (cmp,) = compare_metrics({"a": data[:, 1], "b": data[:, 2]}, data[:, 0], "pearson", n_boot=0)
    assert cmp.p_williams == pytest.approx(p, rel=1e-9)
    with pytest.raises(InputError):
        williams_test(0.5, 0.4, 1.2, 30)


@pytest.fixture(scope="module")
def paired() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    n_items, per = 40, 3
    latent = rng.normal(size=n_items * per)
    human = np.round(latent + 0.5 * rng.normal(size=latent.size))
    good = latent + 0.3 * rng.normal(size=latent.size)
    bad = latent + 2.0 * rng.normal(size=latent.size)
    items = np.repeat(np.arange(n_items), per)
    return good, bad, human, items


def test_paired_bootstrap_is_paired_over_items(paired: tuple) -> None:
    good, bad, human, items = paired
    delta, p, lo, hi = paired_bootstrap(good, bad, human, "kendall_b", items, n_boot=300, seed=4)
    want = stats.kendalltau(good, human)[0] - stats.kendalltau(bad, human)[0]
    assert delta == pytest.approx(want, abs=1e-12)
    # the same draws as each metric's own bootstrap: the difference distribution is theirs
    d = bootstrap_values(good, human, "kendall_b", items, 300, seed=4) - bootstrap_values(
        bad, human, "kendall_b", items, 300, seed=4
    )
    assert (lo, hi) == pytest.approx(tuple(np.quantile(d, [0.025, 0.975])), abs=1e-12)
    assert p == pytest.approx((1 + np.sum(np.abs(d - want) >= abs(want) - 1e-12)) / 301)
    assert 0 < lo and p < 0.01
    # compare_metrics reuses one bootstrap per metric when all are defined on the same rows: same answer
    (cmp,) = compare_metrics({"good": good, "bad": bad}, human, "kendall_b", items, n_boot=300, seed=4)
    assert (cmp.delta, cmp.p_bootstrap, cmp.ci_low, cmp.ci_high) == pytest.approx(
        (delta, p, lo, hi), abs=1e-12
    )
    same = paired_bootstrap(good, good, human, "spearman", items, n_boot=50)
    assert same[0] == 0 and same[1] == 1.0


def test_paired_permutation(paired: tuple) -> None:
    good, bad, human, items = paired
    delta, p = paired_permutation(good, bad, human, "kendall_c", items, n_perm=200, seed=1)
    assert delta > 0 and p == pytest.approx(1 / 201)
    # two noisy copies of one metric are exchangeable: no evidence either way
    rng = np.random.default_rng(9)
    a, b = good + rng.normal(size=good.size), good + rng.normal(size=good.size)
    assert paired_permutation(a, b, human, "kendall_c", items, n_perm=200)[1] > 0.05


def test_compare_metrics_pairs_and_missing(paired: tuple) -> None:
    good, bad, human, items = paired
    third = good.copy()
    third[:5] = np.nan
    out = compare_metrics(
        {"good": good, "bad": bad, "third": third}, human, "spearman", items, n_boot=30, n_perm=30
    )
    assert [(c.a, c.b) for c in out] == [("good", "bad"), ("good", "third"), ("bad", "third")]
    assert out[1].n == good.size - 5 and np.isnan(out[0].p_williams)
    assert out[0].to_dict()["p_bootstrap"] == out[0].p_bootstrap


def _brute_permutation_p(x: np.ndarray, y: np.ndarray, fn) -> float:  # noqa: ANN001
    obs = abs(fn(x, y))
    vals = [abs(fn(x, y[list(p)])) for p in itertools.permutations(range(y.size))]
    return float(np.mean(np.array(vals) >= obs - 1e-12))


def test_exact_permutation_p_against_brute_force_scipy() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=6), rng.normal(size=6)
    y[2] = y[4]  # a tie in y
    for method, fn in (
        ("pearson", lambda a, b: stats.pearsonr(a, b)[0]),
        ("spearman", lambda a, b: stats.spearmanr(a, b)[0]),
        ("kendall_b", lambda a, b: stats.kendalltau(a, b)[0]),
        ("kendall_c", lambda a, b: stats.kendalltau(a, b, variant="c")[0]),
    ):
        p, exact = permutation_p(x, y, method)
        assert exact and p == pytest.approx(_brute_permutation_p(x, y, fn), abs=1e-12), method
    # 4 perfectly ordered systems: only the identity and the reversal reach |tau| = 1 -> 2 / 24
    assert permutation_p(np.arange(4.0), np.arange(4.0), "kendall_b") == (pytest.approx(2 / 24), True)
    big_p, exact = permutation_p(np.arange(12.0), np.arange(12.0), "spearman", n_perm=999)
    assert not exact and big_p == pytest.approx(1 / 1000)


def test_system_level_means_then_correlates() -> None:
    rng = np.random.default_rng(0)
    systems = np.repeat(np.array(["s1", "s2", "s3", "s4", "s5"]), 20)
    quality = np.repeat(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), 20)
    metric = quality + rng.normal(size=100)
    human = quality + rng.normal(size=100)
    items = np.tile(np.arange(20), 5)
    res = system_level(metric, human, systems, "pearson", groups=items, n_boot=50)
    mx = [metric[systems == s].mean() for s in np.unique(systems)]
    my = [human[systems == s].mean() for s in np.unique(systems)]
    assert res.value == pytest.approx(stats.pearsonr(mx, my)[0], abs=1e-12)
    assert res.n == 5 and "few" in res.note and "exact" in res.p_method
    assert res.p_value == pytest.approx(
        _brute_permutation_p(np.array(mx), np.array(my), lambda a, b: stats.pearsonr(a, b)[0])
    )
    assert res.ci_low <= res.value <= res.ci_high
    with pytest.raises(InputError, match="at least 3 systems"):
        system_level(metric, human, np.repeat(["a", "b"], 50), "pearson")


def test_item_grouped_against_a_loop() -> None:
    rng = np.random.default_rng(1)
    items = np.repeat(np.arange(10), 5)
    metric, human = rng.normal(size=50), rng.integers(1, 5, 50).astype(float)
    human[items == 3] = 2.0  # constant within item 3: skipped
    res = item_grouped(metric, human, items, "kendall_b", n_boot=100)
    want = [stats.kendalltau(metric[items == i], human[items == i])[0] for i in range(10) if i != 3]
    assert res.value == pytest.approx(np.mean(want), abs=1e-12)
    assert res.n == 9 and res.n_skipped == 1
    assert res.ci_low <= res.value <= res.ci_high


def test_headline_p_is_scipys_on_independent_units() -> None:
    # Three judgments per caption (Flickr8k layout): the p-value must count captions, not rows.
    rng = np.random.default_rng(7)
    metric = rng.normal(size=200)
    human = np.clip(np.round(metric[:, None] + rng.normal(size=(200, 3))), -2, 2)
    x, y, units = np.repeat(metric, 3), human.reshape(-1), np.repeat(np.arange(200), 3)
    c = correlate(x, y, "kendall_c", units=units)
    assert c.n == 600 and c.n_units == 200
    assert c.p_value == pytest.approx(stats.kendalltau(metric, human.mean(axis=1))[1], rel=1e-9)
    assert c.p_value_rows == pytest.approx(stats.kendalltau(x, y)[1], rel=1e-9)
    assert c.p_value > c.p_value_rows
    # without units each row is its own unit, and the headline is scipy's test, not the t-test
    plain = correlate(x, y, "kendall_c")
    assert plain.p_value == plain.p_value_rows and plain.p_value < plain.p_value_t / 1e6


def test_p_values_below_the_floor_are_one_string_everywhere() -> None:
    from qace.meta.correlation import format_p, p_out

    for tiny in (0.0, 5e-320, 1e-301):  # zero, a denormal, a normal number below the floor
        assert p_out(tiny) == "<1e-300" and format_p(tiny) == "<1e-300" and format_p(p_out(tiny)) == "<1e-300"
    assert p_out(2e-300) == 2e-300 and format_p(2e-300) == "2.0e-300"
    assert p_out(float("nan")) is None and format_p(None) == "–"
    assert format_p(0.0123) == "0.012"


def test_constant_or_empty_scores_are_errors_not_nan() -> None:
    with pytest.raises(InputError, match="constant"):
        correlate([0.5, 0.5, 0.5, 0.5], [1, 2, 3, 4], "kendall_c")
    with pytest.raises(InputError, match="constant"):
        correlate([1, 2, 3, 4], [2, 2, 2, 2], "pearson")
    with pytest.raises(InputError, match="at least 3 finite"):
        correlate([np.nan] * 4, [1, 2, 3, 4], "pearson")
