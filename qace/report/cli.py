"""``qace report``: the command; the page is built by `qace.report.page` (imported when it runs)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``qace report SCORES [SCORES_B] [-o OUT] [--input FILE]``."""
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report of score output (two files: compare them)",
        description="One HTML file, no network: summary, distributions, the signature, and a searchable, "
        "sortable table of captions whose rows expand into their evidence. Two score files are compared "
        "on their common ids (biggest disagreements, paired difference with a bootstrap interval).",
    )
    p.add_argument("scores", nargs="+", help="qace score output (.jsonl or .parquet); a second file compares")
    p.add_argument("--output", "-o", help="the HTML file (default: <first score file>.html)")
    p.add_argument(
        "--input",
        action="append",
        help="the scored input file (caption text and references for rows scored without --explain); "
        "once for all score files or once per file",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from qace.report.page import build_report

    scores = [Path(s) for s in args.scores]
    output = Path(args.output) if args.output else scores[0].with_suffix(".html")
    path = build_report(scores, output, inputs=[Path(p) for p in args.input or []])
    print(f"report written to {path}")
    return 0
