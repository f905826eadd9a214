"""``benchmarks/clip.py --tiny``: runs on the CPU and writes a sane report (speed is not checked)."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("PIL")

from benchmarks import clip  # noqa: E402


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("clip-bench") / "clip.json"
    argv = ["--tiny", "--out", str(out), "--images", "4", "--captions", "12", "--baseline-captions", "4"]
    assert clip.main(argv) == 0
    return json.loads(out.read_text())


def test_report_has_both_passes_the_baseline_and_the_run_info(report: dict[str, Any]) -> None:
    assert report["command"].startswith("python -m benchmarks.clip --tiny --out ")
    assert (report["device"], report["gpu"], report["images"], report["captions"]) == ("cpu", None, 4, 12)
    ours = report["results"]["fp32"]
    assert ours["images_per_s"] > 0 and ours["captions_per_s"] > 0 and 0 <= ours["mean_clip_s"] <= 2.5
    assert ours["signature"].startswith("CLIP-S|clip:tiny-random-clip|w:2.5|prompt:A%20photo%20depicts|")
    assert report["target_captions_per_s"] == 20_000 and report["target_met"] is None  # tiny: no number
    assert "commit" in report and report["versions"]["torch"] and report["versions"]["transformers"]
    baseline = report["baseline_torchmetrics"]
    if baseline is not None:  # torchmetrics installed: the loop ran and agrees with ours at w=100
        assert baseline["captions"] == 4 and baseline["captions_per_s"] > 0
        assert baseline["max_abs_diff_at_w100"] <= 1e-3
        assert report["speedup_vs_torchmetrics"]["fp32"] > 0


def test_captions_are_distinct_and_seeded() -> None:
    texts = clip.captions(300)
    assert len(set(texts)) == 300 and texts == clip.captions(300) != clip.captions(300, seed=1)
