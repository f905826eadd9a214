"""The Table-1-style meta-evaluation report: compute once, write JSON, Markdown and plots.

:func:`build_report` gathers every number into one JSON-ready dict; :func:`render_markdown`
and :mod:`qace.meta.plots` only read that dict, so the Markdown, the JSON and the figures can
never disagree.
"""

from __future__ import annotations

import json
import logging
import math
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qace._version import __version__
from qace.errors import ConfigError, QACEError
from qace.meta.agreement import agreement_report, goodman_kruskal_gamma
from qace.meta.baselines import COCO_METRICS, SPICE_SKIP_MESSAGE, compute_baselines
from qace.meta.correlation import correlate, expand_judgments, p_out
from qace.meta.datasets import (
    PASCAL_NUM_REFS,
    PASCAL_SEEDS,
    CaptionSet,
    PairSet,
    load_flickr8k_expert,
    load_pascal50s,
    spread,
)
from qace.meta.evaluate import (
    PairAccuracy,
    flickr_correlations,
    join_pascal_scores,
    join_scores,
    pair_accuracy,
    pascal_baselines,
    pascal_candidate_ids,
    pascal_summary,
    read_score_file,
)
from qace.meta.published import PUBLISHED, sources_json
from qace.meta.report_markdown import render_markdown
from qace.meta.scales import readings
from qace.meta.scorers import ScorerRun, check_scorers

logger = logging.getLogger(__name__)

DEFAULT_METRICS = (*COCO_METRICS, "bertscore", "spice")


