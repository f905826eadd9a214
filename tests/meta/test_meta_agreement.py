"""Agreement statistics against statsmodels, the krippendorff package and textbook examples."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from statsmodels.stats import inter_rater

from qace.errors import ConfigError, InputError
from qace.meta.agreement import (
    agreement_report,
    cohen_kappa,
    fleiss_kappa,
    goodman_kruskal_gamma,
    krippendorff_alpha,
    pairwise,
    percent_agreement,
)
from qace.meta.scales import landis_koch, reading_text, readings, rosenthal_1996

# Fleiss (1971) as used in the Wikipedia article: 10 subjects, 14 raters, 5 categories, kappa 0.210.
FLEISS_TABLE = np.array(
    [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
)

# Krippendorff (2011) "Computing Krippendorff's alpha-reliability": 4 coders x 12 units, gaps.
NA = np.nan
KRIPP = np.array(
    [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, NA, NA, NA],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NA, 3],
        [NA, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NA],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NA],
    ]
).T  # (units, coders)


def _ratings_from_counts(table: np.ndarray) -> np.ndarray:
    return np.array([np.repeat(np.arange(1, table.shape[1] + 1), row) for row in table], dtype=float)


@pytest.fixture(scope="module")
def random_ratings() -> np.ndarray:
    rng = np.random.default_rng(7)
    truth = rng.integers(1, 5, 400)
    r = np.clip(truth[:, None] + rng.integers(-1, 2, (400, 3)), 1, 4).astype(float)
    r[rng.random(r.shape) < 0.05] = np.nan
    return r


def test_fleiss_textbook_and_statsmodels() -> None:
    ratings = _ratings_from_counts(FLEISS_TABLE)
    assert fleiss_kappa(ratings) == pytest.approx(0.2099, abs=5e-4)
    assert fleiss_kappa(ratings) == pytest.approx(inter_rater.fleiss_kappa(FLEISS_TABLE), abs=1e-12)
    # P-bar, the mean pairwise agreement, is 0.378 in the same example
    assert percent_agreement(ratings) == pytest.approx(0.378, abs=5e-4)


def test_fleiss_on_random_complete_data(random_ratings: np.ndarray) -> None:
    full = random_ratings[np.isfinite(random_ratings).all(axis=1)]
    table, _ = inter_rater.aggregate_raters(full.astype(int))
    assert fleiss_kappa(full) == pytest.approx(inter_rater.fleiss_kappa(table), abs=1e-12)


def test_cohen_textbook() -> None:
    # 50 items: yes/yes 20, yes/no 5, no/yes 10, no/no 15 -> po 0.70, pe 0.50, kappa 0.40
    a = [1] * 25 + [0] * 25
    b = [1] * 20 + [0] * 5 + [1] * 10 + [0] * 15
    assert cohen_kappa(a, b) == pytest.approx(0.4)


@pytest.mark.parametrize("weights", [None, "linear", "quadratic"])
def test_cohen_matches_statsmodels(random_ratings: np.ndarray, weights: str | None) -> None:
    a, b = random_ratings[:, 0], random_ratings[:, 1]
    ok = np.isfinite(a) & np.isfinite(b)
    table = np.zeros((4, 4))
    np.add.at(table, (a[ok].astype(int) - 1, b[ok].astype(int) - 1), 1)
    want = inter_rater.cohens_kappa(table, wt=weights, return_results=False)
    assert cohen_kappa(a, b, weights) == pytest.approx(want, abs=1e-12)


def test_krippendorff_published_example() -> None:
    assert krippendorff_alpha(KRIPP, "nominal") == pytest.approx(0.743, abs=5e-4)
    assert krippendorff_alpha(KRIPP, "interval") == pytest.approx(0.849, abs=5e-4)


@pytest.mark.parametrize("level", ["nominal", "ordinal", "interval", "ratio"])
def test_krippendorff_matches_package(random_ratings: np.ndarray, level: str) -> None:
    krippendorff = pytest.importorskip("krippendorff")
    for data in (KRIPP, random_ratings):
        want = krippendorff.alpha(reliability_data=data.T, level_of_measurement=level)
        assert krippendorff_alpha(data, level) == pytest.approx(want, abs=1e-9)


def test_nominal_alpha_close_to_fleiss_for_large_n(random_ratings: np.ndarray) -> None:
    full = random_ratings[np.isfinite(random_ratings).all(axis=1)]
    assert krippendorff_alpha(full, "nominal") == pytest.approx(fleiss_kappa(full), abs=0.01)


def test_gamma_hand_example() -> None:
    # x 1..4, y 1 3 2 4: 5 concordant pairs, 1 discordant -> (5 - 1) / 6
    assert goodman_kruskal_gamma([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # ties on either side are not counted: 2 concordant, 0 discordant
    assert goodman_kruskal_gamma([1, 1, 2], [1, 2, 3]) == pytest.approx(1.0)
    assert np.isnan(goodman_kruskal_gamma([1, 1, 1], [1, 2, 3]))


def test_gamma_matches_brute_force(random_ratings: np.ndarray) -> None:
    rng = np.random.default_rng(0)
    x = rng.integers(1, 6, 120).astype(float)
    y = np.round(x + rng.normal(size=120) * 2)
    c = d = 0
    for i, j in itertools.combinations(range(x.size), 2):
        s = np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])
        c += s > 0
        d += s < 0
    assert goodman_kruskal_gamma(x, y) == pytest.approx((c - d) / (c + d), abs=1e-12)


def test_pairwise_and_report(random_ratings: np.ndarray) -> None:
    pw = pairwise(random_ratings, goodman_kruskal_gamma, ["a", "b", "c"])
    assert set(pw) == {"a-b", "a-c", "b-c", "mean"}
    assert pw["mean"] == pytest.approx(np.mean([pw["a-b"], pw["a-c"], pw["b-c"]]))
    rep = agreement_report(random_ratings, ["a", "b", "c"]).to_dict()
    assert rep["figures"]["fleiss_kappa"] == pytest.approx(fleiss_kappa(random_ratings))
    # gamma is an association, not agreement: no Krippendorff or Landis-Koch band on it
    assert set(rep["readings"]["gamma_mean"]) == {"rosenthal_1996"}
    assert set(rep["readings"]["fleiss_kappa"]) == {"krippendorff_1980", "landis_koch_1977"}
    assert rep["readings"]["percent_agreement"] == {}


def test_invalid_input() -> None:
    with pytest.raises(InputError):
        fleiss_kappa(np.array([1.0, 2.0]))
    with pytest.raises(ConfigError):
        krippendorff_alpha(KRIPP, "cardinal")
    with pytest.raises(ConfigError):
        cohen_kappa([1, 2], [1, 2], "cubic")


def test_scales() -> None:
    assert landis_koch(0.52) == "moderate" and landis_koch(-0.1) == "poor" and landis_koch(0.2) == "slight"
    assert landis_koch(0.205) == "fair" and landis_koch(0.0) == "slight"
    assert landis_koch(0.81) == "almost perfect"
    assert landis_koch(0.80) == "substantial"
    assert readings(0.70)["krippendorff_1980"] == "tentative conclusions only"
    assert readings(0.80)["krippendorff_1980"] == "reliable"
    assert rosenthal_1996(-0.55) == "large" and rosenthal_1996(0.05) == "very small"
    assert "rosenthal_1996" not in readings(0.5, "agreement")
    assert reading_text(0.9, "proportion") == "not chance-corrected"
    # agreement scales never read a correlation (a metric's tau-c of 0.439 is not "unreliable")
    assert readings(0.439, "correlation") == {"rosenthal_1996": "medium"}
    assert reading_text(0.43, "correlation") == "medium correlation (Rosenthal 1996)"
    assert reading_text(0.43, "agreement") == "KA: unreliable; LK: moderate"
    with pytest.raises(ConfigError):
        readings(0.5, "effect")
