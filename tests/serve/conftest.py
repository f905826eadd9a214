"""A reward service on 127.0.0.1 in a background thread, with a fake (model-free) reward by default."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from qace.reward import RewardResult, caption_problem  # noqa: E402
from qace.serve.app import ServeSettings, create_app  # noqa: E402

TOKEN = "test-token"


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
    import uvicorn

    app = create_app(reward, token=TOKEN, settings=ServeSettings(**settings))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):  # bounded: at most 10 s
        if server.started:
            break
        time.sleep(0.05)
    else:
        server.should_exit = True
        raise RuntimeError("reward server did not start within 10 s")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture()
def fake() -> FakeReward:
    return FakeReward()


@pytest.fixture()
def serve() -> Callable[..., Any]:
    return running
