"""``qace meta``: report, agreement, correlate and export subcommands.

``register(subparsers)`` plugs the tree into the main ``qace`` parser; ``python -m qace.meta``
builds a parser of its own with the same function. Handlers return an exit code; printing to
stdout happens here only.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from qace.errors import ConfigError, QACEError

logger = logging.getLogger(__name__)


def _add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="shared data folder (default: $QACE_SHARED_DATA or <repo>/../shared/data)",
    )


def _add_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-dir", type=Path, default=None, help="metric-score cache (default <repo>/.qace-cache/meta)"
    )
    p.add_argument("--no-cache", action="store_true", help="recompute metric scores, write no cache")


def _add_format(p: argparse.ArgumentParser, flag: str, what: str) -> None:
    from qace.data.sniff import TABLE_FORMATS

    p.add_argument(
        flag,
        default="auto",
        choices=TABLE_FORMATS,
        help=f"format of {what} (default auto: CSV and Parquet by name, JSON vs JSON lines by content)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``meta`` with its subcommands to an existing subparsers object."""
    from qace.meta.baselines import BASELINES
    from qace.meta.correlation import METHODS
    from qace.meta.datasets import PASCAL_SEEDS
    from qace.meta.report import DEFAULT_METRICS
    from qace.meta.scorers import scorer_names

    meta = subparsers.add_parser("meta", help="meta-evaluation: metric vs human correlation, judge agreement")
    sub = meta.add_subparsers(dest="meta_command", required=True)

    p = sub.add_parser("report", help="Table-1-style report (Markdown, JSON, PNG) from the shared data")
    _add_data_dir(p)
    p.add_argument(
        "--out", type=Path, default=Path("meta-report"), help="output folder (default ./meta-report)"
    )
    p.add_argument(
        "--metrics",
        nargs="*",
        default=list(DEFAULT_METRICS),
        choices=BASELINES,
        metavar="M",
        help=f"baselines (default all: {' '.join(DEFAULT_METRICS)}; none: only --scores)",
    )
    p.add_argument(
        "--pascal-metrics",
        nargs="*",
        default=None,
        choices=BASELINES,
        metavar="M",
        help="baselines on PASCAL-50S (default: --metrics without bertscore, which "
        "takes ~4 CPU-minutes per seed)",
    )
    p.add_argument(
        "--scores",
        nargs="+",
        type=Path,
        default=[],
        metavar="FILE",
        help="qace score outputs (JSONL/Parquet) whose numeric columns join by id",
    )
    p.add_argument(
        "--seeds", nargs="+", type=int, default=list(PASCAL_SEEDS), help="PASCAL-50S sampling seeds"
    )
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for tau-c CIs (0: none)")
    p.add_argument(
        "--datasets", nargs="+", default=["flickr8k", "pascal50s"], choices=["flickr8k", "pascal50s"]
    )
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--with-scorers",
        nargs="+",
        default=[],
        choices=scorer_names(),
        metavar="S",
        help=f"also score the data sets with these registered metrics (cached): {', '.join(scorer_names())}",
    )
    p.add_argument(
        "--images",
        type=Path,
        help="the benchmark images named by image id, a folder or list file (for --with-scorers that read "
        "images: clip-s, refclip-s, ...)",
    )
    p.add_argument(
        "--scorer-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of the --with-scorers that read images, e.g. model=DIR (repeatable)",
    )
    p.add_argument("--models", help="qg/, tqa/, vqa/ folder for --with-scorers (default: the paper's models)")
    p.add_argument(
        "--features",
        type=Path,
        help="region features of the benchmark images, keyed by image id (needed by qace-img)",
    )
    p.add_argument("--device", default="cpu", help="torch device for --with-scorers, e.g. cuda")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        help="only this many captions / pairs per data set, spread evenly (quick checks)",
    )
    _add_cache(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("agreement", help="judge agreement (kappas, alpha, gamma) of Flickr8k-Expert/a file")
    p.add_argument(
        "file", nargs="?", type=Path, help="JSONL/CSV/Parquet with judge columns (default: Flickr8k-Expert)"
    )
    p.add_argument("--judges", nargs="+", help="judge score columns of FILE")
    _add_format(p, "--format", "FILE")
    _add_data_dir(p)
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    p.add_argument("--plot", type=Path, help="also write a judge-versus-judge PNG here")
    p.set_defaults(func=cmd_agreement)

    p = sub.add_parser(
        "correlate",
        help="correlate metrics with the human criteria of any judgment file",
        description="Per criterion and level (segment, system, item-grouped): correlations "
        "with bootstrap CIs by item, exact p-values and metric-vs-metric tests; "
        "writes correlate.md, correlate.json and plots into --out.",
    )
    p.add_argument("file", type=Path, help="JSONL, JSON, CSV or Parquet; one row per judged caption")
    p.add_argument("--candidate-col", help="caption column (needed by --metrics)")
    p.add_argument("--id-col", help="unique row id column, joins --scores files (default: the row number)")
    p.add_argument("--item-col", help="item (image) column: bootstrap and permutations resample items")
    p.add_argument("--system-col", help="system column: adds system-level correlations")
    p.add_argument(
        "--human-cols",
        nargs="+",
        default=[],
        metavar="COL",
        help="human score columns, each its own criterion (e.g. P R Total)",
    )
    p.add_argument(
        "--judge-cols",
        "--human",
        nargs="+",
        default=[],
        metavar="COL",
        dest="judge_cols",
        help="several judges' columns of ONE criterion ('human'); each judgment is a row",
    )
    p.add_argument(
        "--metric-cols",
        nargs="*",
        default=[],
        metavar="COL",
        help="metric score columns already in FILE (none by default)",
    )
    _add_format(p, "--format", "FILE")
    p.add_argument("--references", type=Path, metavar="REFS", help="references file, joined on the item")
    _add_format(p, "--references-format", "REFS")
    p.add_argument("--ref-item-col", help="item column of REFS (matches --item-col)")
    p.add_argument("--ref-text-col", help="reference column of REFS: one caption per row or a list")
    p.add_argument(
        "--references-col", help="references column of FILE (a list, JSON list or '|||'-separated)"
    )
    p.add_argument("--where", metavar="EXPR", help="pandas query selecting the rows, e.g. \"SYS != 'Human'\"")
    p.add_argument(
        "--metrics",
        "--baselines",
        nargs="+",
        default=[],
        choices=BASELINES,
        metavar="M",
        dest="metrics",
        help="baselines to compute from the candidate and reference columns",
    )
    p.add_argument(
        "--idf-over",
        choices=["all", "selected"],
        default="all",
        help="corpus statistics (CIDEr document frequencies) over every row of FILE (default) "
        "or only the rows --where selects",
    )
    p.add_argument(
        "--scores",
        nargs="+",
        type=Path,
        default=[],
        metavar="FILE",
        help="qace score outputs (JSONL/Parquet) joined by --id-col",
    )
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument(
        "--headline",
        default="kendall_c",
        choices=list(METHODS),
        help="coefficient of the summary tables and metric-vs-metric tests",
    )
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples by item (0: none)")
    p.add_argument("--permutations", type=int, default=1000, help="paired permutations by item (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        type=Path,
        default=Path("meta-correlate"),
        help="output folder for correlate.md, correlate.json and PNGs (default ./meta-correlate)",
    )
    p.add_argument("--json", type=Path, help="also write the JSON here")
    p.add_argument("--no-plots", action="store_true")
    _add_cache(p)
    p.set_defaults(func=cmd_correlate)

    p = sub.add_parser("export", help="write Flickr8k-Expert or PASCAL-50S as qace score input (JSONL)")
    p.add_argument("dataset", choices=["flickr8k", "pascal50s"])
    p.add_argument("out", type=Path)
    _add_data_dir(p)
    p.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=None,
        help="PASCAL-50S: sampling seeds; ids get '@<seed>' (default: the report's seeds)",
    )
    p.add_argument("--seed", type=int, default=None, help="PASCAL-50S: one seed, plain '<pair>-1' ids")
    p.add_argument(
        "--images",
        type=Path,
        default=None,
        help="folder of the data set's image files: records carry their 'image' path "
        "(needed by --metric visce2 / regen)",
    )
    p.set_defaults(func=cmd_export)


