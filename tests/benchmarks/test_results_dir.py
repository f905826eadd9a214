"""``benchmarks/results/``: one current file per benchmark and device, each listed in benchmarks/README.md;
every result the README or docs cite exists and names the commit it ran at inside; history stays in git,
not in file names."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
COMMIT_IN_NAME = re.compile(r"_[0-9a-f]{7}(_|\.)")
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_"))
NAMES = "|".join(BENCHMARKS)
RESULT_NAME = re.compile(rf"`((?:{NAMES})[A-Za-z0-9_]*\.json)`(?! \(git history\))")
"""A result file cited as current: a benchmark's name, then anything, in backticks, not marked as git
history. Lines saying "not committed" name files a benchmark writes elsewhere."""


def cited_results(documents: list[Path], root: Path = ROOT) -> dict[str, set[str]]:
    """Result file name -> the documents citing it as current."""
    cited: dict[str, set[str]] = {}
    for doc in documents:
        for line in doc.read_text(encoding="utf-8").splitlines():
            if "not committed" not in line:
                for name in RESULT_NAME.findall(line):
                    cited.setdefault(name, set()).add(str(doc.relative_to(root)))
    return cited


def test_no_result_file_is_named_after_a_commit() -> None:
    named = sorted(p.name for p in RESULTS.iterdir() if COMMIT_IN_NAME.search(p.name))
    assert named == [], "git keeps history: keep one current file per benchmark and device"


def test_every_result_file_is_listed_in_the_benchmarks_readme() -> None:
    listed = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert sorted(p.name for p in RESULTS.glob("*.json") if f"`{p.name}`" not in listed) == []


def test_every_cited_result_exists_and_names_its_commit() -> None:
    documents = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    cited = cited_results(documents)
    assert "throughput_distinct_h100.json" in cited  # the check reads the citations it should
    missing = {name: docs for name, docs in cited.items() if not (RESULTS / name).is_file()}
    assert missing == {}
    without_commit = [
        name for name in sorted(cited) if not json.loads((RESULTS / name).read_text()).get("commit")
    ]
    assert without_commit == []


def test_the_citation_check_tells_history_from_current(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("now `latency_h100.json`; before `latency_h100_abc1234.json` (git history)\n")
    assert cited_results([doc], root=tmp_path) == {"latency_h100.json": {"doc.md"}}
