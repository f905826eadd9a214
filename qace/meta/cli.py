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

from qace.errors import QACEError

logger = logging.getLogger(__name__)


def _add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, default=None,
                   help="shared data folder (default: $QACE_SHARED_DATA or <repo>/../shared/data)")


def _add_cache(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="metric-score cache (default <repo>/.qace-cache/meta)")
    p.add_argument("--no-cache", action="store_true", help="recompute metric scores, write no cache")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``meta`` with its subcommands to an existing subparsers object."""
    from qace.meta.baselines import BASELINES
    from qace.meta.datasets import PASCAL_SEEDS
    from qace.meta.report import DEFAULT_METRICS

    meta = subparsers.add_parser("meta", help="meta-evaluation: metric vs human correlation, judge agreement")
    sub = meta.add_subparsers(dest="meta_command", required=True)

    p = sub.add_parser("report", help="Table-1-style report (Markdown, JSON, PNG) from the shared data")
    _add_data_dir(p)
    p.add_argument("--out", type=Path, default=Path("meta-report"),
                   help="output folder (default ./meta-report)")
    p.add_argument("--metrics", nargs="*", default=list(DEFAULT_METRICS), choices=BASELINES, metavar="M",
                   help=f"baselines (default all: {' '.join(DEFAULT_METRICS)}; none: only --scores)")
    p.add_argument("--pascal-metrics", nargs="*", default=None, choices=BASELINES, metavar="M",
                   help="baselines on PASCAL-50S (default: --metrics without bertscore, which "
                        "takes ~4 CPU-minutes per seed)")
    p.add_argument("--scores", nargs="+", type=Path, default=[], metavar="FILE",
                   help="qace score outputs (JSONL/Parquet) whose numeric columns join by id")
    p.add_argument("--seeds", nargs="+", type=int, default=list(PASCAL_SEEDS),
                   help="PASCAL-50S sampling seeds")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for tau-c CIs (0: none)")
    p.add_argument("--datasets", nargs="+", default=["flickr8k", "pascal50s"],
                   choices=["flickr8k", "pascal50s"])
    p.add_argument("--no-plots", action="store_true")
    _add_cache(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("agreement", help="judge agreement (kappas, alpha, gamma) of Flickr8k-Expert/a file")
    p.add_argument("file", nargs="?", type=Path,
                   help="JSONL/CSV/Parquet with judge columns (default: Flickr8k-Expert)")
    p.add_argument("--judges", nargs="+", help="judge score columns of FILE")
    _add_data_dir(p)
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    p.add_argument("--plot", type=Path, help="also write a judge-versus-judge PNG here")
    p.set_defaults(func=cmd_agreement)

    p = sub.add_parser("correlate", help="correlate metric columns (and baselines) with human columns")
    p.add_argument("file", type=Path)
    p.add_argument("--human", nargs="+", required=True, help="human score column(s); each judgment is a row")
    p.add_argument("--metric-cols", nargs="+", default=None,
                   help="metric columns (default: other numeric columns)")
    p.add_argument("--baselines", nargs="+", default=[], choices=BASELINES, metavar="M",
                   help="also compute these baselines from candidate/references columns")
    p.add_argument("--scores", nargs="+", type=Path, default=[], metavar="FILE",
                   help="qace score outputs to join by id")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    _add_cache(p)
    p.set_defaults(func=cmd_correlate)

    p = sub.add_parser("export", help="write Flickr8k-Expert or PASCAL-50S as qace score input (JSONL)")
    p.add_argument("dataset", choices=["flickr8k", "pascal50s"])
    p.add_argument("out", type=Path)
    _add_data_dir(p)
    p.add_argument("--seeds", nargs="+", type=int, default=None,
                   help="PASCAL-50S: sampling seeds; ids get '@<seed>' (default: the report's seeds)")
    p.add_argument("--seed", type=int, default=None, help="PASCAL-50S: one seed, plain '<pair>-1' ids")
    p.add_argument("--images", type=Path, default=None,
                   help="folder of the data set's image files: records carry their 'image' path "
                        "(needed by --metric visce2 / regen)")
    p.set_defaults(func=cmd_export)


def cmd_report(args: argparse.Namespace) -> int:
    from qace.meta.report import ReportConfig, build_report, render_markdown, write_report

    cfg = ReportConfig(data_dir=args.data_dir, metrics=tuple(args.metrics),
                       pascal_metrics=None if args.pascal_metrics is None else tuple(args.pascal_metrics),
                       score_files=tuple(args.scores), seeds=tuple(args.seeds), n_boot=args.bootstrap,
                       cache_dir=args.cache_dir, use_cache=not args.no_cache, datasets=tuple(args.datasets))
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
        data = load_generic(args.file, args.judges, metric_cols=[])
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


def cmd_correlate(args: argparse.Namespace) -> int:
    from qace.meta.baselines import compute_baselines
    from qace.meta.datasets import load_generic
    from qace.meta.evaluate import flickr_correlations, join_scores, read_score_file
    from qace.meta.report import _clean_json
    from qace.meta.scales import reading_text

    data = load_generic(args.file, args.human, metric_cols=args.metric_cols)
    scores: dict[str, np.ndarray] = dict(data.metrics)
    if args.baselines:
        scores.update(compute_baselines(data.candidates, data.references, args.baselines, args.cache_dir,
                                        not args.no_cache))
    for path in args.scores:
        scores.update(join_scores(read_score_file(path), data.ids))
    if not scores:
        raise QACEError("no metric columns: pass --metric-cols, --baselines or --scores")
    result = flickr_correlations(data, scores, n_boot=args.bootstrap)
    print(f"{len(data)} captions x {len(data.judges)} judgment column(s)")
    for name, by_method in result.items():
        c = by_method["kendall_c"]
        others = "  ".join(f"{m} {v.value:.3f}" for m, v in by_method.items() if m != "kendall_c")
        ci = f" [{c.ci_low:.3f}, {c.ci_high:.3f}]" if args.bootstrap else ""
        print(f"  {name:20s} tau-c {c.value:.3f}{ci} p={c.p_value:.1e}  {others}  "
              f"({reading_text(c.value, 'correlation')})")
    if args.json:
        payload = {n: {m: c.to_dict() for m, c in bm.items()} for n, bm in result.items()}
        args.json.write_text(json.dumps(_clean_json(payload), indent=2) + "\n")
        print(f"wrote {args.json}")
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
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except QACEError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
