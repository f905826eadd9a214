"""The reward service on the engine core with host processes (the default on a GPU; forced here on the
CPU): short reward requests sent while a long one is being scored are answered, and every reward equals
the one the same caption gets alone."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from qace.reward import QACEReward
from qace.serve.app import ServeSettings, create_app
from qace.serve.client import RewardClient
from qace.serve.local import serving

TOKEN = "engine-core-test-token-0123456789"
REFS = ["a brown dog running in a field", "people riding horses on a beach"]
WORDS = ["dog", "cat", "horse", "girl", "man", "bird", "car", "boat"]


@pytest.fixture(scope="module")
def service(test_models_dir: Path) -> Iterator[tuple[str, QACEReward]]:
    reward = QACEReward(models=test_models_dir, host_workers=2, chunk_size=8, progress=False)
    reward.scorer.start_host_processes(wait=True)
    assert reward.scorer.host is not None and reward.scorer.host.size == 2
    settings = ServeSettings(max_items=512, max_queue=4096, max_body_bytes=1 << 20, max_batch=512)
    try:
        with serving(create_app(reward, token=TOKEN, settings=settings)) as url:
            yield url, reward
    finally:
        reward.scorer.close()


def test_short_requests_during_a_long_one_are_served_and_equal_alone(service: tuple[str, QACEReward]) -> None:
    url, _ = service
    client = RewardClient(url, TOKEN, retries=0)
    long_captions = [f"a {WORDS[i % 8]} runs near the {WORDS[(i + 3) % 8]} number {i}" for i in range(120)]
    short = [[f"a {w} sits on a bench", f"two {w}s play"] for w in WORDS[:6]]
    with ThreadPoolExecutor(7) as pool:
        long_job = pool.submit(client.rewards, long_captions, references=[REFS] * len(long_captions))
        short_jobs = [pool.submit(client.rewards, pair, references=[REFS] * 2) for pair in short]
        short_rewards = [job.result(timeout=300) for job in short_jobs]
        long_rewards = long_job.result(timeout=300)
    assert len(long_rewards) == len(long_captions)
    # alone: each request by itself, after the others (batched with no one); float rounding only
    for pair, rewards in zip(short, short_rewards, strict=True):
        assert client.rewards(pair, references=[REFS] * 2) == pytest.approx(rewards, abs=2e-6)
    for i in (0, 57, 119):
        alone = client.rewards([long_captions[i]], references=[REFS])
        assert alone == pytest.approx([long_rewards[i]], abs=2e-6)
