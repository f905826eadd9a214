"""Correlate metrics with human criteria on a judgment set at every level, with CIs and tests.

:func:`correlate_study` is what ``qace meta correlate`` computes; it returns one JSON-ready dict
that :func:`render_markdown` and :mod:`qace.meta.plots` read, so the three outputs agree.

Layout of the data: ``human[criterion]`` is (rows, judges); a criterion with several judges
gives one (row, judgment) pair per judgment, and the p-values count rows (captions) as the
independent units (:func:`qace.meta.correlation.correlate`). Bootstrap intervals, the paired
bootstrap and the permutation test resample *items* (``items``, e.g. images) with all their
rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from qace.errors import ConfigError
from qace.meta.baselines import DISPLAY as METRIC_DISPLAY
from qace.meta.correlation import DISPLAY, METHODS, correlate, format_p
from qace.meta.levels import item_grouped, system_level
from qace.meta.scales import reading_text
from qace.meta.significance import compare_metrics

LEVELS = ("segment", "system", "item")
HEADLINE = "kendall_c"


def judgment_rows(human: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row index, score) of every finite judgment of a (rows, judges) array, row by row."""
    h = np.asarray(human, dtype=float)
    if h.ndim == 1:
        h = h[:, None]
    rows = np.repeat(np.arange(h.shape[0]), h.shape[1])
    y = h.reshape(-1)
    keep = np.isfinite(y)
    return rows[keep], y[keep]


