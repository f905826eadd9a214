"""The service serves any registered scorer as a reward: VisCE² on the tiny test VLM, and a metric added
with one module and one entry (`tests.toy_scorer`). QACE's own service: test_serve_api.py and
test_serve_models.py."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from qace import scorers
from qace.reward import ScorerReward
from qace.serve.app import create_app
from tests.toy_scorer import registered

TOKEN = "test-token-0123456789"  # as in conftest.py
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IMAGES = Path(__file__).resolve().parents[2] / "qace" / "examples" / "images"
CAPTIONS = ["a girl in a red dress on the beach", "", "a dog runs on the grass", "a red bike", "two cats"]


@pytest.fixture(scope="module")
def visce2_reward(test_vlm_dir: Path) -> ScorerReward:
    pytest.importorskip("PIL")
    settings = {"model": str(test_vlm_dir), "context_tokens": 16, "expected": True, "progress": False}
    return scorers.get("visce2").build_reward("cpu", **settings)


def test_the_service_serves_visce2_rewards(visce2_reward: ScorerReward) -> None:
    images = sorted(str(path) for path in IMAGES.glob("*.png"))
    items = [{"id": f"c{i}", "caption": c, "image": images[i % len(images)]} for i, c in enumerate(CAPTIONS)]
    with TestClient(create_app(visce2_reward, token=TOKEN)) as client:
        got = client.post("/v1/reward", json={"request_id": "r1", "items": items}, headers=AUTH).json()
        label = {"query": [f"Caption: {CAPTIONS[0]}"], "prompts": ["Caption: "], "labels": [images[0]]}
        openrlhf = client.post("/get_reward?extra_logs=1", json=label, headers=AUTH).json()
        no_image = {"request_id": "r2", "items": [{"id": "x", "caption": "a dog"}]}
        (no_image_result,) = client.post("/v1/reward", json=no_image, headers=AUTH).json()["results"]
    assert got["signature"] == visce2_reward.signature and got["component"] == "visce2"
    assert [r["id"] for r in got["results"]] == [item["id"] for item in items]
    scorable = [i for i, caption in enumerate(CAPTIONS) if caption]
    want = visce2_reward.scorer.score([CAPTIONS[i] for i in scorable], [items[i]["image"] for i in scorable])
    results = [got["results"][i] for i in scorable]
    for result, row in zip(results, want, strict=True):
        if "error" in row:  # the test VLM's answer holds no rating: unscorable, not a crash
            assert not result["valid"] and result["reward"] == 0.0 and result["reason"] == row["error"]
        else:
            assert result["valid"] and result["reward"] == row["visce2"]
            assert result["scores"]["visce2"] == row["visce2"]
    assert not got["results"][1]["valid"] and "empty" in got["results"][1]["reason"]
    assert openrlhf["rewards"] == [got["results"][0]["reward"]]
    assert set(openrlhf["extra_logs"]) == {"visce2_expected", "visce2_valid"}
    assert not no_image_result["valid"]  # its own item only
    assert no_image_result["reason"] == "image must be a file path on the server, got null"


def test_qace_serve_metric_visce2_builds_the_judges_reward(test_vlm_dir: Path, monkeypatch) -> None:
    pytest.importorskip("PIL")
    from qace.serve.cli import register

    seen: dict = {}
    monkeypatch.setattr("qace.serve.app.create_app", lambda reward, **k: seen.update(reward=reward, **k))
    monkeypatch.setattr("qace.serve.cli.serve", lambda *a, **k: None)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    argv = [
        "serve",
        "--port",
        "0",
        "--metric",
        "visce2",
        "--vlm",
        str(test_vlm_dir),
        "--visce2-context-tokens",
        "16",
    ]
    args = parser.parse_args([*argv, "--token", TOKEN, "--component", "visce2_expected", "--visce2-expected"])
    assert args.func(args) == 0
    reward = seen["reward"]
    assert isinstance(reward, ScorerReward) and reward.reads == "image"
    assert reward.component == "visce2_expected" and reward.scorer.config.context_tokens == 16
    assert reward.signature.startswith("VisCE2|")


def test_the_service_serves_a_registered_toy_metric() -> None:
    with registered() as entry:
        reward = entry.build_reward(invalid_reward=-1.0)
    items = [{"id": str(i), "caption": c} for i, c in enumerate(["a dog runs", "", "one"])]
    with TestClient(create_app(reward, token=TOKEN)) as client:
        got = client.post("/v1/reward", json={"request_id": "r", "items": items}, headers=AUTH).json()
        one = {"query": ["Say: two words"], "prompts": ["Say: "]}
        openrlhf = client.post("/get_reward?extra_logs=1", json=one, headers=AUTH).json()
        wrong = client.post("/v1/reward", json={"request_id": "r", "items": items, "component": "qace"},
                            headers=AUTH)  # fmt: skip
    assert [r["reward"] for r in got["results"]] == [3.0, -1.0, 1.0]
    assert openrlhf == {"rewards": [2.0], "scores": [2.0], "extra_logs": {"length_valid": 1.0}}
    assert wrong.status_code == 422 and "choose one of length" in wrong.json()["detail"]
