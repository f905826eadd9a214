"""``benchmarks/gpu_suite.py`` and its pytest plugin: the split into parts (every test in exactly one
part, whole files, deterministic, balanced), the per-test log, and the merge (complete only when every
part ran, at one commit, in a clean tree)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_suite import (
    REPO,
    child_env,
    merge,
    suite_digest,
    summarise,
    tree_digest,
    tree_files,
)
from benchmarks.gpu_suite_plugin import assign, parse_part
from benchmarks.run_info import gpu_tag

IDS = [
    "tests/a.py::test_one",
    "tests/a.py::test_two[x]",
    "tests/a.py::test_two[y]",
    "tests/b.py::test_b",
    "tests/c/test_c.py::test_c",
    "tests/c/test_c.py::TestK::test_k",
    "tests/d.py::test_d",
]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 9])
def test_every_test_is_in_exactly_one_part_and_files_stay_whole(n: int) -> None:
    parts = assign(IDS, n, {})
    assert sorted(parts) == sorted(IDS)
    assert set(parts.values()) <= set(range(1, n + 1))
    by_file: dict[str, set[int]] = {}
    for test, part in parts.items():
        by_file.setdefault(test.split("::")[0], set()).add(part)
    assert all(len(p) == 1 for p in by_file.values())


def test_the_split_does_not_depend_on_the_order_of_the_ids() -> None:
    seconds = {"tests/a.py::test_one": 30.0, "tests/d.py::test_d": 12.5}
    first = assign(IDS, 3, seconds)
    for order in itertools.islice(itertools.permutations(IDS), 0, 5000, 97):
        assert assign(order, 3, seconds) == first


def test_recorded_seconds_balance_the_parts() -> None:
    """Heaviest file first, each to the least loaded part; a test without a record weighs the recorded
    mean: here a.py's two others and c's two weigh 40 each (the mean of 100, 10, 10), so a.py weighs 90,
    c 80, b 100 and d 10."""
    seconds = {"tests/b.py::test_b": 100.0, "tests/a.py::test_one": 10.0, "tests/d.py::test_d": 10.0}
    files = {"a": "tests/a.py::test_one", "b": "tests/b.py::test_b", "c": "tests/c/test_c.py::test_c"}
    files["d"] = "tests/d.py::test_d"

    def parts(n: int) -> dict[str, int]:
        split = assign(IDS, n, seconds)
        return {name: split[test] for name, test in files.items()}

    assert parts(3) == {"b": 1, "a": 2, "c": 3, "d": 3}  # d joins the lightest: 80 < 90 < 100
    assert parts(2) == {"b": 1, "a": 2, "c": 2, "d": 1}  # c to 90 (not 100), then d to 100 (not 170)
    assert assign(IDS, 2, {}) != assign(IDS, 2, seconds)


@pytest.mark.parametrize("text", ["0/2", "3/2", "2", "a/b", "1/2/3"])
def test_a_part_is_i_of_n(text: str) -> None:
    with pytest.raises(ValueError, match="i/n|between 1 and n"):
        parse_part(text)
    assert parse_part("2/3") == (2, 3)


SUITE = {
    "test_one.py": "def test_pass():\n    pass\n\ndef test_fail():\n    assert 1 == 2\n",
    "test_two.py": (
        "import pytest\n\n@pytest.fixture\ndef broken():\n    raise RuntimeError('setup')\n\n"
        "def test_error(broken):\n    pass\n\n"
        "@pytest.mark.skip(reason='no GPU here')\ndef test_skip():\n    pass\n"
    ),
    "test_three.py": "import pytest\n\n@pytest.mark.parametrize('k', [1, 2, 3])\ndef test_p(k):\n    pass\n",
}


def _run_plugin(folder: Path, part: str) -> tuple[str, list[dict[str, Any]]]:
    log = folder / f"log{part.replace('/', 'of')}.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "benchmarks.gpu_suite_plugin", f"--suite-part={part}",
         f"--suite-log={log}", "-p", "no:cacheprovider", "-o", "console_output_style=classic"],
        cwd=folder, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    return done.stdout, [json.loads(line) for line in log.read_text().splitlines()]


def test_the_plugin_runs_each_part_once_and_logs_every_test_as_it_finishes(tmp_path: Path) -> None:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    runs = [_run_plugin(tmp_path, f"{i}/2") for i in (1, 2)]
    collected = runs[0][1][0]["collected"]
    assert len(collected) == 7 and runs[1][1][0]["collected"] == collected
    selected = [t for _, log in runs for t in log[0]["selected"]]
    assert sorted(selected) == sorted(collected)  # every test in exactly one part
    outcomes = {e["test"]: e["outcome"] for _, log in runs for e in log[1:]}
    assert outcomes == {
        "test_one.py::test_pass": "passed",
        "test_one.py::test_fail": "failed",
        "test_two.py::test_error": "error",
        "test_two.py::test_skip": "skipped",
        **{f"test_three.py::test_p[{k}]": "passed" for k in (1, 2, 3)},
    }
    reasons = {e["test"]: e["reason"] for _, log in runs for e in log[1:] if "reason" in e}
    assert reasons == {"test_two.py::test_skip": "no GPU here"}  # a skip says why, nothing else has one
    for stdout, log in runs:
        total = len(log[0]["selected"])
        for k, entry in enumerate(log[1:], start=1):
            assert f"[{k}/{total}]" in stdout and f"{entry['outcome']:<7}  {entry['test']}" in stdout
    assert runs[0][1] != runs[1][1] and _run_plugin(tmp_path, "1/2")[1][0] == runs[0][1][0]  # deterministic


def test_summarise_reads_the_plugin_log(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    lines = [
        {"part": "1/2", "collected": ["t::a", "t::b", "t::c", "u::d"], "selected": ["t::a", "t::b", "t::c"]},
        {"test": "t::a", "outcome": "passed", "seconds": 1.5},
        {"test": "t::b", "outcome": "error", "seconds": 9.0},
    ]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = summarise(log)
    assert summary == {
        "part": "1/2",
        "suite": suite_digest(["u::d", "t::c", "t::b", "t::a"]),
        "collected": 4,
        "selected": ["t::a", "t::b", "t::c"],
        "passed": 1,
        "failed": 0,
        "errors": 1,
        "skipped": 0,
        "failing": ["t::b"],
        "not_run": ["t::c"],
        "skipped_because": {},
        "durations": {"t::b": 9.0, "t::a": 1.5},
    }
    assert list(summary["durations"]) == ["t::b", "t::a"]  # slowest first


LOCAL = {
    "command": "python -m benchmarks.gpu_suite --merge p2.json p1.json",
    "commit": "c1",
    "clean": True,
    "tree": "T",
}


def _part(part: str, selected: list[str], **changes: Any) -> dict[str, Any]:
    record = {
        "command": f"python -m benchmarks.gpu_suite --part {part}",
        "commit": "c1",
        "dirty": False,
        "gpu": "NVIDIA H200",
        "device": "NVIDIA H200",
        "part": part,
        "pytest_args": [],
        "tree": "T",
        "suite": "S",
        "collected": 3,
        "selected": selected,
        "exit_status": 1,
        "seconds": 10.0,
        "passed": len(selected) - 1,
        "failed": 1,
        "errors": 0,
        "skipped": 0,
        "failing": selected[:1],
        "not_run": [],
        "durations": {t: float(len(t)) for t in selected},
    }
    return record | changes


def test_parts_of_one_commit_merge_into_one_complete_record() -> None:
    skips = {"b::z": "needs two GPUs", "b::y": "needs onnxruntime-gpu (pip install x) and a CUDA device"}
    parts = [_part("2/2", ["b::y", "b::z"], skipped_because=skips), _part("1/2", ["a::x"])]
    merged = merge(parts, LOCAL)
    assert merged["skipped_because"] == skips  # the expected skips (`EXPECTED_SKIPS`) keep it complete
    assert merged["complete"] is True and merged["incomplete_because"] == []
    assert (merged["commit"], merged["dirty"], merged["gpu"]) == ("c1", False, "NVIDIA H200")
    assert merged["command"] == LOCAL["command"]
    assert (merged["passed"], merged["failed"], merged["seconds"]) == (1, 2, 20.0)
    assert merged["failing"] == ["a::x", "b::y"]  # in part order
    assert list(merged["durations"]) == ["a::x", "b::y", "b::z"]  # slowest first, then by id
    assert [p["part"] for p in merged["parts"]] == ["1/2", "2/2"]


@pytest.mark.parametrize(
    ("parts", "reason"),
    [
        ([_part("1/2", ["a::x"])], "not 1/n to n/n"),
        ([_part("1/2", ["a::x"]), _part("1/2", ["b::y", "b::z"])], "not 1/n to n/n"),
        ([_part("1/2", ["a::x"]), _part("2/2", ["b::y", "b::z"], commit="c2")], "not at one named commit"),
        ([_part("1/1", ["a::x", "b::y", "b::z"], commit=None)], "not at one named commit"),
        ([_part("1/2", ["a::x"]), _part("2/2", ["b::y", "b::z"], device="NVIDIA H100")], "different devices"),
        ([_part("1/2", ["a::x", "b::y"]), _part("2/2", ["b::y", "b::z"])], "ran a test twice"),
        ([_part("1/2", ["a::x"]), _part("2/2", ["b::y", "b::z"], suite="S2")], "different suites"),
        ([_part("1/2", ["a::x"]), _part("2/2", ["b::y"])], "hold 2 of the suite's 3 tests"),
        ([_part("1/2", ["a::x"]), _part("2/2", ["b::y", "b::z"], not_run=["b::z"])], "stopped early"),
        ([_part("1/2", ["a::x"]), _part("2/2", ["b::y", "b::z"], exit_status=2)], "stopped early"),
        ([_part("1/1", ["a::x", "b::y", "b::z"], pytest_args=["-k", "x"])], "more pytest arguments"),
        ([_part("1/2", ["a::x"], dirty=True), _part("2/2", ["b::y", "b::z"])], "clean tree"),
        ([_part("1/2", ["a::x"], dirty=None, tree="T2"), _part("2/2", ["b::y", "b::z"])], "clean tree"),
        (
            [_part("1/2", ["a::x"]), _part("2/2", ["b::y", "b::z"], skipped_because={"b::z": "no data"})],
            "b::z (no data)",
        ),
    ],
)
def test_a_merge_is_incomplete_unless_every_part_ran_at_one_commit_in_a_clean_tree(
    parts: list[dict[str, Any]], reason: str
) -> None:
    merged = merge(parts, LOCAL)
    assert merged["complete"] is False and merged["dirty"] is None
    assert any(reason in why for why in merged["incomplete_because"]), merged["incomplete_because"]


def test_a_copy_without_git_metadata_is_clean_when_its_digest_is_this_clean_checkouts() -> None:
    """A GPU host's copy (dirty None): complete when its tree digest equals that of this checkout, clean
    at the same commit; not when this checkout is elsewhere or has changes."""
    parts = [_part("1/2", ["a::x"], dirty=None), _part("2/2", ["b::y", "b::z"], dirty=None)]
    assert merge(parts, LOCAL)["complete"] is True
    assert merge(parts, LOCAL | {"commit": "c0"})["complete"] is False
    full = "ea87d2c" + "0" * 33  # QACE_COMMIT named as git abbreviates it: at least 7 digits
    abbreviated = [p | {"commit": "ea87d2c"} for p in parts]
    assert merge(abbreviated, LOCAL | {"commit": full})["complete"] is True
    assert merge([p | {"commit": "ea87"} for p in parts], LOCAL | {"commit": full})["complete"] is False
    assert merge(parts, LOCAL | {"clean": False, "tree": None})["complete"] is False
    empty = _part("2/2", [], dirty=None, exit_status=5)  # a part that got no file: pytest's status 5
    assert merge([_part("1/2", ["a::x", "b::y", "b::z"]), empty], LOCAL)["complete"] is True


def test_the_tree_digest_covers_the_code_not_results_or_caches(tmp_path: Path) -> None:
    files = {
        "qace/a.py": "x = 1\n",
        "tests/test_a.py": "def test(): pass\n",
        "benchmarks/b.py": "",
        "pyproject.toml": "[project]\n",
    }
    ignored = {
        "benchmarks/results/r.json": "{}",
        "qace/__pycache__/a.cpython-312.pyc": "",
        "tests/.hidden/x": "",
        "qace.egg-info/PKG-INFO": "",
        "README.md": "",
    }
    for name, text in {**files, **ignored}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert tree_files(tmp_path) == sorted(files)
    before = tree_digest(tmp_path, tree_files(tmp_path))
    (tmp_path / "benchmarks/results/r.json").write_text('{"new": 1}')
    assert tree_digest(tmp_path, tree_files(tmp_path)) == before
    (tmp_path / "qace/a.py").write_text("x = 2\n")
    assert tree_digest(tmp_path, tree_files(tmp_path)) != before


def test_pytest_runs_unbuffered_and_keeps_its_bytecode() -> None:
    environ = {"PATH": "/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    kept = child_env(environ, bytecode_kept=True)
    assert kept == {"PATH": "/bin", "PYTHONUNBUFFERED": "1"}
    prefixed = child_env(environ, bytecode_kept=False)
    assert prefixed["PYTHONPYCACHEPREFIX"] == str(REPO / ".qace-cache" / "pycache")
    assert child_env({"PYTHONPYCACHEPREFIX": "/x"}, bytecode_kept=False)["PYTHONPYCACHEPREFIX"] == "/x"


def test_gpu_tag() -> None:
    assert gpu_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_tag("NVIDIA H200") == "h200"
    assert gpu_tag(None) == "cpu"