@dataclass
class ReportConfig:
    """What to compute; every field has a default that regenerates the published table."""

    data_dir: Path | None = None
    """Shared data folder (None: ``$QACE_SHARED_DATA`` or ``<repo>/../shared/data``)."""
    metrics: tuple[str, ...] = DEFAULT_METRICS
    """Baseline metrics on Flickr8k-Expert."""
    pascal_metrics: tuple[str, ...] | None = None
    """Baselines on PASCAL-50S (None: ``metrics`` without BERTScore, ~4 CPU-minutes per seed)."""
    score_files: tuple[Path, ...] = ()
    """``qace score`` outputs whose numeric columns become extra metric rows."""
    seeds: tuple[int, ...] = PASCAL_SEEDS
    """PASCAL-50S reference-sampling seeds; the table shows their mean."""
    n_refs: int = PASCAL_NUM_REFS
    """References sampled per PASCAL-50S image."""
    n_boot: int = 1000
    """Bootstrap resamples (over captions) for the tau-c interval; 0 disables."""
    cache_dir: Path | None = None
    """Metric-score cache (None: ``<repo>/.qace-cache/meta``)."""
    use_cache: bool = True
    datasets: tuple[str, ...] = ("flickr8k", "pascal50s")
    """Which benchmarks to run."""
    scorers: tuple[str, ...] = ()
    """Registered metrics to score the benchmarks with (``qace-ref``, ``qace-img``, others that read
    references or region features: `qace.meta.scorers.scorer_names`); rows named after them."""
    models: str | Path | None = None
    """Folder with qg/, tqa/, vqa/ for ``scorers`` (None: the paper's models)."""
    features: Path | None = None
    """Region-feature store of the benchmark images (needed by ``qace-img``)."""
    images: Path | None = None
    """The benchmark images, named by image id (a folder or list file): for ``scorers`` that read images."""
    scorer_settings: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments of the ``scorers`` that read images (``("model", DIR)``)."""
    device: str = "cpu"
    """Torch device of ``scorers``."""
    limit: int | None = None
    """Use only this many captions / pairs of each data set, spread evenly (quick checks, tests)."""


def _finite(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _clean_json(obj: object) -> object:
    if isinstance(obj, dict):
        return {str(k): _clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean_json(v) for v in obj]
    if isinstance(obj, float | np.floating):
        return _finite(float(obj))
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _runnable(metrics: tuple[str, ...], skipped: dict[str, str]) -> list[str]:
    out = []
    for m in metrics:
        if m == "spice":
            skipped["spice"] = SPICE_SKIP_MESSAGE
            continue
        out.append(m)
    return out


def _safe_baselines(fn: Callable[[list[str]], dict], metrics: list[str], skipped: dict[str, str]) -> dict:
    """Run ``fn`` on the core metrics, then on BERTScore alone, so a missing encoder skips one row."""
    result: dict = {}
    core = [m for m in metrics if m != "bertscore"]
    if core:
        result.update(fn(core))
    if "bertscore" in metrics:
        try:
            result.update(fn(["bertscore"]))
        except (QACEError, ImportError, OSError) as exc:
            skipped["bertscore"] = f"BERTScore skipped: {exc}"
            logger.warning(skipped["bertscore"])
    return result


def _add_column(target: dict, name: str, value: object) -> None:
    if name in target:
        logger.warning("score column %r has the name of a baseline; keeping the baseline", name)
    else:
        target[name] = value


def _flickr_section(
    cfg: ReportConfig, score_rows: list[dict], skipped: dict[str, str], runs: list[ScorerRun]
) -> tuple[dict, dict]:
    data = load_flickr8k_expert(cfg.data_dir, standard=True)
    data = data.subset(np.isin(np.arange(len(data)), spread(len(data), cfg.limit)))
    metrics = _runnable(cfg.metrics, skipped)
    scores = _safe_baselines(
        lambda ms: compute_baselines(data.candidates, data.references, ms, cfg.cache_dir, cfg.use_cache),
        metrics,
        skipped,
    )
    for run in runs:
        _add_column(scores, run.name, run.score(data.ids, data.candidates, data.references, data.image_ids))
    for rows in score_rows:
        for col, values in join_scores(rows, data.ids).items():
            _add_column(scores, col, values)
    boots: dict[str, dict[str, np.ndarray]] = {}
    corr = flickr_correlations(data, scores, n_boot=cfg.n_boot, keep_boot=boots)
    section: dict = {
        "n_captions": len(data),
        "n_pairs": int(np.isfinite(data.human).sum()),
        "n_images": len(set(data.image_ids)),
        "protocol": "standard: 158 own-image candidates dropped; each expert score is a row",
        "p_values": "scipy's test on captions (a caption's 3 expert scores averaged), not on "
        "the 16,992 rows, which are not independent",
        "intervals": f"95% percentile bootstrap, {cfg.n_boot} resamples of images",
        "metrics": {},
    }
    for name, by_method in corr.items():
        x = np.repeat(scores[name], data.human.shape[1])
        section["metrics"][name] = {
            "correlations": {
                m: {**c.to_dict(), "readings": readings(c.value, "correlation")} for m, c in by_method.items()
            },
            "gamma": goodman_kruskal_gamma(np.round(x, 6), data.human.reshape(-1)),
        }
    section["comparisons"] = _flickr_comparisons(data, scores, corr, boots)
    judges = load_flickr8k_expert(cfg.data_dir, standard=False)
    agree = agreement_report(judges.human, judges.judges).to_dict()
    pair_corr = {}
    h = judges.human
    for i in range(h.shape[1]):
        for j in range(i + 1, h.shape[1]):
            key = f"{judges.judges[i]}-{judges.judges[j]}"
            pair_corr[key] = {m: correlate(h[:, i], h[:, j], m).value for m in ("kendall_b", "spearman")}
    agree["pairwise_correlation"] = pair_corr
    agree["protocol"] = "all 5,822 judged rows, 3 experts, scale 1-4"
    plot_data = {"scores": scores, "human": data.human, "judges": judges.human, "judge_names": judges.judges}
    return {"flickr8k_expert": section, "flickr8k_judges": agree}, plot_data


def _flickr_comparisons(data: CaptionSet, scores: dict, corr: dict, boots: dict) -> list[dict]:
    """Every pair of metrics: tau-c difference with its paired image-bootstrap p and CI, and
    Williams' test on the Pearson r of the caption means (5,664 captions)."""
    from qace.meta.significance import bootstrap_difference, williams_on_units

    names = list(scores)
    x_rows, y, caption = {}, None, None
    for n in names:
        x_rows[n], y, caption = expand_judgments(scores[n], data.human)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            delta = corr[a]["kendall_c"].value - corr[b]["kendall_c"].value
            p = lo = hi = math.nan
            if "kendall_c" in boots.get(a, {}) and "kendall_c" in boots.get(b, {}):
                p, lo, hi = bootstrap_difference(delta, boots[a]["kendall_c"] - boots[b]["kendall_c"])
            ok = np.isfinite(x_rows[a]) & np.isfinite(x_rows[b])
            williams = williams_on_units(x_rows[a][ok], x_rows[b][ok], y[ok], caption[ok])  # type: ignore[index]
            out.append(
                {
                    "a": a,
                    "b": b,
                    "method": "kendall_c",
                    "delta": delta,
                    "p_bootstrap": p_out(p),
                    "ci_low": lo,
                    "ci_high": hi,
                    "p_williams_pearson": p_out(williams),
                }
            )
    return out


def _pascal_scorer_runs(
    pairs: PairSet, run: ScorerRun, seeds: tuple[int, ...], k: int
) -> dict[int, PairAccuracy]:
    """Accuracy per seed of one scorer; a reference-free scorer is run once for all seeds."""
    n = len(pairs)
    out: dict[int, PairAccuracy] = {}
    ids1, ids2 = pascal_candidate_ids(pairs)
    for seed in seeds:
        refs = pairs.sample_references(seed, k)
        if run.reference_free and out:
            out[seed] = next(iter(out.values()))
            continue
        v = run.score(ids1 + ids2, pairs.cand1 + pairs.cand2, refs + refs, pairs.image_ids + pairs.image_ids)
        out[seed] = pair_accuracy(pairs, v[:n], v[n:])
    return out


