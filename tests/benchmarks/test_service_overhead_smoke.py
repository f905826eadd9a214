"""``benchmarks/service_overhead.py``: runs in seconds on the CPU and writes a sane record (numbers are
not checked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("orjson")

from benchmarks import service_overhead  # noqa: E402


def test_smoke_run_writes_every_cell_and_the_json_section(tmp_path: Path) -> None:
    out = tmp_path / "overhead.json"
    argv = ["--batches", "4", "9", "--iterations", "4", "--rounds", "2", "--warmup", "1", "--out", str(out)]
    assert service_overhead.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["command"].startswith("python -m benchmarks.service_overhead --batches 4 9")
    assert report["versions"]["orjson"] and report["gpu"] is None
    assert [cell["batch"] for cell in report["cells"]] == [4, 9]
    for cell in report["cells"]:
        for path in ("in-process", "service:/v1/reward"):
            assert cell[path]["calls"] == 4 and 0 < cell[path]["min_ms"] <= cell[path]["p50_ms"]
        diff = cell["service:/v1/reward"]["p50_ms"] - cell["in-process"]["p50_ms"]
        assert cell["service_minus_in_process_p50_ms"] == pytest.approx(diff)
    section = report["json"]
    assert section["batch"] == 9 and set(section["median_ms"]) == {
        "wire_dumps", "json_dumps", "wire_loads", "json_loads"
    }  # fmt: skip
    assert section["bytes"]["wire"] > 0 and section["bytes"]["json"] > 0


def test_the_instant_reward_scores_every_caption_with_distinct_values() -> None:
    reward = service_overhead.InstantReward(seed=0)
    captions, ids = service_overhead.workload(5, seed=0)
    assert len(set(captions)) == 5 and all(i.startswith("COCO_val2014_") for i in ids)
    results = reward.score(captions, image_ids=ids)
    assert len(results) == 5 and all(r.valid and set(r.scores) == set(reward.components) for r in results)
    assert len({r.reward for r in results}) == 5 and results[0].reward == results[0].scores["qace"]