def correlate_study(
    scores: Mapping[str, np.ndarray],
    human: Mapping[str, np.ndarray],
    items: Sequence[str],
    systems: Sequence[str] | None = None,
    methods: Sequence[str] = tuple(METHODS),
    headline: str = HEADLINE,
    levels: Sequence[str] = LEVELS,
    n_boot: int = 1000,
    n_perm: int = 1000,
    seed: int = 0,
) -> dict:
    """Per criterion: segment, system (if ``systems``) and item-grouped correlations, and tests.

    ``scores[metric]`` and ``human[criterion]`` are aligned with ``items`` (one entry per row).
    Pairwise tests (:func:`qace.meta.significance.compare_metrics`) run on ``headline`` and,
    for Williams' test, on Pearson's r.
    """
    unknown = [m for m in (*methods, headline) if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown correlation(s) {unknown}; choose from {list(METHODS)}")
    bad = [lv for lv in levels if lv not in LEVELS]
    if bad:
        raise ConfigError(f"unknown level(s) {bad}; choose from {list(LEVELS)}")
    item_idx = np.unique(np.asarray(items), return_inverse=True)[1]
    out: dict = {
        "n_rows": len(items),
        "n_items": int(item_idx.max() + 1) if len(items) else 0,
        "metrics": list(scores),
        "criteria": list(human),
        "methods": list(methods),
        "headline": headline,
        "n_boot": n_boot,
        "n_perm": n_perm,
        "seed": seed,
        "segment": {},
        "item": {},
        "system": {},
        "comparisons": {},
        "skipped_levels": {},
    }
    if "item" in levels and (np.bincount(item_idx).max() if len(items) else 0) < 2:
        levels = [lv for lv in levels if lv != "item"]
        out["skipped_levels"]["item"] = "every item has a single row: no within-item correlation"
    if systems is not None:
        out["n_systems"] = len(set(systems))
    for crit, h in human.items():
        rows, y = judgment_rows(h)
        g = item_idx[rows]
        out["segment"][crit] = {
            name: {
                m: correlate(
                    np.asarray(v, float)[rows], y, m, groups=g, units=rows, n_boot=n_boot, seed=seed
                ).to_dict()
                for m in methods
            }
            for name, v in scores.items()
        }
        if "item" in levels:
            out["item"][crit] = {
                name: {
                    m: item_grouped(np.asarray(v, float)[rows], y, g, m, n_boot=n_boot, seed=seed).to_dict()
                    for m in methods
                }
                for name, v in scores.items()
            }
        if "system" in levels and systems is not None:
            mean_h = np.nanmean(np.where(np.isfinite(h), h, np.nan).reshape(len(items), -1), axis=1)
            sys_arr = np.asarray(systems)
            out["system"][crit] = {
                name: {
                    m: system_level(
                        np.asarray(v, float), mean_h, sys_arr, m, groups=item_idx, n_boot=n_boot, seed=seed
                    ).to_dict()
                    for m in methods
                }
                for name, v in scores.items()
            }
        if len(scores) > 1:
            expanded = {name: np.asarray(v, float)[rows] for name, v in scores.items()}
            tested = [headline] + (["pearson"] if headline != "pearson" else [])
            out["comparisons"][crit] = {
                m: [
                    c.to_dict()
                    for c in compare_metrics(
                        expanded, y, m, g, n_boot=n_boot, n_perm=n_perm, seed=seed, units=rows
                    )
                ]
                for m in tested
            }
    return out


def _num(v: float | None, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _ci(entry: dict) -> str:
    lo, hi = entry.get("ci_low"), entry.get("ci_high")
    return "" if lo is None or hi is None else f" [{lo:.3f}, {hi:.3f}]"


def render_markdown(
    study: dict, title: str = "Correlation with human judgment", notes: Sequence[str] = ()
) -> str:
    """The study as Markdown: one table per level with a column per criterion, then the tests."""
    crits, metrics, head = study["criteria"], study["metrics"], study["headline"]
    lines = [
        f"# {title}",
        "",
        f"{study['n_rows']} rows, {study['n_items']} items"
        + (f", {study['n_systems']} systems" if "n_systems" in study else "")
        + f"; criteria: {', '.join(crits)}; {study['n_boot']} bootstrap resamples by item, "
        f"{study['n_perm']} permutations.",
        "",
    ]
    lines += [
        f"## Segment level: {DISPLAY[head]} [95% CI], p",
        "",
        "p: scipy's test on the rows as independent units (a row's several judgments are averaged "
        "first); CI: percentile bootstrap resampling items.",
        "",
        "| Metric | " + " | ".join(crits) + " |",
        "|---" * (len(crits) + 1) + "|",
    ]
    for name in metrics:
        cells = []
        for c in crits:
            e = study["segment"][c][name][head]
            cells.append(f"{_num(e['value'])}{_ci(e)}, p={format_p(e['p_value'])}")
        lines.append(f"| {METRIC_DISPLAY.get(name, name)} | " + " | ".join(cells) + " |")
    lines.append("")
    others = [m for m in study["methods"] if m != head]
    if others:
        lines += [
            "### Every coefficient (segment level)",
            "",
            "| Metric | Criterion | "
            + " | ".join(DISPLAY[m] + " [95% CI]" for m in study["methods"])
            + " | reading |",
            "|---" * (len(study["methods"]) + 3) + "|",
        ]
        for name in metrics:
            for c in crits:
                seg = study["segment"][c][name]
                lines.append(
                    f"| {METRIC_DISPLAY.get(name, name)} | {c} | "
                    + " | ".join(f"{_num(seg[m]['value'])}{_ci(seg[m])}" for m in study["methods"])
                    + f" | {reading_text(seg[head]['value'], 'correlation')} |"
                )
        lines.append("")
    for level, what in (
        ("system", "System level: correlation of per-system means"),
        ("item", "Item-grouped: mean of within-item correlations"),
    ):
        if not study[level]:
            continue
        lines += [
            f"## {what} ({DISPLAY[head]})",
            "",
            "| Metric | " + " | ".join(crits) + " |",
            "|---" * (len(crits) + 1) + "|",
        ]
        for name in metrics:
            cells = []
            for c in crits:
                e = study[level][c][name][head]
                p = f", p={format_p(e['p_value'])}" if e.get("p_value") is not None else ""
                cells.append(f"{_num(e['value'])}{_ci(e)}{p}")
            lines.append(f"| {METRIC_DISPLAY.get(name, name)} | " + " | ".join(cells) + " |")
        first = study[level][crits[0]][metrics[0]][head]
        how = f"; p: {first['p_method']}" if first.get("p_method") else ""
        lines += ["", f"{first['note']}{how}.", ""]
    if study["comparisons"]:
        lines += [
            "## Is metric A better than metric B? (segment level)",
            "",
            "delta = r(A) - r(B) with a 95% paired-bootstrap CI; p: paired bootstrap, paired "
            "permutation (both resampling items) and, for Pearson r, Williams' test (1959).",
            "",
            "| Criterion | Coefficient | A | B | delta [95% CI] | p bootstrap | p permutation | p Williams |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c, by_method in study["comparisons"].items():
            for m, comps in by_method.items():
                for cmp in comps:
                    a, b = (METRIC_DISPLAY.get(cmp[k], cmp[k]) for k in ("a", "b"))
                    lines.append(
                        f"| {c} | {DISPLAY[m]} | {a} | {b} | {_num(cmp['delta'])}{_ci(cmp)} | "
                        f"{format_p(cmp['p_bootstrap'])} | {format_p(cmp['p_permutation'])} | "
                        f"{format_p(cmp['p_williams'])} |"
                    )
        lines.append("")
    skipped = [f"{lv} level skipped: {why}" for lv, why in study.get("skipped_levels", {}).items()]
    lines += [
        "## Notes",
        "",
        *[f"- {n}" for n in [*notes, *skipped]],
        "- Readings: correlation strength on Rosenthal's (1996) effect-size bands for r; "
        "agreement scales (Krippendorff, Landis-Koch) are not applied to correlations.",
        "- p-values below 1e-300 are written <1e-300 here and in the JSON.",
        "",
    ]
    return "\n".join(lines)
