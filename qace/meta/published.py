"""The published figures the meta-evaluation report prints beside ours, each with its source.

`SOURCES` is the table of sources: one `Row` per row of a paper's table, with the paper, the table and
the row label as printed, and the values read from the paper's own text. `PUBLISHED`, what the report
prints in parentheses and writes to ``report.json``, is built from it and from nothing else, so no
number can be printed as published without its paper, table and row.

Not here, on purpose: the Flickr8k-Expert judge-agreement figures that circulate for this data (Fleiss'
kappa 0.52, mean Goodman-Kruskal gamma 0.98) could not be traced to a paper's table, so the report does
not print them as published.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

CLIPSCORE = (
    "Hessel et al. 2021, CLIPScore: A Reference-free Evaluation Metric for Image Captioning "
    "(EMNLP 2021; arXiv 2104.08718)"
)
CLIPSCORE_TABLE_1 = "Table 1: Flickr8K-Expert correlations with human judgment"
CLIPSCORE_TABLE_4 = "Table 4: Pascal50S accuracy results (5 references)"

FLICKR_COLUMNS = ("tau_c",)
"""Table 1's one column: Kendall tau-c x 100."""
PASCAL_COLUMNS = ("HC", "HI", "HM", "MM", "mean")
"""Table 4's columns (the report's keys): accuracy % per category and their mean."""


@dataclass(frozen=True)
class Row:
    """One row of a published table: ``values`` in the order of ``columns``, as the paper prints them.

    ``dataset`` and ``metric`` are the report's keys (``flickr8k_tau_c`` or ``pascal50s``; a metric
    name of `qace.meta.baselines` or the scorer registry); ``row`` is the paper's own label.
    """

    dataset: str
    metric: str
    paper: str
    table: str
    row: str
    columns: tuple[str, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.columns) != len(self.values):
            raise ValueError(f"{self.row}: {len(self.values)} values for columns {self.columns}")


def _table_1(metric: str, row: str, tau_c: float) -> Row:
    return Row("flickr8k_tau_c", metric, CLIPSCORE, CLIPSCORE_TABLE_1, row, FLICKR_COLUMNS, (tau_c,))


def _table_4(metric: str, row: str, *values: float) -> Row:
    return Row("pascal50s", metric, CLIPSCORE, CLIPSCORE_TABLE_4, row, PASCAL_COLUMNS, values)


SOURCES: tuple[Row, ...] = (
    _table_1("bleu1", "BLEU-1", 32.3),
    _table_1("bleu4", "BLEU-4", 30.8),
    _table_1("rouge_l", "ROUGE-L", 32.3),
    _table_1("meteor", "METEOR", 41.8),
    _table_1("cider", "CIDEr", 43.9),
    _table_1("spice", "SPICE", 44.9),
    _table_1("bertscore-roberta-f", "BERT-S (RoBERTa-F)", 39.2),
    _table_1("clip-s", "CLIP-S (no refs)", 51.2),
    _table_1("refclip-s", "RefCLIP-S", 53.0),
    _table_4("bleu4", "BLEU-4", 60.4, 90.6, 84.9, 54.7, 72.6),
    _table_4("spice", "SPICE", 63.6, 96.3, 86.7, 68.3, 78.7),
    _table_4("meteor", "METEOR", 63.8, 97.7, 93.7, 65.4, 80.1),
    _table_4("rouge_l", "ROUGE-L", 63.7, 95.3, 92.3, 61.2, 78.1),
    _table_4("cider", "CIDEr", 65.1, 98.1, 90.5, 64.8, 79.6),
    _table_4("bertscore-roberta-f", "BERT-S (RoBERTa-F)", 65.4, 96.2, 93.3, 61.4, 79.1),
    _table_4("clip-s", "CLIP-S (no refs)", 56.5, 99.3, 96.4, 70.4, 80.7),
    _table_4("refclip-s", "RefCLIP-S", 64.5, 99.6, 95.4, 72.8, 83.1),
)
"""Every published figure, with its paper, table and row. The paper's BERT-S (RoBERTa-F) has its own key:
the report's BERTScore row uses all-MiniLM-L6-v2, so no published value is printed beside it."""


def _published(sources: tuple[Row, ...]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for row in sources:
        table = out.setdefault(row.dataset, {})
        if row.metric in table:
            raise ValueError(f"two sources for {row.dataset} {row.metric}")
        cells = dict(zip(row.columns, row.values, strict=True))
        table[row.metric] = cells["tau_c"] if row.columns == FLICKR_COLUMNS else cells
    return out


PUBLISHED: dict[str, dict[str, Any]] = _published(SOURCES)
"""``{"flickr8k_tau_c": {metric: tau_c}, "pascal50s": {metric: {"HC", "HI", "HM", "MM", "mean"}}}``."""


def source_of(dataset: str, metric: str) -> Row | None:
    """The table row a published figure of ``metric`` on ``dataset`` comes from, if any."""
    return next((r for r in SOURCES if r.dataset == dataset and r.metric == metric), None)


def sources_json() -> list[dict[str, Any]]:
    """`SOURCES` as JSON-ready dicts (``report.json``'s ``published_sources``)."""
    return [{**asdict(r), "columns": list(r.columns), "values": list(r.values)} for r in SOURCES]
