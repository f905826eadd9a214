"""``benchmarks/features.py --tiny``: both paths run on the CPU and report completely (numbers unchecked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import features

pytest.importorskip("PIL")


def test_tiny_features_benchmark_writes_its_report(tmp_path: Path) -> None:
    out = tmp_path / "features.json"
    features.main(
        ["--tiny", "--images", "2", "--loop-images", "1", "--batch-size", "2", "--profile", "--out", str(out)]
    )
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m benchmarks.features --tiny")
    assert report["batched"]["extracted"] == 2 and report["batched"]["errors"] == 0
    assert report["loop"]["images"] == 1 and report["loop"]["images_per_s"] > 0
    assert report["speedup"] > 0 and report["precision"] == "fp32"  # the CPU default
    batched = report["batched"]
    assert 0 < batched["start_s"] < batched["seconds"]
    assert batched["steady_images_per_s"] >= batched["images_per_s"] and report["speedup_steady"] > 0
    assert report["weights"].startswith("random") and report["ops_backend"] in ("torchvision", "torch")
    assert set(report["versions"]) == {"python", "torch", "cuda", "qace", "torchvision"}
    stages = ["upload", "backbone", "rpn", "roi_pool", "res5", "select", "host", "total"]
    assert list(report["stage_ms"]) == stages and all(v >= 0 for v in report["stage_ms"].values())
    parts = report["pipeline_parts"]
    assert parts["writer_images"] == 2 and parts["writer_ms_per_image"] > 0
    assert parts["loader_images_per_s"] > 0
