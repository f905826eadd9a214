"""``benchmarks/regen.py --tiny``: runs on the CPU and writes a sane report (speed is not checked)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers")

from benchmarks import regen  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("regen-bench") / "regen.json"
    cache = os.environ.get("QACE_REGEN_TEST_MODELS") or REPO_ROOT / ".qace-cache" / "regen-test-models"
    assert regen.main(["--tiny", "--out", str(out), "--models-dir", str(cache)]) == 0
    return json.loads(out.read_text())


def test_report_has_both_rates_and_the_settings(report: dict[str, Any]) -> None:
    assert report["command"].startswith("python -m benchmarks.regen --tiny --out ")
    assert (report["device"], report["gpu"], report["precision"]) == ("cpu", None, "fp32")
    assert (report["steps"], report["size"], report["batch"]) == (2, 32, 4)
    assert (report["captions_batched"], report["captions_sequential"]) == (12, 4)
    rates = report["images_per_s"]
    assert rates["batched"] > 0 and rates["sequential"] > 0
    assert report["ratio"] == pytest.approx(rates["batched"] / rates["sequential"], rel=1e-2)
    assert report["target_ratio"] == 3.0 and report["target_met"] is None  # a tiny run is not a number
    assert report["signature"].startswith("Regen|gen:tiny-random|enc:tiny-random|steps:2|size:32|")
    assert all(report["versions"][name] for name in ("torch", "diffusers", "transformers"))


def test_batching_does_not_change_the_scores(report: dict[str, Any]) -> None:
    # fp32 on the CPU, same seeds per caption: only float rounding differs with the batch size
    assert report["max_abs_diff_batched_vs_sequential"] <= 1e-5
    assert report["nonfinite_images"] == 0
    assert -1.0 <= report["mean_regen"] <= 1.0


def test_captions_are_distinct_and_seeded() -> None:
    texts = regen.captions(50)
    assert len(set(texts)) == 50 and texts == regen.captions(50) != regen.captions(50, seed=1)
