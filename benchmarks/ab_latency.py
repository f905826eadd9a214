"""Reward latency (or the models-alone replay) of two or more trees on one machine, runs alternated: an
A/B that names its spread.

    python -m benchmarks.ab_latency --tree main=../main-copy --tree branch=. --rounds 3 \\
        --out benchmarks/results/latency_<change>_<gpu>.json -- --variants img ref --batches 64 256
    python -m benchmarks.ab_latency --benchmark replay_gaps --tree main=../main-copy --tree branch=. \\
        --rounds 2 --out benchmarks/results/replay_gaps_<change>_<gpu>.json -- --models-dir /tmp/qm

One run of `benchmarks.latency` (or of ``--benchmark replay_gaps``; the arguments after ``--``, each run
in its own process, from its own tree: the tree's folder is the working directory and the first entry of
``PYTHONPATH``) per tree per round. Rounds alternate the order (A B, then B A, ...), so a drift over the
lease (clocks, the host's other work) weighs on every tree alike. A tree is ``NAME=DIR`` or
``NAME=DIR@COMMIT``: a copy without git metadata (a GPU host's) names its commit, which its runs record
(``QACE_COMMIT``).

The record: the run metadata, the benchmark and its arguments, the trees, the order, every run's own
record (``runs``) and ``summary``: for latency, per cell (``img_64``: variant and batch, in-process path),
each tree's p50 in every round, their median and range, and the ratio of each tree's median to the first
tree's; for the replay, the same of its median replay (``replay``, seconds) and of its kernels' time
(``kernels``, ms: a change that queues more device work shows there). The spread between one tree's rounds
is what a difference must exceed to be a difference (docs/performance.md gives it for H200 leases). One
tree may be named twice (``--tree main=.@C --tree again=.@C``): the gap between the two names is the
lease's own, with no change of code behind it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.run_info import record


@dataclass(frozen=True)
class Tree:
    """A source tree to time: its name in the record, its folder and, for a copy, its commit."""

    name: str
    folder: Path
    commit: str | None = None


def parse_tree(text: str) -> Tree:
    """``NAME=DIR`` or ``NAME=DIR@COMMIT``."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"--tree {text!r}: give NAME=DIR or NAME=DIR@COMMIT")
    folder, _, commit = rest.partition("@")
    if not (Path(folder) / "benchmarks" / "latency.py").is_file():
        raise argparse.ArgumentTypeError(f"--tree {text!r}: {folder} holds no benchmarks/latency.py")
    return Tree(name, Path(folder).resolve(), commit or None)


def order(trees: Sequence[Tree], rounds: int) -> list[Tree]:
    """Every tree once a round, the order reversed every other round (A B, B A, A B, ...)."""
    runs: list[Tree] = []
    for r in range(rounds):
        runs.extend(trees if r % 2 == 0 else reversed(trees))
    return runs


BENCHMARKS = ("latency", "replay_gaps")
"""What `main` alternates: `benchmarks.latency` or `benchmarks.replay_gaps`."""


def run_benchmark(
    tree: Tree, benchmark_args: Sequence[str], out: Path, benchmark: str = "latency"
) -> dict[str, Any]:
    """One run of `benchmarks.<benchmark>` from ``tree``, in a process of its own; its record."""
    env = dict(os.environ)
    paths = env.get("PYTHONPATH", "").split(os.pathsep)
    others = [p for p in paths if p and Path(p).resolve() != tree.folder]
    env["PYTHONPATH"] = os.pathsep.join([str(tree.folder), *others])
    if tree.commit:
        env["QACE_COMMIT"] = tree.commit
    command = [sys.executable, "-m", f"benchmarks.{benchmark}", *benchmark_args, "--out", str(out)]
    subprocess.run(command, cwd=tree.folder, env=env, check=True)
    return dict(json.loads(out.read_text()))


