"""``benchmarks/scale_faults.py --tiny``: on a real local Ray cluster with two CPU actors, an actor killed
mid-run, the driver killed and the job resumed, and bad records in an input file each leave every record
exactly once in the output; and the count that says so can fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # from inside Ray Data

from benchmarks import scale_faults  # noqa: E402
from tests.helpers import run_benchmark  # noqa: E402

N = 64


@pytest.fixture(scope="module")
def report(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("faults") / "faults.json"
    argv = ["--tiny", "--n", str(N), "--out", str(out), "--models-dir", str(tiny_models)]
    done = run_benchmark("scale_faults", argv)  # a process of its own: the Ray driver ends with it
    assert out.exists(), done.stderr[-4000:]
    report = json.loads(out.read_text())
    assert done.returncode == 0, json.dumps(report["cases"], indent=1)[:4000]
    return report


def _exactly_once(case: dict[str, Any], records: int) -> None:
    assert case["records_in"] == case["rows_out"] == case["distinct_records_out"] == records
    assert (case["duplicates"], case["missing"]) == (0, 0)
    assert case["exactly_once"] and case["fault_injected"] and case["passed"]


def test_a_killed_actor_is_restarted_and_every_record_comes_out_once(report: dict[str, Any]) -> None:
    case = report["cases"]["actor_killed"]
    _exactly_once(case, N)
    killed = case["killed"]
    assert killed["batches_done_by_it"] >= 1 and killed["in_batch"] > killed["batches_done_by_it"]
    assert 0 < killed["rows_done_by_all"] < N  # mid-run
    assert killed["child_processes_outliving_it"] == 0
    assert case["actor_processes_seen"] == report["settings"]["actors"] + 1  # the restarted one
    assert killed["restarted_actor_ready_after_kill_seconds"] > 0
    assert case["error_rows"] == 0 and "error" not in case["job"]


def test_a_killed_driver_leaves_a_job_that_resumes_without_loss_or_duplicates(report: dict[str, Any]) -> None:
    case = report["cases"]["driver_killed"]
    _exactly_once(case, N)
    assert case["driver_exit_code"] == -9
    assert case["killed"]["rows_written_then"] < N  # mid-run
    done = case["rows_readable_before_resume"]
    assert case["killed"]["rows_written_then"] <= done <= N
    assert case["resume"]["skipped"] == done and case["resume"]["scored"] == N - done
    assert case["error_rows"] == 0


def test_bad_records_become_error_rows_and_the_job_goes_on(report: dict[str, Any]) -> None:
    case = report["cases"]["bad_records"]
    _exactly_once(case, N + len(scale_faults.BAD_LINES))
    assert case["error_rows"] == 2 and case["job"]["scored"] == N + 2
    reasons = sorted(e["error"] for e in case["errors"])
    assert "caption must be a string" in reasons[1] and "malformed JSON" in reasons[0]
    assert report["all_passed"] is True


def test_tally_counts_duplicates_and_missing_records(tmp_path: Path) -> None:
    """The check the cases rest on fails an output with a record twice and one missing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from qace.scale.ray_data import output_schema

    def part(name: str, lines: list[int]) -> None:
        rows = [{"id": f"r{line}", "source": "in.jsonl", "line": line, "qace": 0.5} for line in lines]
        pq.write_table(pa.Table.from_pylist(rows, schema=output_schema()), tmp_path / name)

    part("a.parquet", [1, 2])
    part("b.parquet", [2])
    got = scale_faults.tally(tmp_path, 3)
    assert (got["rows_out"], got["distinct_records_out"], got["duplicates"], got["missing"]) == (3, 2, 1, 1)
    assert got["exactly_once"] is False
