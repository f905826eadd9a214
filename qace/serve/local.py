"""Run the reward service inside this process, on a free loopback port, for as long as a block lasts.

For code that wants the real HTTP service next to itself rather than as a separate ``qace serve``
process: tests of the service, the latency benchmark, or a trainer that talks to its reward over HTTP.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serving(app: Any, *, start_timeout_s: float = 30.0, port: int = 0) -> Iterator[str]:
    """Serve ``app`` (an ASGI app) with uvicorn in a daemon thread on loopback ``port`` (0: a free one);
    yield its base URL; always stop it.

    Raises ``RuntimeError`` when the server has not started within ``start_timeout_s``.
    """
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="qace-reward-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(f"the reward service did not start within {start_timeout_s:g} s")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(start_timeout_s)
