"""Run the GPU test suite (``pytest -m gpu``) and record its outcome as JSON.

    python -m benchmarks.gpu_suite                       # writes benchmarks/results/gpu_suite_<gpu>.json
    python -m benchmarks.gpu_suite --out /tmp/suite.json -- -x tests/engine   # extra pytest arguments

The record names the commit (and whether the tree had uncommitted changes), the device, the torch and
CUDA versions, the pytest command, the passed/failed/skipped/error counts and the ids of the tests that
failed or errored. Exits with pytest's status, so a failing suite also fails the command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks.run_info import gpu_name, record

REPO = Path(__file__).resolve().parents[1]


def gpu_tag(name: str | None) -> str:
    """A short file-name tag for a device name: ``NVIDIA H100 80GB HBM3`` -> ``h100``; ``cpu`` without one."""
    if not name:
        return "cpu"
    for word in name.replace("-", " ").split():
        if word[:1].isalpha() and any(ch.isdigit() for ch in word):
            return word.lower()
    return name.split()[-1].lower()


def summarise(junit: Path) -> dict[str, Any]:
    """Counts and failing test ids from a pytest JUnit XML report."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failing: list[str] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome == "failure":
            counts["failed"] += 1
            failing.append(test_id)
        elif outcome == "error":
            counts["errors"] += 1
            failing.append(test_id)
        elif outcome == "skipped":
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failing": failing}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="default: benchmarks/results/gpu_suite_<gpu>.json")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)

    import torch

    gpu = gpu_name()
    out = Path(args.out or REPO / "benchmarks" / "results" / f"gpu_suite_{gpu_tag(gpu)}.json")
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gpu",
            "-q",
            f"--junitxml={junit}",
            *args.pytest_args,
        ]
        start = time.perf_counter()
        status = subprocess.run(command, cwd=REPO, env=os.environ.copy()).returncode
        seconds = time.perf_counter() - start
        if not junit.is_file():
            print(f"pytest wrote no report (exit status {status}); nothing recorded", file=sys.stderr)
            return status or 1
        summary = summarise(junit)
    result = {
        **record("benchmarks.gpu_suite", argv),
        "device": gpu or "cpu (no CUDA device: every gpu test skips)",
        "gpus_visible": torch.cuda.device_count(),
        "pytest_command": shlex.join(["python", "-m", "pytest", "-m", "gpu", "-q", *args.pytest_args]),
        "exit_status": status,
        "seconds": seconds,
        **summary,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
