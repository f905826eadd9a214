"""The two published protocols, and joining ``qace score`` output to their captions.

Flickr8k-Expert: Kendall tau-c between a metric and every expert judgment (each of the three
scores of a caption is its own row). PASCAL-50S: how often a metric prefers the candidate the
majority of voters preferred, per category; a metric tie counts as half right (it is a coin
flip between the two), human ties cannot occur in the released votes but would be skipped.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qace.errors import InputError
from qace.meta.baselines import compute_baselines
from qace.meta.correlation import METHODS, Correlation, bootstrap_all, correlate, expand_judgments
from qace.meta.datasets import PASCAL_CATEGORIES, PASCAL_NUM_REFS, PASCAL_SEEDS, CaptionSet, PairSet

logger = logging.getLogger(__name__)

CATEGORIES = tuple(PASCAL_CATEGORIES.values())
#: Columns of a ``qace score`` file that are bookkeeping, not scores.
NON_SCORE_COLUMNS = {"id", "image_id", "caption", "references", "error", "signature"}


# ---------------------------------------------------------------- score files


def read_score_file(path: Path | str) -> dict[str, dict[str, float]]:
    """``{id: {column: value}}`` for every numeric column of a ``qace score`` JSONL/Parquet file."""
    from qace.meta.datasets import read_records

    out: dict[str, dict[str, float]] = {}
    for n, rec in enumerate(read_records(path)):
        if "id" not in rec:
            raise InputError(f"{path}: row {n} has no 'id' column; score files must carry the export ids")
        row = {}
        for k, v in rec.items():
            if k in NON_SCORE_COLUMNS or isinstance(v, bool):
                continue
            if isinstance(v, int | float):
                row[k] = float(v)
        out[str(rec["id"])] = row
    if not out:
        raise InputError(f"{path}: no rows")
    return out


def join_scores(
    scores: Mapping[str, Mapping[str, float]], ids: Sequence[str], min_coverage: float = 0.5
) -> dict[str, np.ndarray]:
    """Columns of ``scores`` aligned to ``ids`` (NaN where an id is missing).

    Columns covering less than ``min_coverage`` of the ids are dropped: they belong to
    another data set (a file may hold Flickr8k and PASCAL rows together).
    """
    columns = sorted({c for row in scores.values() for c in row})
    out = {}
    for col in columns:
        values = np.array([scores.get(i, {}).get(col, math.nan) for i in ids], dtype=float)
        covered = np.isfinite(values).mean() if len(ids) else 0.0
        if covered >= min_coverage:
            if covered < 1.0:
                logger.warning(
                    "score column %r covers %.1f%% of %d captions; the rest are skipped",
                    col,
                    100 * covered,
                    len(ids),
                )
            out[col] = values
    return out


def pascal_candidate_ids(pairs: PairSet, seed: int | None = None) -> tuple[list[str], list[str]]:
    """Export ids of the two candidates: ``"<pair>-1"``/``"<pair>-2"``, ``"@<seed>"`` appended if given."""
    tail = "" if seed is None else f"@{seed}"
    return [f"{i}-1{tail}" for i in pairs.ids], [f"{i}-2{tail}" for i in pairs.ids]


def join_pascal_scores(
    scores: Mapping[str, Mapping[str, float]], pairs: PairSet, seed: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per column, the (cand1, cand2) scores for ``seed``: seed-tagged ids first, else plain ids."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for tagged in (seed, None):
        ids1, ids2 = pascal_candidate_ids(pairs, tagged)
        s1, s2 = join_scores(scores, ids1), join_scores(scores, ids2)
        for col in s1.keys() & s2.keys():
            out.setdefault(col, (s1[col], s2[col]))
    return out


# ---------------------------------------------------------------- Flickr8k-Expert


def flickr_correlations(
    data: CaptionSet,
    scores: Mapping[str, np.ndarray],
    methods: Sequence[str] = tuple(METHODS),
    n_boot: int = 0,
    boot_methods: Sequence[str] = tuple(METHODS),
    seed: int = 0,
    keep_boot: dict[str, dict[str, np.ndarray]] | None = None,
) -> dict[str, dict[str, Correlation]]:
    """Per metric and method, the correlation with every expert judgment (standard protocol).

    The coefficient pools every (caption, expert) row, as the published tables do. The p-value
    counts captions, not rows (a caption's judgments are averaged first: 5,664 units, not
    16,992); bootstrap intervals (``n_boot``, for ``boot_methods``) resample images with all
    of their captions and judgments; every metric sees the same draws, so ``keep_boot``
    (filled with each metric's bootstrap values when given) serves paired comparisons.
    """
    images = np.unique(np.asarray(data.image_ids), return_inverse=True)[1]
    booted = [m for m in methods if m in boot_methods] if n_boot > 0 else []
    out = {}
    for name, values in scores.items():
        x, y, caption = expand_judgments(values, data.human)
        boots = bootstrap_all(x, y, booted, images[caption], n_boot, seed) if booted else {}
        if keep_boot is not None:
            keep_boot[name] = boots
        out[name] = {
            m: correlate(
                x,
                y,
                m,
                groups=images[caption],
                units=caption,
                n_boot=n_boot if m in boots else 0,
                seed=seed,
                boot=boots.get(m),
            )
            for m in methods
        }
    return out


# ---------------------------------------------------------------- PASCAL-50S


@dataclass(frozen=True)
class PairAccuracy:
    """Accuracy (in %) of one metric per PASCAL-50S category, and their mean.

    ``credit`` holds each pair's credit (1 right, 0 wrong, 0.5 metric tie, NaN unusable), from
    which :func:`pascal_summary` bootstraps intervals; it is not part of :meth:`to_dict`.
    """

    per_category: dict[str, float]
    mean: float
    credit: np.ndarray | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict:
        return {**self.per_category, "mean": self.mean}


def pair_accuracy(pairs: PairSet, score1: np.ndarray, score2: np.ndarray) -> PairAccuracy:
    """Share of pairs where the metric prefers the majority's choice; metric ties count 1/2."""
    s1, s2 = np.asarray(score1, dtype=float), np.asarray(score2, dtype=float)
    if s1.shape != (len(pairs),) or s2.shape != (len(pairs),):
        raise InputError(f"need {len(pairs)} scores per candidate, got {s1.shape} and {s2.shape}")
    human = pairs.majority()
    metric = np.sign(s1 - s2)
    right = np.where(metric == 0, 0.5, (metric == human).astype(float))
    usable = (human != 0) & np.isfinite(s1) & np.isfinite(s2)
    cats = np.asarray(pairs.categories)
    per = {}
    for c in CATEGORIES:
        sel = usable & (cats == c)
        per[c] = float(100.0 * right[sel].mean()) if sel.any() else math.nan
    return PairAccuracy(
        per_category=per, mean=float(np.nanmean(list(per.values()))), credit=np.where(usable, right, np.nan)
    )


def pascal_summary(
    pairs: PairSet, runs: Sequence[PairAccuracy], n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> dict:
    """Mean over seeds, sd over seeds (ddof 1) and a bootstrap interval, per category and overall.

    The interval resamples pairs within each category (stratified, so every category keeps its
    size), averaging each pair's credit over the seeds first; the overall mean is the mean of
    the four category accuracies in each resample. ``n_boot = 0`` gives no interval.
    """
    mean = mean_accuracy(runs).to_dict()
    ddof = 1 if len(runs) > 1 else 0
    sd = {c: float(np.std([r.per_category[c] for r in runs], ddof=ddof)) for c in CATEGORIES}
    sd["mean"] = float(np.std([r.mean for r in runs], ddof=ddof))
    out: dict = {"mean": mean, "sd": sd, "n_seeds": len(runs)}
    if n_boot <= 0 or any(r.credit is None for r in runs):
        return out
    credit = np.nanmean(np.stack([r.credit for r in runs]), axis=0)  # type: ignore[misc]
    cats = np.asarray(pairs.categories)
    rng = np.random.default_rng(seed)
    boots = {}
    for c in CATEGORIES:
        vals = credit[(cats == c) & np.isfinite(credit)]
        boots[c] = (
            100.0 * vals[rng.integers(0, vals.size, (n_boot, vals.size))].mean(axis=1)
            if vals.size
            else np.full(n_boot, np.nan)
        )
    boots["mean"] = np.nanmean(np.stack([boots[c] for c in CATEGORIES]), axis=0)
    alpha = (1.0 - level) / 2.0
    out["ci"] = {k: [float(v) for v in np.nanquantile(b, [alpha, 1.0 - alpha])] for k, b in boots.items()}
    return out


def mean_accuracy(runs: Sequence[PairAccuracy]) -> PairAccuracy:
    """Category-wise mean of several runs (one per reference-sampling seed)."""
    per = {c: float(np.mean([r.per_category[c] for r in runs])) for c in CATEGORIES}
    return PairAccuracy(per_category=per, mean=float(np.mean(list(per.values()))))


def pascal_baselines(
    pairs: PairSet,
    metrics: Sequence[str],
    seeds: Sequence[int] = PASCAL_SEEDS,
    k: int = PASCAL_NUM_REFS,
    cache_dir: Path | str | None = None,
    use_cache: bool = True,
) -> dict[str, dict[int, PairAccuracy]]:
    """Per metric and seed, PASCAL-50S accuracy with ``k`` sampled references per image.

    Both candidates of a pair are scored in one call with the same references, so CIDEr's
    document frequencies come from the pair's reference sets, as in the CIDEr release.
    """
    out: dict[str, dict[int, PairAccuracy]] = {m: {} for m in metrics}
    n = len(pairs)
    for seed in seeds:
        refs = pairs.sample_references(seed, k)
        logger.info("PASCAL-50S seed %d: %s", seed, ", ".join(metrics))
        scores = compute_baselines(pairs.cand1 + pairs.cand2, refs + refs, metrics, cache_dir, use_cache)
        for m, v in scores.items():
            out[m][seed] = pair_accuracy(pairs, v[:n], v[n:])
    return {m: runs for m, runs in out.items() if runs}
