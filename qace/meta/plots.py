"""PNG figures of the report: judge versus judge, metric versus human, PASCAL-50S accuracies.

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
            ax.text(b, a, f"{int(v)}", ha="center", va="center",
                    color="white" if v > table.max() / 2 else "black", fontsize=9)
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


def plot_metric_vs_human(scores: dict[str, np.ndarray], human: np.ndarray, report: dict, path: Path,
                         seed: int = 0) -> Path:
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
        ax.set_title(f"{DISPLAY.get(name, name)}" + (f" (tau-c {100 * tau:.1f})" if tau is not None else ""),
                     fontsize=10)
        ax.set_xlabel("mean expert score")
    for ax in axes.ravel()[len(names):]:
        ax.axis("off")
    fig.suptitle("Flickr8k-Expert: metric versus human")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_pascal(report: dict, path: Path) -> Path:
    """Grouped bars: accuracy per PASCAL-50S category and the mean, one bar per metric."""
    plt = _pyplot()
    acc = report.get("pascal50s", {}).get("accuracy", {})
    names = list(acc)
    groups = [*CATEGORIES, "mean"]
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.0, 0.25 * len(groups) * max(1, len(names)))) + 1.5, 4.2))
    x = np.arange(len(groups))
    for k, name in enumerate(names):
        vals = [acc[name]["mean"].get(g) for g in groups]
        ax.bar(x + (k - (len(names) - 1) / 2) * width, [np.nan if v is None else v for v in vals], width,
               label=DISPLAY.get(name, name))
    ax.axhline(50, color="grey", lw=0.8, ls="--")
    ax.set_xticks(x, groups)
    ax.set_ylim(40, 101)
    ax.set_ylabel("accuracy (%)")
    seeds = report.get("pascal50s", {}).get("seeds", [])
    ax.set_title(f"PASCAL-50S: agreement with the majority vote (mean of seeds {seeds})")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(report: dict, plot_data: dict, out_dir: Path) -> list[Path]:
    """Every figure the report's data supports, written into ``out_dir``."""
    paths = []
    if plot_data.get("judges") is not None:
        paths.append(plot_judges(plot_data["judges"], plot_data["judge_names"], report,
                                 out_dir / "judges.png"))
    if plot_data.get("scores"):
        paths.append(plot_metric_vs_human(plot_data["scores"], plot_data["human"], report,
                                          out_dir / "metric_vs_human.png"))
    if report.get("pascal50s", {}).get("accuracy"):
        paths.append(plot_pascal(report, out_dir / "pascal50s.png"))
    return paths