def _key_value(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--scorer-setting`` as a pair; `ConfigError` otherwise."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--scorer-setting {item!r} is not KEY=VALUE (e.g. model=DIR)")
    return key.strip(), value


def cmd_report(args: argparse.Namespace) -> int:
    from qace.meta.report import ReportConfig, build_report, render_markdown, write_report

    cfg = ReportConfig(
        data_dir=args.data_dir,
        metrics=tuple(args.metrics),
        pascal_metrics=None if args.pascal_metrics is None else tuple(args.pascal_metrics),
        score_files=tuple(args.scores),
        seeds=tuple(args.seeds),
        n_boot=args.bootstrap,
        cache_dir=args.cache_dir,
        use_cache=not args.no_cache,
        datasets=tuple(args.datasets),
        scorers=tuple(args.with_scorers),
        models=args.models,
        features=args.features,
        images=args.images,
        scorer_settings=tuple(_key_value(item) for item in args.scorer_setting),
        device=args.device,
        limit=args.limit,
    )
    report, plot_data = build_report(cfg)
    paths = write_report(report, plot_data, args.out, plots=not args.no_plots)
    print(render_markdown(report))
    for p in paths:
        print(f"wrote {p}")
    return 0


def _print_agreement(rep: dict) -> None:
    from qace.meta.scales import reading_text

    print(f"{rep['n_items']} items, judges: {', '.join(rep['judges'])}")
    for k, v in rep["figures"].items():
        kind = "proportion" if k == "percent_agreement" else "agreement"
        print(f"  {k:30s} {v:7.3f}   {reading_text(v, kind)}")
    for name, pairs in rep["pairwise"].items():
        kind = {"gamma": "correlation", "percent_agreement": "proportion"}.get(name, "agreement")
        cells = "  ".join(f"{k} {v:.3f}" for k, v in pairs.items())
        print(f"  {name:30s} {cells}   [mean: {reading_text(pairs['mean'], kind)}]")


