"""Benchmark hooks behind one seam: forced outputs, profiling and stage timing, off unless attached.

Production classes carry no benchmark switches. A benchmark attaches `Instruments` to the runner or
scorer it measures (`attach`, or `attached` for a block); runners and scorers look theirs up with `of`
once per batch or chunk and get `NOTHING` (every hook off) unless some were attached: with nothing
attached anywhere the lookup is one test of an empty table. Hooks are held by a weak reference to their
target, so they go when it goes.

Hooks, and who reads them:

- ``force_tokens`` (the PyTorch and ONNX runners): ``(batch, steps) -> (B, steps)`` token ids each row
  emits instead of its argmax, so random-weight models stop at realistic lengths with all the work done;
- ``full_length`` (`qace.judges.vlm.VLMRunner`): every answer runs to ``max_new_tokens`` (EOS suppressed);
- ``profile`` (the PyTorch runner): a `StageTimer` that the runner adds its ``encoder`` and ``decoder``
  seconds to, synchronising the device around each and not overlapping batches (it costs a little);
- ``timer`` (the `qace.api.QACE` scorer): a `StageTimer` (or any ``stage -> context manager``) around
  each pipeline stage: prepare (reading and checking the next chunk, in the prefetch thread), candidates
  (waiting for its answer candidates), questions, answers, bertscore, token_f1;
- ``requests`` (`qace.engine.core.DeviceCore`): a list the core appends each request it runs to, as
  ``(name, payload)`` before its features are gathered, so that the device work of a pass can be
  replayed alone (`benchmarks.throughput`'s models-alone rate).
"""

from __future__ import annotations

import gc
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any


class StageTimer:
    """Seconds per named stage, wall (``seconds``) and the CPU time of the thread that ran it
    (``cpu_seconds``: a wall well above it is time spent waiting, for the GPU or the interpreter lock);
    ``sync`` (e.g. ``torch.cuda.synchronize``) makes GPU times honest. Stages may run in several threads."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu_seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            self.seconds[stage] += time.perf_counter() - start
            self.cpu_seconds[stage] += time.thread_time() - cpu


class CollectorPauses:
    """The cyclic garbage collector's collections and the seconds they paused the process, counted from
    construction until `close` (through ``gc.callbacks``), in all and by the oldest generation collected
    (``by_generation``: generation -> [collections, seconds]; a generation-2 collection walks every
    object the process holds)."""

    def __init__(self) -> None:
        self.count, self.seconds, self._start = 0, 0.0, 0.0
        self.by_generation: dict[int, list[float]] = {}
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            seconds = time.perf_counter() - self._start
            self.count += 1
            self.seconds += seconds
            entry = self.by_generation.setdefault(int(info["generation"]), [0, 0.0])
            entry[0] += 1
            entry[1] += seconds

    def close(self) -> None:
        """Stop counting."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)


@contextmanager
def _nothing(stage: str) -> Iterator[None]:
    yield


NO_TIMER: Callable[[str], AbstractContextManager[Any]] = _nothing
"""Drop-in for a ``StageTimer`` when nobody is measuring."""


@dataclass(frozen=True)
class Instruments:
    """The benchmark hooks of one runner or scorer (see the module docstring); all off by default."""

    force_tokens: Callable[[Any, int], Any] | None = None
    full_length: bool = False
    profile: StageTimer | None = None
    timer: Callable[[str], AbstractContextManager[Any]] = NO_TIMER
    requests: list[tuple[str, Any]] | None = None


NOTHING = Instruments()
_ATTACHED: weakref.WeakKeyDictionary[object, Instruments] = weakref.WeakKeyDictionary()


def of(target: object) -> Instruments:
    """The hooks attached to ``target``; `NOTHING` when none are."""
    if not _ATTACHED:
        return NOTHING
    return _ATTACHED.get(target, NOTHING)


def attach(target: object, **hooks: Any) -> Instruments:
    """Set ``hooks`` (fields of `Instruments`) on ``target``, keeping the ones already attached; returns
    what was attached before."""
    before = of(target)
    _ATTACHED[target] = replace(before, **hooks)
    return before


@contextmanager
def attached(target: object, **hooks: Any) -> Iterator[Instruments]:
    """`attach` for a block: the hooks ``target`` had before come back when it ends."""
    before = attach(target, **hooks)
    try:
        yield of(target)
    finally:
        if before is NOTHING:
            _ATTACHED.pop(target, None)
        else:
            _ATTACHED[target] = before


def cuda_sync() -> None:
    """Wait for the GPU's queued work (nothing to wait for without CUDA): a timer's honest ``sync``."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
