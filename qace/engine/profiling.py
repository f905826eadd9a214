"""Stage timing for benchmarks: wall seconds per pipeline stage, synchronising the GPU when asked."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class StageTimer:
    """Seconds per named stage; ``sync`` (e.g. ``torch.cuda.synchronize``) makes GPU times honest."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            self.seconds[stage] += time.perf_counter() - start


@contextmanager
def _nothing(stage: str) -> Iterator[None]:
    yield


NO_TIMER: Callable[[str], object] = _nothing
"""Drop-in for a ``StageTimer`` when nobody is measuring."""


def cuda_sync() -> None:
    """Wait for the GPU's queued work (nothing to wait for without CUDA): a timer's honest ``sync``."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
