"""Every number the meta-evaluation report prints as published has a paper, a table and a row.

Needs no data: the report is rendered from a report dict holding every metric the published tables
name, with made-up accuracies and correlations, and a judges section.
"""

from __future__ import annotations

import re

import pytest

from qace.meta.baselines import DISPLAY
from qace.meta.published import PASCAL_COLUMNS, PUBLISHED, SOURCES, source_of
from qace.meta.report import render_markdown

NAME_OF = {display: name for name, display in DISPLAY.items()}


def _report() -> dict:
    """A report dict with every published metric on both data sets (values: 0.5 / 50.0)."""
    corr = {m: {"value": 0.5, "p_value": 0.01} for m in ("kendall_c", "kendall_b", "spearman", "pearson")}
    names = sorted({*PUBLISHED["flickr8k_tau_c"], *PUBLISHED["pascal50s"]})
    acc = {c: 50.0 for c in PASCAL_COLUMNS}
    pairs = ("j1-j2", "j1-j3", "j2-j3")
    pair = {**dict.fromkeys(pairs, 0.5), "mean": 0.5}
    figures = ("cohen_kappa", "cohen_kappa_linear", "cohen_kappa_quadratic", "gamma", "percent_agreement")
    return {
        "flickr8k_expert": {
            "protocol": "standard",
            "n_pairs": 3,
            "n_captions": 1,
            "metrics": {n: {"correlations": corr, "gamma": 0.5} for n in names},
        },
        "pascal50s": {
            "protocol": "5 references",
            "seeds": [0],
            "accuracy": {n: {"mean": acc, "sd": acc, "n_seeds": 1} for n in names},
        },
        "flickr8k_judges": {
            "n_items": 5822,
            "judges": ["j1", "j2", "j3"],
            "protocol": "all rows",
            "figures": {"fleiss_kappa": 0.517},
            "pairwise": dict.fromkeys(figures, pair),
            "pairwise_correlation": dict.fromkeys(pairs, {"kendall_b": 0.5, "spearman": 0.5}),
        },
    }


def test_every_published_figure_comes_from_one_row_of_a_paper_s_table() -> None:
    assert PUBLISHED["flickr8k_tau_c"] and PUBLISHED["pascal50s"]
    for dataset, table in PUBLISHED.items():
        for metric, value in table.items():
            row = source_of(dataset, metric)
            assert row is not None, (dataset, metric)
            assert row.paper and row.table.startswith("Table ") and row.row, row
            cells = dict(zip(row.columns, row.values, strict=True))
            assert (value if isinstance(value, dict) else {"tau_c": value}) == cells
    keys = [(r.dataset, r.metric) for r in SOURCES]
    assert len(keys) == len(set(keys))


def test_the_report_prints_as_published_only_numbers_of_the_table_of_sources() -> None:
    md = render_markdown(_report())
    table = md[md.index("## Table 1") :].split("\n## ")[0]
    sources = md[md.index("## Sources of the published values") :].split("\n## ")[0]
    header, printed = None, 0
    for line in table.splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == "Metric":
            header = cells
            continue
        assert header is not None
        name = NAME_OF.get(cells[0], cells[0])
        for column, cell in zip(header[1:], cells[1:], strict=True):
            for number in re.findall(r"\(([-\d.]+)\)", cell):
                tau = "tau" in column
                dataset, key = (
                    ("flickr8k_tau_c", "tau_c") if tau else ("pascal50s", column.replace("Mean", "mean"))
                )
                row = source_of(dataset, name)
                assert row is not None, (name, column, number)
                assert float(number) == dict(zip(row.columns, row.values, strict=True))[key], (name, column)
                assert f"| {row.paper} | {row.table} | {row.row} |" in sources
                printed += 1
    assert printed == len(PUBLISHED["flickr8k_tau_c"]) + len(PASCAL_COLUMNS) * len(PUBLISHED["pascal50s"])
    # No other section calls a number published (the judges' section used to).
    rest = md.replace(table, "").replace(sources, "")
    for line in rest.splitlines():
        assert "published" not in line.lower() or not re.search(r"\d\.\d", line), line


@pytest.mark.parametrize(
    ("metric", "row", "values"),
    [
        ("bleu4", "BLEU-4", (60.4, 90.6, 84.9, 54.7, 72.6)),
        ("cider", "CIDEr", (65.1, 98.1, 90.5, 64.8, 79.6)),
    ],
)
def test_the_pascal_rows_the_issue_found_wrong_are_table_4_s(
    metric: str, row: str, values: tuple[float, ...]
) -> None:
    """Issue 46: BLEU-4 and CIDEr were printed as 53.0/92.4/86.7/59.4 and 53.0/98.0/91.5/64.5."""
    source = source_of("pascal50s", metric)
    assert source is not None and source.table == "Table 4: Pascal50S accuracy results (5 references)"
    assert (source.row, source.values) == (row, values)
