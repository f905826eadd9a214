"""PNG figures: judge versus judge, metric versus human, PASCAL-50S accuracies; for ``correlate``,
a scatter per metric and criterion, a forest plot of correlations with CIs and a pairwise
significance matrix.

Matplotlib is imported lazily with the non-interactive Agg backend, so the report runs on
headless CI machines; figures read only the report dict and the raw arrays it was built from.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import numpy as np

from qace.errors import BackendUnavailableError
from qace.meta.baselines import DISPLAY
from qace.meta.correlation import DISPLAY as DISPLAY_METHOD
from qace.meta.evaluate import CATEGORIES

logger = logging.getLogger(__name__)


def _pyplot():  # noqa: ANN202 - matplotlib is optional
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise BackendUnavailableError("plots need matplotlib: pip install 'qace[meta]'") from exc
    return plt


def plot_judges(ratings: np.ndarray, names: list[str], report: dict, path: Path) -> Path:
    """One heat map per judge pair: how often judge A gave a and judge B gave b.

    Mass on the diagonal is level agreement (kappa); mass on one side of it with the cells
    still ordered is a harsher judge whose ranking agrees (high gamma, lower kappa).
    """
    plt = _pyplot()
    cats = np.unique(ratings[np.isfinite(ratings)])
    pairs = list(itertools.combinations(range(ratings.shape[1]), 2))
    fig, axes = plt.subplots(1, len(pairs), figsize=(4.2 * len(pairs), 4.0), squeeze=False)
    pw = report.get("flickr8k_judges", {}).get("pairwise", {})
    for ax, (i, j) in zip(axes[0], pairs, strict=True):
        ok = np.isfinite(ratings[:, i]) & np.isfinite(ratings[:, j])
        table = np.zeros((cats.size, cats.size))
        np.add.at(table, (np.searchsorted(cats, ratings[ok, i]), np.searchsorted(cats, ratings[ok, j])), 1)
        ax.imshow(table, cmap="Blues", origin="lower")
        for (a, b), v in np.ndenumerate(table):
            ax.text(
                b,
                a,
                f"{int(v)}",
                ha="center",
                va="center",
                color="white" if v > table.max() / 2 else "black",
                fontsize=9,
            )
        ticks = [f"{c:g}" for c in cats]
        ax.set_xticks(range(cats.size), ticks)
        ax.set_yticks(range(cats.size), ticks)
        ax.set_xlabel(names[j])
        ax.set_ylabel(names[i])
        key = f"{names[i]}-{names[j]}"
        kappa = pw.get("cohen_kappa", {}).get(key)
        gamma = pw.get("gamma", {}).get(key)
        if kappa is not None and gamma is not None:
            ax.set_title(f"{key}: kappa {kappa:.2f}, gamma {gamma:.3f}", fontsize=10)
    fig.suptitle("Flickr8k-Expert: judge versus judge (counts)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_metric_vs_human(
    scores: dict[str, np.ndarray], human: np.ndarray, report: dict, path: Path, seed: int = 0
) -> Path:
    """Scatter of each metric against the mean expert score (jittered so the 1-4 grid is visible)."""
    plt = _pyplot()
    names = list(scores)
    cols = min(4, len(names))
    rows = int(np.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.2 * rows), squeeze=False)
    mean_h = np.nanmean(human, axis=1)
    rng = np.random.default_rng(seed)
    jitter = rng.uniform(-0.12, 0.12, mean_h.size)
    metrics = report.get("flickr8k_expert", {}).get("metrics", {})
    for ax, name in zip(axes.ravel(), names, strict=False):
        ax.scatter(mean_h + jitter, scores[name], s=2, alpha=0.25, color="tab:blue", rasterized=True)
        levels = np.unique(mean_h)
        med = [np.nanmedian(scores[name][mean_h == lv]) for lv in levels]
        ax.plot(levels, med, color="tab:red", lw=1.5, label="median")
        tau = metrics.get(name, {}).get("correlations", {}).get("kendall_c", {}).get("value")
        ax.set_title(
            f"{DISPLAY.get(name, name)}" + (f" (tau-c {100 * tau:.1f})" if tau is not None else ""),
            fontsize=10,
        )
        ax.set_xlabel("mean expert score")
    for ax in axes.ravel()[len(names) :]:
        ax.axis("off")
    fig.suptitle("Flickr8k-Expert: metric versus human")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_pascal(report: dict, path: Path) -> Path:
    """Write :func:`pascal_figure` to ``path``."""
    plt = _pyplot()
    fig = pascal_figure(report)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def pascal_figure(report: dict):  # noqa: ANN201 - a matplotlib Figure
    """Grouped bars: accuracy per PASCAL-50S category and the mean, one bar per metric.

    Error bars are the 95% bootstrap interval over pairs (when the report has one), else the
    standard deviation over seeds. The axis starts at 0 so bar lengths compare honestly.
    """
    plt = _pyplot()
    acc = report.get("pascal50s", {}).get("accuracy", {})
    names = list(acc)
    groups = [*CATEGORIES, "mean"]
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 0.25 * len(groups) * max(1, len(names)))) + 1.5, 4.2))
    x = np.arange(len(groups))
    for k, name in enumerate(names):
        mean = acc[name]["mean"]
        vals = np.array([np.nan if mean.get(g) is None else mean[g] for g in groups])
        ci = acc[name].get("ci", {})
        sd = acc[name].get("sd", {})
        if ci:
            err = np.array(
                [
                    [
                        vals[i] - (ci.get(g) or [vals[i], vals[i]])[0],
                        (ci.get(g) or [vals[i], vals[i]])[1] - vals[i],
                    ]
                    for i, g in enumerate(groups)
                ]
            ).T
        else:
            err = np.array([sd.get(g) or 0.0 for g in groups])
        ax.bar(
            x + (k - (len(names) - 1) / 2) * width,
            vals,
            width,
            yerr=err,
            capsize=2,
            error_kw={"lw": 0.8},
            label=DISPLAY.get(name, name),
        )
    ax.axhline(50, color="grey", lw=0.8, ls="--")
    ax.set_xticks(x, groups)
    ax.set_ylim(0, 100)
    ax.set_ylabel("accuracy (%)")
    seeds = report.get("pascal50s", {}).get("seeds", [])
    bars = "95% bootstrap CI over pairs" if any(acc[n].get("ci") for n in names) else "sd over seeds"
    ax.set_title(
        f"PASCAL-50S: agreement with the majority vote (mean of seeds {seeds}; error bars: {bars})",
        fontsize=9,
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    return fig


def plot_study_scatter(
    scores: dict[str, np.ndarray], human: dict[str, np.ndarray], study: dict, path: Path, seed: int = 0
) -> Path:
    """One panel per metric (rows) and criterion (columns): metric against the row's mean human score."""
    plt = _pyplot()
    names, crits = list(scores), list(human)
    fig, axes = plt.subplots(
        len(names), len(crits), figsize=(3.4 * len(crits), 2.9 * len(names)), squeeze=False
    )
    rng = np.random.default_rng(seed)
    head = study["headline"]
    for i, name in enumerate(names):
        for j, crit in enumerate(crits):
            ax = axes[i, j]
            h = np.nanmean(np.asarray(human[crit], dtype=float).reshape(len(scores[name]), -1), axis=1)
            spread = np.nanstd(h) if np.isfinite(h).any() else 0.0
            ax.scatter(
                h + rng.uniform(-0.05, 0.05, h.size) * max(spread, 1e-9),
                scores[name],
                s=4,
                alpha=0.4,
                rasterized=True,
            )
            v = study["segment"].get(crit, {}).get(name, {}).get(head, {}).get("value")
            value = f" ({head} {v:.3f})" if v is not None else ""
            ax.set_title(f"{DISPLAY.get(name, name)} vs {crit}{value}", fontsize=9)
            ax.set_xlabel(f"{crit} (mean of judges)", fontsize=8)
            ax.set_ylabel(DISPLAY.get(name, name), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_forest(study: dict, path: Path) -> Path:
    """Every segment-level coefficient with its 95% bootstrap CI, one panel per criterion."""
    plt = _pyplot()
    crits, names, methods = study["criteria"], study["metrics"], study["methods"]
    height = 0.5 + 0.45 * len(names) * len(methods)
    fig, axes = plt.subplots(1, len(crits), figsize=(4.2 * len(crits), height), squeeze=False, sharex=True)
    for ax, crit in zip(axes[0], crits, strict=True):
        ylabels: list[str] = []
        y = 0.0
        for name in names:
            for k, m in enumerate(methods):
                e = study["segment"][crit][name][m]
                lo, hi = e.get("ci_low"), e.get("ci_high")
                err = None if lo is None or hi is None else [[e["value"] - lo], [hi - e["value"]]]
                ax.errorbar(
                    e["value"],
                    y,
                    xerr=err,
                    fmt="o",
                    ms=4,
                    color=f"C{k}",
                    capsize=2,
                    label=m if name == names[0] else None,
                )
                ylabels.append(f"{DISPLAY.get(name, name)}" if k == 0 else "")
                y += 1
            y += 0.5
        ticks = [i + 0.5 * (i // len(methods)) for i in range(len(ylabels))]
        ax.set_yticks(ticks, ylabels, fontsize=8)
        ax.invert_yaxis()
        ax.axvline(0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{crit}: correlation [95% CI]", fontsize=10)
        ax.set_xlabel("coefficient")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(
        handles,
        [DISPLAY_METHOD.get(lb, lb) for lb in labels],
        fontsize=8,
        loc="upper center",
        ncol=len(methods),
        frameon=False,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_significance(study: dict, path: Path) -> Path:
    """Per criterion, the metrics x metrics matrix of paired-bootstrap p-values on the headline method.

    Cell (A, B) shows r(A) - r(B) and its p; colour is -log10 p (darker: stronger evidence).
    """
    plt = _pyplot()
    crits, names, head = study["criteria"], study["metrics"], study["headline"]
    k = len(names)
    fig, axes = plt.subplots(1, len(crits), figsize=(1.2 * k * len(crits) + 2, 1.0 * k + 1.5), squeeze=False)
    for ax, crit in zip(axes[0], crits, strict=True):
        mat = np.full((k, k), np.nan)
        text = [["" for _ in range(k)] for _ in range(k)]
        for cmp in study["comparisons"].get(crit, {}).get(head, []):
            i, j = names.index(cmp["a"]), names.index(cmp["b"])
            p = cmp["p_bootstrap"]
            p_num = 1e-300 if isinstance(p, str) else p
            for a, b, sign in ((i, j, 1), (j, i, -1)):
                if p_num is not None:
                    mat[a, b] = -np.log10(max(p_num, 1e-300))
                    text[a][b] = f"{sign * cmp['delta']:+.3f}\np={p if isinstance(p, str) else f'{p:.2g}'}"
        ax.imshow(mat, cmap="Greens", vmin=0, vmax=4)
        for (a, b), _ in np.ndenumerate(mat):
            ax.text(b, a, text[a][b], ha="center", va="center", fontsize=7)
        labels = [DISPLAY.get(n, n) for n in names]
        ax.set_xticks(range(k), labels, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(k), labels, fontsize=8)
        ax.set_title(f"{crit}: row minus column ({head}), paired bootstrap p", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_study_plots(
    study: dict, scores: dict[str, np.ndarray], human: dict[str, np.ndarray], out_dir: Path
) -> list[Path]:
    """The three ``correlate`` figures into ``out_dir`` (the matrix only with two or more metrics)."""
    paths = [
        plot_study_scatter(scores, human, study, out_dir / "scatter.png"),
        plot_forest(study, out_dir / "forest.png"),
    ]
    if any(study["comparisons"].values()):
        paths.append(plot_significance(study, out_dir / "significance.png"))
    return paths


def write_plots(report: dict, plot_data: dict, out_dir: Path) -> list[Path]:
    """Every figure the report's data supports, written into ``out_dir``."""
    paths = []
    if plot_data.get("judges") is not None:
        paths.append(
            plot_judges(plot_data["judges"], plot_data["judge_names"], report, out_dir / "judges.png")
        )
    if plot_data.get("scores"):
        paths.append(
            plot_metric_vs_human(
                plot_data["scores"], plot_data["human"], report, out_dir / "metric_vs_human.png"
            )
        )
    if report.get("pascal50s", {}).get("accuracy"):
        paths.append(plot_pascal(report, out_dir / "pascal50s.png"))
    return paths
