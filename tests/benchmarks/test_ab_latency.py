"""`benchmarks.ab_latency`: trees alternated round by round, each run from its own tree, cells summarised."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import ab_latency
from benchmarks.ab_latency import Tree, order, parse_tree

REPO = Path(__file__).resolve().parents[2]


def test_rounds_alternate_the_order() -> None:
    a, b = Tree("a", REPO), Tree("b", REPO)
    assert [t.name for t in order([a, b], 3)] == ["a", "b", "b", "a", "a", "b"]


def test_a_tree_names_its_folder_and_maybe_its_commit() -> None:
    assert parse_tree(f"main={REPO}") == Tree("main", REPO, None)
    assert parse_tree(f"main={REPO}@abc123") == Tree("main", REPO, "abc123")
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=DIR"):
        parse_tree(str(REPO))
    with pytest.raises(argparse.ArgumentTypeError, match="no benchmarks/latency.py"):
        parse_tree(f"x={REPO / 'docs'}")


def _report(p50: dict[tuple[str, int], float | None]) -> dict[str, Any]:
    """A latency record's cells; a None p50 is a cell the run skipped, written as `benchmarks.latency`
    writes one (no timings)."""
    cells = [
        {"variant": v, "batch": n, "path": "in-process"}
        | ({"skipped": "time budget of 80 s spent"} if ms is None else {"p50_ms": ms})
        for (v, n), ms in p50.items()
    ]
    service = {"variant": "img", "batch": 64, "path": "service", "p50_ms": 1.0}
    return {"commit": "x", "cells": [*cells, service]}


def test_each_cell_gets_every_trees_rounds_median_and_ratio(tmp_path: Path) -> None:
    times = {  # (tree, round) -> img 64 p50; the branch's second round alone skipped ref 256
        ("a", 0): 80.0, ("b", 0): 70.0, ("b", 1): 72.0, ("a", 1): 90.0,
    }  # fmt: skip
    seen: list[tuple[str, list[str]]] = []

    def fake(tree: Tree, arguments: list[str], out: Path, benchmark: str) -> dict[str, Any]:
        assert benchmark == "latency"
        r = sum(name == tree.name for name, _ in seen)
        seen.append((tree.name, arguments))
        skipped = tree.name == "b" and r == 1
        cells = {("img", 64): times[tree.name, r], ("ref", 256): None if skipped else 300.0}
        if tree.name == "a" and r == 1:
            cells["ref", 1024] = None  # every run of a skipped it or had no such cell
        return _report(cells)

    out = tmp_path / "ab.json"
    argv = ["--tree", f"a={REPO}", "--tree", f"b={REPO}@c0ffee", "--rounds", "2", "--out", str(out)]
    assert ab_latency.main([*argv, "--", "--tiny", "--batches", "4"], runner=fake) == 0
    assert seen == [(n, ["--tiny", "--batches", "4"]) for n in ("a", "b", "b", "a")]
    report = json.loads(out.read_text())
    assert report["order"] == ["a", "b", "b", "a"] and report["trees"]["b"]["commit"] == "c0ffee"
    assert [run["tree"] for run in report["runs"]] == ["a", "b", "b", "a"]
    cell = report["summary"]["img_64"]
    assert cell["a_p50_ms"] == [80.0, 90.0] and cell["b_p50_ms"] == [70.0, 72.0]
    assert cell["a_median_ms"] == 85.0 and cell["b_range_ms"] == [70.0, 72.0]
    assert cell["b_over_a"] == round(71.0 / 85.0, 3)
    assert report["summary"]["ref_256"]["b_p50_ms"] == [300.0]  # one round of b had it
    assert set(report["summary"]) == {"img_64", "ref_256"}  # the service path is not summarised


def test_the_driver_sets_the_runs_outputs(tmp_path: Path) -> None:
    argv = ["--tree", f"a={REPO}", "--tree", f"b={REPO}", "--out", str(tmp_path / "x.json")]
    with pytest.raises(SystemExit):
        ab_latency.main([*argv, "--", "--out", "elsewhere.json"], runner=lambda *a: {})
    with pytest.raises(SystemExit):
        ab_latency.main(["--tree", f"a={REPO}", "--out", str(tmp_path / "x.json")], runner=lambda *a: {})


def test_real_runs_from_each_tree(tmp_path: Path) -> None:
    """One round of two trees (this checkout twice), each a tiny `benchmarks.latency` run of its own."""
    out = tmp_path / "ab.json"
    argv = ["--tree", f"a={REPO}", "--tree", f"b={REPO}", "--rounds", "1", "--out", str(out)]
    tiny = ["--tiny", "--no-service", "--variants", "ref", "--batches", "4", "--iterations", "2"]
    assert ab_latency.main([*argv, "--", *tiny]) == 0
    report = json.loads(out.read_text())
    assert [run["tree"] for run in report["runs"]] == ["a", "b"]
    assert all(run["tiny"] is True for run in report["runs"])
    cell = report["summary"]["ref_4"]
    assert len(cell["a_p50_ms"]) == len(cell["b_p50_ms"]) == 1 and cell["b_over_a"] > 0


def test_replays_get_every_trees_rounds_median_and_ratio(tmp_path: Path) -> None:
    replays = {("a", 0): 0.88, ("b", 0): 0.85, ("b", 1): 0.843, ("a", 1): 0.86}
    seen: list[tuple[str, str]] = []

    def fake(tree: Tree, arguments: list[str], out: Path, benchmark: str) -> dict[str, Any]:
        r = sum(name == tree.name for name, _ in seen)
        seen.append((tree.name, benchmark))
        return {"replay_seconds": replays[tree.name, r], "kernel_ms": 690.0 + r}

    out = tmp_path / "ab.json"
    argv = ["--benchmark", "replay_gaps", "--tree", f"a={REPO}", "--tree", f"b={REPO}", "--rounds", "2"]
    assert ab_latency.main([*argv, "--out", str(out), "--", "--tiny"], runner=fake) == 0
    assert seen == [(n, "replay_gaps") for n in ("a", "b", "b", "a")]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "replay_gaps" and report["arguments"] == ["--tiny"]
    replay = report["summary"]["replay"]
    assert replay["a_s"] == [0.88, 0.86] and replay["b_median_s"] == 0.8465
    assert replay["b_over_a"] == round(0.8465 / 0.87, 4)
    assert report["summary"]["kernels"]["b_ms"] == [690.0, 691.0]
