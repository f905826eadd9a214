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
    argv += ["--call-sizes", "4", "8", "--calls", "3"]
    report = host_ceiling.main(argv)
    assert json.loads(out.read_text()) == report
    assert [r["variant"] for r in report["results"]] == ["img", "ref"]
    for result in report["results"]:
        assert len(result["passes_captions_per_s"]) == 2 and result["captions_per_s"] > 0
        # 24 captions hold 3 calls of 4 after the warm-up call, but only 2 of 8
        assert [(c["size"], c["calls"]) for c in result["calls"]] == [(4, 3), (8, 2)]
        assert all(0 < c["min_ms"] <= c["p50_ms"] for c in result["calls"])
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


def test_each_call_meets_captions_no_earlier_call_met(tiny_models: Path, monkeypatch) -> None:
    """The timed calls of one size score disjoint slices after a warm-up call on another, from emptied
    caches, as a latency cell does."""
    records = pascal_workload(DATA, 20)
    scorer = host_ceiling.instant_scorer(tiny_models, "img")
    with host_ceiling.matching_on_meta():
        list(scorer.score_records(records))  # parsed, as `measure` leaves them
    seen: list[list[str]] = []
    resets: list[int] = []
    score_records = scorer.score_records
    monkeypatch.setattr(
        scorer, "score_records", lambda recs: (seen.append([r.id for r in recs]), score_records(recs))[1]
    )
    monkeypatch.setattr(host_ceiling, "reset_caches", lambda s: resets.append(len(seen)))
    call = host_ceiling.measure_calls(scorer, records, 5, 10)
    assert call["calls"] == 3 and resets == [0]
    assert seen == [[r.id for r in records[i : i + 5]] for i in (0, 5, 10, 15)]
