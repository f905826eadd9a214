"""The pytest side of `benchmarks.gpu_suite` (loaded with ``-p benchmarks.gpu_suite_plugin``): keep one
part of the selected tests, and log each test's outcome and seconds as it finishes.

Options it adds to pytest:

- ``--suite-part i/n``: keep the tests `assign` gives part ``i`` of ``n`` and deselect the others
  (after ``-m gpu`` and every other selection); default ``1/1``, every selected test.
- ``--suite-weights FILE``: a `benchmarks.gpu_suite` record whose ``durations`` weigh the split.
- ``--suite-log FILE``: JSON lines, written as the run goes: first ``{"part", "collected",
  "selected"}`` (every selected test id, and this part's), then one ``{"test", "outcome", "seconds"}``
  per finished test (outcome ``passed``, ``failed``, ``error`` or ``skipped``; seconds of setup, call
  and teardown together; a skipped test's ``reason`` too) or collection error.

Each finished test is also printed at once, as ``[ 3/57]    12.4 s  passed   tests/...::name``, so a
run cut by a time limit still shows which tests ran and how long each took.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import pytest


def parse_part(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)`` with ``1 <= i <= n``; anything else raises ValueError saying the form."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"a part is written i/n (e.g. 2/3), not {text!r}") from None
    if not 1 <= i <= n:
        raise ValueError(f"part {text}: i must be between 1 and n")
    return i, n


def file_of(test_id: str) -> str:
    """The file a test id names (``tests/a.py::test_x[1]`` -> ``tests/a.py``)."""
    return test_id.split("::", 1)[0]


def assign(test_ids: Iterable[str], n: int, seconds: Mapping[str, float]) -> dict[str, int]:
    """Each test id's part, 1 to ``n``: whole files (their module fixtures are built once), the
    heaviest first, each to the part with the least work so far (ties: the lower part). A file weighs
    its tests' ``seconds``; a test without one weighs the mean of those known (1 when none is).

    Deterministic: the same ids and seconds give the same parts, whatever their order; every id gets
    exactly one part.
    """
    ids = sorted(set(test_ids))
    known = [seconds[t] for t in ids if t in seconds]
    default = sum(known) / len(known) if known else 1.0
    weight: dict[str, float] = {}
    for t in ids:
        weight[file_of(t)] = weight.get(file_of(t), 0.0) + seconds.get(t, default)
    load = [0.0] * n
    part_of_file: dict[str, int] = {}
    for file in sorted(weight, key=lambda f: (-weight[f], f)):
        part = min(range(n), key=lambda p: (load[p], p))
        part_of_file[file] = part + 1
        load[part] += weight[file]
    return {t: part_of_file[file_of(t)] for t in ids}


def recorded_seconds(path: Path | None) -> dict[str, float]:
    """The ``durations`` of a `benchmarks.gpu_suite` record (none without a file or that key)."""
    if path is None or not path.is_file():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text()).get("durations", {}).items()}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpu suite", "benchmarks.gpu_suite: parts and a per-test log")
    group.addoption("--suite-part", default="1/1", help="run part i of n of the selected tests (i/n)")
    group.addoption("--suite-weights", default=None, help="a gpu_suite record whose durations weigh parts")
    group.addoption(
        "--suite-log", default=None, help="write each test's outcome and seconds here (JSON lines)"
    )


class _Log:
    """Collects each test's phases and writes the finished test to the terminal and the log file."""

    def __init__(self, config: pytest.Config, log: TextIO | None) -> None:
        self.config, self.log = config, log
        self.total, self.done = 0, 0
        self.outcome: dict[str, str] = {}
        self.seconds: dict[str, float] = {}
        self.reason: dict[str, str] = {}

    def write(self, entry: dict[str, Any]) -> None:
        if self.log is not None:
            self.log.write(json.dumps(entry) + "\n")
            self.log.flush()

    def finished(self, test: str, outcome: str, seconds: float, reason: str | None = None) -> None:
        self.done += 1
        entry: dict[str, Any] = {"test": test, "outcome": outcome, "seconds": round(seconds, 3)}
        if reason is not None:
            entry["reason"] = reason
        self.write(entry)
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            width = len(str(self.total))
            why = f"  ({reason})" if reason is not None else ""
            line = f"[{self.done:>{width}}/{self.total}] {seconds:7.1f} s  {outcome:<7}  {test}{why}"
            reporter.write_line(line)
            reporter.flush()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        i, n = parse_part(config.getoption("suite_part"))
        weights = config.getoption("suite_weights")
        parts = assign((item.nodeid for item in items), n, recorded_seconds(weights and Path(weights)))
        kept = [item for item in items if parts[item.nodeid] == i]
        dropped = [item for item in items if parts[item.nodeid] != i]
        self.write(
            {
                "part": f"{i}/{n}",
                "collected": [it.nodeid for it in items],
                "selected": [it.nodeid for it in kept],
            }
        )
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
        self.total = len(kept)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.finished(report.nodeid, "error", 0.0)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = report.nodeid
        self.seconds[test] = self.seconds.get(test, 0.0) + report.duration
        if report.failed:
            self.outcome[test] = "failed" if report.when == "call" else "error"
        elif report.skipped and test not in self.outcome:
            self.outcome[test] = "skipped"
            self.reason[test] = skip_reason(report)
        if report.when == "teardown":
            outcome = self.outcome.pop(test, "passed")
            self.finished(test, outcome, self.seconds.pop(test), self.reason.pop(test, None))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_report_teststatus(self, report: pytest.TestReport) -> Any:
        """No progress letters: the line each finished test gets says more."""
        outcome = yield
        category, _, word = outcome.get_result()
        outcome.force_result((category, "", word))


def skip_reason(report: pytest.TestReport) -> str:
    """Why a test skipped, as ``pytest -rs`` prints it (``Skipped: `` dropped)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("suite_log")
    log = Path(path).open("w", encoding="utf-8") if path else None  # noqa: SIM115 (closed at unconfigure)
    config.pluginmanager.register(_Log(config, log), "gpu_suite_log")


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.pluginmanager.get_plugin("gpu_suite_log")
    if plugin is not None and plugin.log is not None:
        plugin.log.close()
