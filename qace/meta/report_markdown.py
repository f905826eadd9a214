"""The meta-evaluation report as Markdown, read from `qace.meta.report.build_report`'s dict (and the
published figures printed beside ours, each named by its paper, table and row in a closing list), so
the Markdown and the JSON cannot disagree."""

from __future__ import annotations

from qace.meta.baselines import DISPLAY
from qace.meta.correlation import format_p
from qace.meta.evaluate import CATEGORIES
from qace.meta.published import PUBLISHED, source_of
from qace.meta.scales import reading_text


def _fmt(x: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "–" if x is None else f"{x * scale:.{digits}f}"


def _row_names(report: dict) -> list[str]:
    names = list(report.get("flickr8k_expert", {}).get("metrics", {}))
    for n in report.get("pascal50s", {}).get("accuracy", {}):
        if n not in names:
            names.append(n)
    return names


def _pm(acc: dict, key: str) -> str:
    """``mean ± sd`` of one PASCAL-50S cell (the sd over seeds, when there are several)."""
    v, sd = acc.get("mean", {}).get(key), acc.get("sd", {}).get(key)
    if v is None:
        return "–"
    return f"{v:.1f} ± {sd:.1f}" if sd is not None and acc.get("n_seeds", 1) > 1 else f"{v:.1f}"


def _table1(report: dict) -> list[str]:
    """Table 1 with the columns of the data sets the report has (no empty columns)."""
    flickr = report.get("flickr8k_expert", {}).get("metrics", {})
    pascal = report.get("pascal50s", {}).get("accuracy", {})
    has_f, has_p = "flickr8k_expert" in report, "pascal50s" in report
    pub_tau, pub_pas = PUBLISHED["flickr8k_tau_c"], PUBLISHED["pascal50s"]
    head, intro = ["Metric"], []
    if has_f:
        head.append("Flickr8k-Expert tau-c")
        intro.append("Flickr8k-Expert: Kendall tau-c x 100 (published value in parentheses, sources below).")
    if has_p:
        head += [*CATEGORIES, "Mean"]
        intro.append(
            "PASCAL-50S: accuracy (%) per category, mean ± sd over seeds "
            f"{report['pascal50s'].get('seeds', [])} (published value in parentheses, sources below; "
            "95% CIs below)."
        )
    lines = [
        "## Table 1: correlation with human judgment",
        "",
        " ".join(intro),
        "",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]
    for name in _row_names(report):
        cells = [DISPLAY.get(name, name)]
        if has_f:
            tau = flickr.get(name, {}).get("correlations", {}).get("kendall_c", {}).get("value")
            cell = _fmt(tau, 100)
            if name in pub_tau and tau is not None:
                cell += f" ({pub_tau[name]})"
            cells.append(cell)
        if has_p:
            acc = pascal.get(name, {})
            for c in (*CATEGORIES, "mean"):
                v = _pm(acc, c)
                if name in pub_pas and acc:
                    v += f" ({pub_pas[name][c]})"
                cells.append(v)
        lines.append("| " + " | ".join(cells) + " |")
    for name in report.get("skipped", {}):
        lines.append(f"| {DISPLAY.get(name, name)} | skipped |" + " |" * (len(head) - 2))
    return [*lines, ""]


def _sources(report: dict) -> list[str]:
    """Paper, table and row of every published figure Table 1 printed (`qace.meta.published.SOURCES`)."""
    shown = []
    for name in _row_names(report):
        if "flickr8k_expert" in report and name in report["flickr8k_expert"].get("metrics", {}):
            shown.append(source_of("flickr8k_tau_c", name))
        if "pascal50s" in report and name in report["pascal50s"].get("accuracy", {}):
            shown.append(source_of("pascal50s", name))
    rows = [r for r in shown if r is not None]
    if not rows:
        return []
    lines = [
        "## Sources of the published values",
        "",
        "| Values | Paper | Table | Row |",
        "|---|---|---|---|",
    ]
    for r in rows:
        values = ", ".join(f"{c} {v}" for c, v in zip(r.columns, r.values, strict=True))
        lines.append(f"| {values} | {r.paper} | {r.table} | {r.row} |")
    return [*lines, ""]


def _flickr_details(section: dict) -> list[str]:
    lines = [
        "## Flickr8k-Expert: every correlation",
        "",
        f"{section['n_pairs']} (caption, expert) pairs over {section['n_captions']} captions of "
        f"{section.get('n_images', '?')} images. p: {section.get('p_values', '')}; "
        f"CI: {section.get('intervals', '')}.",
        "",
        "| Metric | tau-c [95% CI] | p | tau-b [95% CI] | Spearman [95% CI] | Pearson [95% CI] | gamma "
        "| reading (tau-c) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def with_ci(c: dict) -> str:
        ci = (
            f" [{_fmt(c['ci_low'], 1, 3)}, {_fmt(c['ci_high'], 1, 3)}]" if c.get("ci_low") is not None else ""
        )
        return f"{_fmt(c['value'], 1, 3)}{ci}"

    for name, entry in section["metrics"].items():
        c = entry["correlations"]
        lines.append(
            f"| {DISPLAY.get(name, name)} | {with_ci(c['kendall_c'])} | "
            f"{format_p(c['kendall_c']['p_value'])} | "
            + " | ".join(with_ci(c[m]) for m in ("kendall_b", "spearman", "pearson"))
            + f" | {_fmt(entry['gamma'], 1, 3)} | "
            f"{reading_text(c['kendall_c']['value'], 'correlation')} |"
        )
    lines.append("")
    comps = section.get("comparisons", [])
    if comps:
        lines += [
            "### Is metric A better than metric B? (Flickr8k-Expert)",
            "",
            "delta tau-c = tau-c(A) - tau-c(B) with the paired bootstrap over images (same draws for "
            "both metrics); Williams (1959) on Pearson r of the caption means.",
            "",
            "| A | B | delta tau-c [95% CI] | p bootstrap | p Williams (Pearson) |",
            "|---|---|---|---|---|",
        ]
        for cmp in comps:
            ci = (
                f" [{_fmt(cmp['ci_low'], 1, 3)}, {_fmt(cmp['ci_high'], 1, 3)}]"
                if cmp.get("ci_low") is not None
                else ""
            )
            lines.append(
                f"| {DISPLAY.get(cmp['a'], cmp['a'])} | {DISPLAY.get(cmp['b'], cmp['b'])} | "
                f"{_fmt(cmp['delta'], 1, 3)}{ci} | {format_p(cmp['p_bootstrap'])} | "
                f"{format_p(cmp['p_williams_pearson'])} |"
            )
        lines.append("")
    return lines


def _pascal_details(section: dict) -> list[str]:
    acc = section["accuracy"]
    if not any(a.get("ci") for a in acc.values()):
        return []
    groups = [*CATEGORIES, "mean"]
    lines = [
        "## PASCAL-50S: 95% confidence intervals",
        "",
        f"{section.get('intervals', '')}.",
        "",
        "| Metric | " + " | ".join(groups) + " |",
        "|---" * (len(groups) + 1) + "|",
    ]
    for name, a in acc.items():
        ci = a.get("ci", {})
        cells = [
            f"[{ci[g][0]:.1f}, {ci[g][1]:.1f}]" if ci.get(g) and None not in ci[g] else "–" for g in groups
        ]
        lines.append(f"| {DISPLAY.get(name, name)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def render_markdown(report: dict) -> str:
    """The report as Markdown: Table 1, full correlations and tests, CIs, judge agreement, notes."""
    lines = ["# QACE meta-evaluation report", "", *_table1(report), *_sources(report)]
    if report.get("flickr8k_expert", {}).get("metrics"):
        lines += _flickr_details(report["flickr8k_expert"])
    if report.get("pascal50s", {}).get("accuracy"):
        lines += _pascal_details(report["pascal50s"])
    judges = report.get("flickr8k_judges")
    if judges:
        lines += _judges_markdown(judges)
    lines += ["## Protocols and notes", ""]
    if "flickr8k_expert" in report:
        lines.append(f"- Flickr8k-Expert: {report['flickr8k_expert']['protocol']}.")
    if "pascal50s" in report:
        lines.append(f"- PASCAL-50S: {report['pascal50s']['protocol']}.")
    for msg in [*report.get("skipped", {}).values(), *report.get("notes", [])]:
        lines.append(f"- {msg}")
    if "flickr8k_expert" in report and "pascal50s" in report:
        lines.append(
            "- –: not computed for that data set (BERTScore on PASCAL-50S is opt-in: it takes ~4 "
            "CPU-minutes per seed; add it with --pascal-metrics)."
        )
    lines.append(
        "- Readings: agreement figures (kappa, alpha) on Krippendorff (1980, KA) and Landis & "
        "Koch (1977, LK); correlations (tau, rho, r, gamma) only on Rosenthal's (1996) "
        "effect-size bands."
    )
    lines.append("- p-values below 1e-300 are written <1e-300 here and in report.json.")
    return "\n".join(lines) + "\n"


def _judges_markdown(judges: dict) -> list[str]:
    fig, pw = judges["figures"], judges["pairwise"]
    lines = [
        "## Flickr8k-Expert judges: agreement and covariation",
        "",
        f"{judges['n_items']} captions, judges {', '.join(judges['judges'])} ({judges['protocol']}).",
        "",
        "| Figure | Value | Reading |",
        "|---|---|---|",
    ]
    for k, v in fig.items():
        lines.append(
            f"| {k.replace('_', ' ')} | {_fmt(v, 1, 3)} | "
            f"{reading_text(v, 'proportion' if k == 'percent_agreement' else 'agreement')} |"
        )
    for k in ("cohen_kappa", "cohen_kappa_linear", "cohen_kappa_quadratic", "gamma"):
        v = pw[k]["mean"]
        lines.append(
            f"| {k.replace('_', ' ')} (mean of pairs) | {_fmt(v, 1, 3)} | "
            f"{reading_text(v, 'correlation' if k == 'gamma' else 'agreement')} |"
        )
    lines += [
        "",
        "Level agreement (kappa) beside covariation (gamma, tau-b, Spearman), per judge pair:",
        "",
        "| Pair | Cohen kappa | linear | quadratic | % agree | gamma | tau-b | Spearman |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pc = judges["pairwise_correlation"]
    for pair in pc:
        kappas = ("cohen_kappa", "cohen_kappa_linear", "cohen_kappa_quadratic")
        cells = [_fmt(pw[k][pair], 1, 3) for k in kappas]
        cells += [
            _fmt(pw["percent_agreement"][pair], 100),
            _fmt(pw["gamma"][pair], 1, 3),
            _fmt(pc[pair]["kendall_b"], 1, 3),
            _fmt(pc[pair]["spearman"], 1, 3),
        ]
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    return [*lines, ""]
