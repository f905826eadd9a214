"""``benchmarks/host_ceiling.py`` on a few captions: instant runners keep the engine's outputs' shape,
and the report says what was measured."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import host_ceiling
from benchmarks.throughput import DATA
from benchmarks.workload import pascal_workload
from qace.kernels import bertscore


def test_report_and_rates(tiny_models: Path, tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    argv = ["--captions", "24", "--passes", "2", "--models-dir", str(tiny_models), "--out", str(out)]
    report = host_ceiling.main(argv)
    assert json.loads(out.read_text()) == report
    assert [r["variant"] for r in report["results"]] == ["img", "ref"]
    for result in report["results"]:
        assert len(result["passes_captions_per_s"]) == 2 and result["captions_per_s"] > 0
    assert report["workload"]["captions"] == report["workload"]["distinct_captions"] == 24
    assert report["command"].endswith(" ".join(argv)) and report["commit"]


def test_instant_runners_score_every_caption_with_questions(tiny_models: Path) -> None:
    records = pascal_workload(DATA, 12)
    for variant in ("img", "ref"):
        with host_ceiling.matching_on_meta():
            rows = list(host_ceiling.instant_scorer(tiny_models, variant).score_records(records))
        assert [r["id"] for r in rows] == [r.id for r in records]
        assert all(r["n_questions"] > 0 and 0 <= r["qace"] <= 1 for r in rows), rows
    assert bertscore._greedy_f1 is not host_ceiling._match_on_meta  # the patch ends with the block
