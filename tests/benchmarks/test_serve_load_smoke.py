"""``benchmarks/serve_load.py --tiny``: concurrent clients against the real service on the CPU, one and two
batches at once; a sane report (numbers are not checked) whose rewards agree across the settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from benchmarks import serve_load  # noqa: E402


def test_every_setting_answers_every_request_with_the_same_rewards(
    tiny_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each setting starts from emptied engine caches, so none meets captions another left parsed."""
    resets: list[int] = []
    real_reset = serve_load.reset_caches
    monkeypatch.setattr(serve_load, "reset_caches", lambda scorer: (resets.append(1), real_reset(scorer)))
    out = tmp_path / "serve_load.json"
    argv = ["--tiny", "--clients", "3", "--requests", "2", "--warmup", "1", "--concurrency", "1", "2"]
    assert serve_load.main([*argv, "--out", str(out), "--models-dir", str(tiny_models)]) == 0
    report = json.loads(out.read_text())
    assert [c["concurrent_batches"] for c in report["cells"]] == [1, 2]
    for cell in report["cells"]:
        assert cell["requests"] == 6 and cell["captions_per_s"] > 0 and cell["p99_ms"] >= cell["p50_ms"]
        assert cell["service"]["qace_batched_items_total"] == 4 * 3 * (2 + 1)  # each request its own batch
        assert cell["service"]["qace_batches_total"] == 3 * (2 + 1)
    assert report["max_reward_difference_across_settings"] == 0.0
    assert report["commit"] and report["variant"] == "img"
    assert len(resets) == 2
