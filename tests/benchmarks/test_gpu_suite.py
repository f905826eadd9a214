"""``benchmarks/gpu_suite.py``: counts and failing ids from pytest's JUnit report, and the file-name tag."""

from __future__ import annotations

from pathlib import Path

from benchmarks.gpu_suite import gpu_tag, summarise

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.engine.test_a" name="test_ok[cuda]" time="0.1"/>
<testcase classname="tests.engine.test_a" name="test_bad"><failure message="x">boom</failure></testcase>
<testcase classname="tests.test_b" name="test_broken" time="0"><error message="fixture">err</error></testcase>
<testcase classname="tests.test_b" name="test_skipped" time="0"><skipped message="no GPU"/></testcase>
<testcase classname="tests.test_b" name="test_ok_too" time="0.2"><system-out>log</system-out></testcase>
</testsuite></testsuites>
"""


def test_summarise_counts_outcomes_and_names_failures(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    assert summarise(path) == {
        "passed": 2,
        "failed": 1,
        "errors": 1,
        "skipped": 1,
        "failing": ["tests/engine/test_a.py::test_bad", "tests/test_b.py::test_broken"],
    }


def test_gpu_tag() -> None:
    assert gpu_tag("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_tag("NVIDIA H200") == "h200"
    assert gpu_tag(None) == "cpu"
