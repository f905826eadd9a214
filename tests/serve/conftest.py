"""A reward service on 127.0.0.1 in a background thread, with a fake (model-free) reward by default."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from qace.reward import RewardResult, caption_problem  # noqa: E402
from qace.serve.app import ServeSettings, create_app  # noqa: E402
from qace.serve.local import serving  # noqa: E402

TOKEN = "test-token-0123456789"


class FakeReward:
    """Rewards len(caption)/100; ``gate`` (when cleared) holds every batch, to build a queue."""

    variant = "ref"
    signature = "fake|spec:1"

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.batches: list[int] = []

    def score(
        self,
        captions: list[Any],
        *,
        references: Any = None,
        image_ids: Any = None,
        max_chars: int | None = None,
    ) -> list[RewardResult]:
        self.gate.wait(10)
        self.batches.append(len(captions))
        out = []
        for caption in captions:
            reason = caption_problem(caption, max_chars)
            if reason:
                out.append(RewardResult(0.0, False, reason))
            else:
                value = len(caption) / 100
                out.append(RewardResult(value, True, None, {"qace": value, "qace_f1": 1.0}))
        return out


@contextmanager
def running(reward: Any, **settings: Any) -> Iterator[str]:
    """Serve ``reward`` on a free loopback port; yields the base URL; always stops the server."""
    with serving(
        create_app(reward, token=TOKEN, settings=ServeSettings(**settings)), start_timeout_s=10
    ) as url:
        yield url


@pytest.fixture()
def fake() -> FakeReward:
    return FakeReward()


@pytest.fixture()
def serve() -> Callable[..., Any]:
    return running