def _pascal_section(
    cfg: ReportConfig, score_rows: list[dict], skipped: dict[str, str], scorer_runs: list[ScorerRun]
) -> dict:
    pairs = load_pascal50s(cfg.data_dir)
    pairs = pairs.subset(spread(len(pairs), cfg.limit))
    chosen = cfg.pascal_metrics
    if chosen is None:
        chosen = tuple(m for m in cfg.metrics if m != "bertscore")
    metrics = _runnable(chosen, skipped)
    runs = _safe_baselines(
        lambda ms: pascal_baselines(pairs, ms, cfg.seeds, cfg.n_refs, cfg.cache_dir, cfg.use_cache),
        metrics,
        skipped,
    )
    extra: dict[str, dict] = {}
    for rows in score_rows:
        for seed in cfg.seeds:
            for col, (s1, s2) in join_pascal_scores(rows, pairs, seed).items():
                extra.setdefault(col, {})[seed] = pair_accuracy(pairs, s1, s2)
    for col, by_seed in extra.items():
        _add_column(runs, col, by_seed)
    for run in scorer_runs:
        _add_column(runs, run.name, _pascal_scorer_runs(pairs, run, cfg.seeds, cfg.n_refs))
    acc = {}
    for name, by_seed in runs.items():
        acc[name] = {
            **pascal_summary(pairs, list(by_seed.values()), n_boot=cfg.n_boot),
            "per_seed": {str(s): a.to_dict() for s, a in by_seed.items()},
        }
    spread_text = f"sd over the {len(cfg.seeds)} seeds; " if len(cfg.seeds) > 1 else "one seed, no sd; "
    return {
        "n_pairs": len(pairs),
        "seeds": list(cfg.seeds),
        "n_refs": cfg.n_refs,
        "protocol": (
            f"{cfg.n_refs} of the image's 50 references sampled with numpy default_rng(seed), pair "
            "by pair, same for both candidates; label: the majority of the pair's 10-11 released "
            "votes (the CLIPScore paper's labels come from 48 judgments per pair, which this data "
            "does not hold: docs/meta.md); metric ties count 1/2"
        ),
        "intervals": (
            spread_text + "95% bootstrap CI resampling pairs within each category "
            f"({cfg.n_boot} resamples), pair credit averaged over seeds"
        ),
        "accuracy": acc,
    }


def build_report(cfg: ReportConfig) -> tuple[dict, dict]:
    """(report dict, raw arrays for plots). Raises ConfigError if the data folder is missing."""
    unknown = set(cfg.datasets) - {"flickr8k", "pascal50s"}
    if unknown:
        raise ConfigError(f"unknown data set(s) {sorted(unknown)}; choose flickr8k and/or pascal50s")
    check_scorers(cfg.scorers, cfg.features, cfg.images)
    score_rows = [read_score_file(p) for p in cfg.score_files]
    scorer_runs = [
        ScorerRun(
            name,
            models=cfg.models,
            features=cfg.features,
            device=cfg.device,
            cache_dir=cfg.cache_dir,
            use_cache=cfg.use_cache,
            images=cfg.images,
            settings=dict(cfg.scorer_settings),
        )
        for name in cfg.scorers
    ]
    report: dict = {
        "qace_version": __version__,
        "python": platform.python_version(),
        "config": {
            "data_dir": str(cfg.data_dir) if cfg.data_dir else None,
            "metrics": list(cfg.metrics),
            "score_files": [str(p) for p in cfg.score_files],
            "seeds": list(cfg.seeds),
            "n_boot": cfg.n_boot,
            "scorers": list(cfg.scorers),
            "limit": cfg.limit,
        },
        "published": PUBLISHED,
        "published_sources": sources_json(),
    }
    plot_data: dict = {}
    skipped: dict[str, str] = {}
    if "flickr8k" in cfg.datasets:
        sections, plot_data = _flickr_section(cfg, score_rows, skipped, scorer_runs)
        report.update(sections)
    if "pascal50s" in cfg.datasets:
        report["pascal50s"] = _pascal_section(cfg, score_rows, skipped, scorer_runs)
    report["skipped"] = skipped
    report["notes"] = [
        f"{r.name} was scored with qace's TINY TEST MODELS: its numbers mean nothing"
        for r in scorer_runs
        if r.uses_test_models
    ]
    if cfg.limit is not None:
        report["notes"].append(
            f"--limit {cfg.limit}: only that many captions / pairs of each data set, "
            "spread evenly; the numbers are not comparable with the published ones"
        )
    return _clean_json(report), plot_data  # type: ignore[return-value]


def write_report(report: dict, plot_data: dict, out_dir: Path | str, plots: bool = True) -> list[Path]:
    """Write ``report.json``, ``report.md`` and (``plots``) the PNG figures; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "report.json", out / "report.md"]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    paths[1].write_text(render_markdown(report))
    if plots:
        from qace.meta.plots import write_plots

        paths += write_plots(report, plot_data, out)
    logger.info("wrote %s", ", ".join(str(p) for p in paths))
    return paths


__all__ = ["DEFAULT_METRICS", "PUBLISHED", "ReportConfig", "build_report", "render_markdown", "write_report"]
