"""``benchmarks/feature_reads.py --tiny``: both ways read the same arrays and the report says what ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import feature_reads


def test_tiny_run(tmp_path: Path) -> None:
    if not feature_reads.SAMPLE.is_file():
        pytest.skip(f"the real feature sample is missing: {feature_reads.SAMPLE}")
    out = tmp_path / "reads.json"
    feature_reads.main(["--tiny", "--out", str(out)])  # raises if the two ways' arrays differ
    report = json.loads(out.read_text())
    assert [r["images"] for r in report["results"]] == [4, 8]
    for r in report["results"]:
        assert len(r["ms_each"]["load"]) == len(r["ms_each"]["one_at_a_time"]) == 2 * 2  # rounds x calls
        assert r["speedup"] == r["ms"]["one_at_a_time"] / r["ms"]["load"]
    assert report["workload"]["images"] == 32 and report["settings"]["threads"] >= 1


def test_too_few_images_for_the_calls_is_refused(tmp_path: Path) -> None:
    if not feature_reads.SAMPLE.is_file():
        pytest.skip(f"the real feature sample is missing: {feature_reads.SAMPLE}")
    with pytest.raises(SystemExit, match="need --images of at least 34"):
        feature_reads.main(["--tiny", "--sizes", "17", "--out", str(tmp_path / "x.json")])
