"""``benchmarks/vqa_data.py`` and ``benchmarks/vqa_train.py`` with ``--tiny`` on the CPU: every section
runs and the report holds what the GPU run is read for."""

from __future__ import annotations

import json

import pytest

from benchmarks import vqa_data, vqa_train
from tests.helpers import SHARED_DATA


def test_vqa_data_benchmark_reports_engine_and_baseline(tmp_path) -> None:
    if not (SHARED_DATA / "pascal50s").is_dir():
        pytest.skip("PASCAL-50S not in the shared data")
    out = tmp_path / "vqa_data.json"
    argv = ["--tiny", "--out", str(out), "--captions", "12", "--warmup", "2", "--baseline-captions", "3"]
    assert vqa_data.main([*argv, "--chunk-size", "8", "--spacy-workers", "0"]) == 0
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m benchmarks.vqa_data --tiny")
    assert {"commit", "gpu", "versions", "settings"} <= set(report)
    engine, baseline = report["engine"], report["baseline"]
    assert engine["captions"] == 12 and baseline["captions"] == 3
    assert engine["triples"] >= engine["questions"] > 0  # every question kept, unanswerable ones added
    assert engine["triples_per_s"] == engine["triples"] / engine["seconds"]
    assert report["speedup_questions_per_s"] == engine["questions_per_s"] / baseline["questions_per_s"]
    assert engine["paper_1m_triples_s"] == vqa_data.PAPER_TRIPLES / engine["questions_per_s"]


def test_vqa_train_benchmark_reports_rates_and_the_projected_epoch(tmp_path) -> None:
    if not (SHARED_DATA / "pascal50s").is_dir():
        pytest.skip("PASCAL-50S not in the shared data")
    out = tmp_path / "vqa_train.json"
    assert vqa_train.main(["--tiny", "--out", str(out), "--triples", "32", "--baseline-triples", "16"]) == 0
    report = json.loads(out.read_text())
    assert {"commit", "gpu", "versions", "settings", "command"} <= set(report)
    engine, baseline = report["engine"], report["baseline"]
    assert engine["triples"] == 32 and baseline["triples"] == 16
    assert engine["steps"] == 4 and baseline["steps"] == 2  # batch 8 with --tiny
    assert baseline["bf16"] is False and baseline["workers"] == 0
    assert engine["epoch_900k_s"] == vqa_train.PAPER_TRAIN_TRIPLES / engine["samples_per_s"]
    assert report["speedup_vs_paper_epoch"] == vqa_train.PAPER_EPOCH_S / engine["epoch_900k_s"]
    assert report["speedup_vs_baseline"] == engine["samples_per_s"] / baseline["samples_per_s"]
