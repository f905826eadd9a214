"""``benchmarks/file_path.py`` on a few hundred records from the shared data (its default location)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import file_path


def test_few_records_report_every_stage_per_record(tmp_path: Path) -> None:
    out = tmp_path / "file_path.json"
    argv = ["--records", "300", "--repeats", "1", "--out", str(out)]
    assert file_path.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["command"] == "python -m benchmarks.file_path " + " ".join(argv)
    assert report["records"] == 300 and "commit" in report
    stages = ("read", "mark", "check", "add", "commit", "close", "score_file")
    assert all(report["us_per_record"][stage] > 0 for stage in stages)
