"""The reward service with the real engine (tiny test models): client rewards equal in-process rewards."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from qace.reward import QACEReward
from qace.serve.client import RewardClient

TOKEN = "test-token-0123456789"  # as in conftest.py
REFS = ["a girl in a red dress runs on the beach", "a child plays near the sea"]


def test_client_rewards_equal_in_process(test_models_dir: Path, serve) -> None:
    reward = QACEReward(models=test_models_dir)
    captions = ["a girl runs on the beach", "", "the the the", "a dog in the snow"]
    want = reward(captions, references=[REFS] * 4).tolist()
    with serve(reward) as url, RewardClient(url, TOKEN) as client:
        got = client.score(captions, references=[REFS] * 4)
        assert [r["reward"] for r in got] == pytest.approx(want, abs=1e-6)
        assert [r["valid"] for r in got] == [True, False, True, True]
        f1 = client.rewards(captions[:1], references=[REFS], component="qace_f1")
        assert f1 == pytest.approx([got[0]["scores"]["qace_f1"]])
        body = {"query": ["Caption: a girl runs on the beach"], "prompts": ["Caption: "], "labels": [REFS]}
        openrlhf = httpx.post(f"{url}/get_reward", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
        assert openrlhf.json()["rewards"] == pytest.approx(want[:1], abs=1e-6)