def summarize(names: Sequence[str], runs: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per in-process cell: each tree's p50 a round, median, range, and median over the first tree's."""
    p50s: dict[str, dict[str, list[float]]] = {}
    for name, report in runs:
        for cell in report["cells"]:
            if cell["path"] == "in-process" and "p50_ms" in cell:  # not a cell the run skipped
                key = f"{cell['variant']}_{cell['batch']}"
                p50s.setdefault(key, {n: [] for n in names})[name].append(round(cell["p50_ms"], 1))
    summary: dict[str, Any] = {}
    for key, by_tree in p50s.items():
        if not all(by_tree.values()):
            continue  # a cell some tree's runs skipped (their time limit)
        medians = {n: statistics.median(v) for n, v in by_tree.items()}
        summary[key] = {
            **{f"{n}_p50_ms": v for n, v in by_tree.items()},
            **{f"{n}_median_ms": round(m, 1) for n, m in medians.items()},
            **{f"{n}_range_ms": [min(v), max(v)] for n, v in by_tree.items()},
            **{f"{n}_over_{names[0]}": round(medians[n] / medians[names[0]], 3) for n in names[1:]},
        }
    return summary


def summarize_replays(names: Sequence[str], runs: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """`benchmarks.replay_gaps` runs: each tree's replay (median of its repeats, seconds) and kernel time
    (ms) a round, their medians and ranges, and each tree's median over the first tree's."""
    summary: dict[str, Any] = {}
    for key, field, unit, digits in (("replay", "replay_seconds", "s", 4), ("kernels", "kernel_ms", "ms", 1)):
        by_tree = {n: [round(float(r[field]), digits) for name, r in runs if name == n] for n in names}
        if not all(by_tree.values()):
            continue
        medians = {n: statistics.median(v) for n, v in by_tree.items()}
        summary[key] = {
            **{f"{n}_{unit}": v for n, v in by_tree.items()},
            **{f"{n}_median_{unit}": round(m, digits) for n, m in medians.items()},
            **{f"{n}_range_{unit}": [min(v), max(v)] for n, v in by_tree.items()},
            **{f"{n}_over_{names[0]}": round(medians[n] / medians[names[0]], 4) for n in names[1:]},
        }
    return summary


def main(argv: list[str] | None = None, runner: Callable[..., dict[str, Any]] = run_benchmark) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    own, benchmark_args = (
        (args_list[: args_list.index("--")], args_list[args_list.index("--") + 1 :])
        if "--" in args_list
        else (args_list, [])
    )
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", type=parse_tree, action="append", required=True, help="NAME=DIR[@COMMIT]")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", default="", help="what the trees differ in, for the record")
    parser.add_argument("--benchmark", choices=BENCHMARKS, default="latency", help="what each run times")
    args = parser.parse_args(own)
    names = [t.name for t in args.tree]
    if len(set(names)) != len(names) or len(names) < 2:
        parser.error("give two or more --tree entries with distinct names")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if any(a == "--out" or a.startswith("--out=") for a in benchmark_args):
        parser.error(f"benchmarks.{args.benchmark}'s --out is this driver's to set")
    runs: list[tuple[str, dict[str, Any]]] = []
    planned = order(args.tree, args.rounds)
    report: dict[str, Any] = {
        **record("benchmarks.ab_latency", argv),
        "note": args.note,
        "trees": {t.name: {"folder": str(t.folder), "commit": t.commit} for t in args.tree},
        "benchmark": args.benchmark,
        "arguments": benchmark_args,
        "order": [t.name for t in planned],
    }
    with tempfile.TemporaryDirectory(prefix="qace-ab-") as tmp:
        for i, tree in enumerate(planned):
            runs.append((tree.name, runner(tree, benchmark_args, Path(tmp) / f"run{i}.json", args.benchmark)))
            report["summary"] = (summarize if args.benchmark == "latency" else summarize_replays)(names, runs)
            report["runs"] = [{"tree": name, **run} for name, run in runs]
            args.out.write_text(json.dumps(report, indent=1) + "\n")  # what ran so far, if cut short
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