def cmd_agreement(args: argparse.Namespace) -> int:
    from qace.meta.agreement import agreement_report
    from qace.meta.datasets import load_flickr8k_expert, load_generic

    if args.file is None:
        data = load_flickr8k_expert(args.data_dir, standard=False)
    else:
        if not args.judges:
            raise QACEError("name the judge columns of FILE with --judges")
        data = load_generic(args.file, args.judges, metric_cols=[], fmt=args.format)
    rep = agreement_report(data.human, data.judges)
    out = rep.to_dict()
    _print_agreement(out)
    if args.json:
        from qace.meta.report import _clean_json

        args.json.write_text(json.dumps(_clean_json(out), indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        from qace.meta.plots import plot_judges

        plot_judges(data.human, data.judges, {"flickr8k_judges": out}, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _check_correlate_args(args: argparse.Namespace) -> None:
    if not args.human_cols and not args.judge_cols:
        raise QACEError(
            "name the human scores: --human-cols C1 C2 (one criterion each) and/or "
            "--judge-cols J1 J2 J3 (several judges of one criterion)"
        )
    if args.metrics and not args.candidate_col:
        raise QACEError("--metrics needs the caption column: pass --candidate-col")
    if args.metrics and not (args.references or args.references_col):
        raise QACEError(
            "--metrics needs references: --references REFS (with --item-col, --ref-item-col, "
            "--ref-text-col) or --references-col"
        )
    if not (args.metrics or args.metric_cols or args.scores):
        raise QACEError("no metric to correlate: pass --metrics, --metric-cols or --scores")
    if args.bootstrap < 0 or args.permutations < 0:
        raise QACEError("--bootstrap and --permutations must be >= 0")


def cmd_correlate(args: argparse.Namespace) -> int:
    from qace.meta.baselines import compute_baselines
    from qace.meta.evaluate import join_scores, read_score_file
    from qace.meta.judgments import check_varies, load_judgments
    from qace.meta.report import _clean_json
    from qace.meta.study import correlate_study, render_markdown

    _check_correlate_args(args)
    j = load_judgments(
        args.file,
        human_cols=args.human_cols,
        judge_cols=args.judge_cols,
        candidate_col=args.candidate_col,
        id_col=args.id_col,
        item_col=args.item_col,
        system_col=args.system_col,
        metric_cols=args.metric_cols,
        references_col=args.references_col,
        references_file=args.references,
        ref_item_col=args.ref_item_col,
        ref_text_col=args.ref_text_col,
        where=args.where,
        fmt=args.format,
        references_format=args.references_format,
    )
    data, sel = j.data, j.selected
    scores: dict[str, np.ndarray] = {k: v[sel] for k, v in data.metrics.items()}
    notes = []
    if args.where:
        notes.append(f"rows: {int(sel.sum())} of {len(data)} selected by --where {args.where!r}")
    if args.metrics:
        rows = np.flatnonzero(sel) if args.idf_over == "selected" else np.arange(len(data))
        missing = [data.ids[i] for i in rows if not data.references[i]]
        if missing:
            raise QACEError(
                f"{len(missing)} rows have no references (first id {missing[0]!r}); "
                "give every row references or pass --idf-over selected"
            )
        base = compute_baselines(
            [data.candidates[i] for i in rows],
            [data.references[i] for i in rows],
            args.metrics,
            args.cache_dir,
            not args.no_cache,
        )
        pos = np.full(len(data), -1)
        pos[rows] = np.arange(rows.size)
        for name, v in base.items():
            scores[name] = v[pos[sel]]
        notes.append(
            "baselines scored on the selected rows; corpus statistics (CIDEr document frequencies) "
            + (
                "over the selected rows only (--idf-over selected)"
                if args.idf_over == "selected"
                else f"over all {len(data)} rows of the file (--idf-over all)"
            )
        )
    for path in args.scores:
        for name, v in join_scores(read_score_file(path), data.ids).items():
            scores.setdefault(name, v[sel])
    if not scores:
        raise QACEError("no metric column: --scores files share no ids with --id-col")
    for name, v in scores.items():
        check_varies(v, name, "metric", args.file)
    human = {c: j.human(c) for c in j.criteria}
    systems = None if data.systems is None else [data.systems[i] for i in np.flatnonzero(sel)]
    items = [data.image_ids[i] for i in np.flatnonzero(sel)]
    if args.item_col is None:
        notes.append("no --item-col: each row is its own item for resampling")
    if args.judge_cols:
        notes.append(
            f"criterion 'human' pools the judges {', '.join(args.judge_cols)}: one row per "
            "judgment; p-values average a caption's judgments first"
        )
    raw = correlate_study(
        scores,
        human,
        items,
        systems,
        methods=args.methods,
        headline=args.headline,
        n_boot=args.bootstrap,
        n_perm=args.permutations,
        seed=args.seed,
    )
    study: dict = _clean_json({**raw, "notes": notes, "file": str(args.file)})  # type: ignore[assignment]
    markdown = render_markdown(study, title=f"Correlation with human judgment: {args.file.name}", notes=notes)
    args.out.mkdir(parents=True, exist_ok=True)
    payload = json.dumps(study, indent=2) + "\n"
    paths = [args.out / "correlate.json", args.out / "correlate.md"]
    paths[0].write_text(payload)
    paths[1].write_text(markdown)
    if args.json:
        args.json.write_text(payload)
        paths.append(args.json)
    if not args.no_plots:
        from qace.meta.plots import write_study_plots

        paths += write_study_plots(study, scores, human, args.out)
    print(markdown)
    for path in paths:
        print(f"wrote {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from qace.meta.datasets import PASCAL_SEEDS
    from qace.meta.export import export

    if args.seed is not None and args.seeds is not None:
        raise QACEError("pass --seed (plain ids) or --seeds (tagged ids), not both")
    if args.seed is not None:
        seeds, tag = [args.seed], False
    else:
        seeds, tag = (args.seeds or list(PASCAL_SEEDS)), True
    n = export(args.dataset, args.out, args.data_dir, seeds=seeds, tag_seed=tag, images=args.images)
    print(f"wrote {n} captions to {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m qace.meta``: the ``meta`` tree under a parser of its own."""
    parser = argparse.ArgumentParser(prog="python -m qace.meta", description="QACE meta-evaluation")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["meta", *(argv if argv is not None else sys.argv[1:])])
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except QACEError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
