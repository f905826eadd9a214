"""Micro-batching with a bounded queue: many small requests, one engine call per batch.

Trainers often send one sample per request; scoring them one by one would leave the GPU idle.
Requests wait in a queue; a worker takes the first one, gathers more for at most ``max_wait_s`` or
until ``max_batch`` items, scores them in one call on a worker thread (so the event loop keeps
answering health checks and rejecting excess load), then resolves every request. With
``concurrency`` above one, that many batches are scored at once on as many threads: the next batch's
host work (spaCy, tokenising, comparing answers) runs while the one before it is on the device, where
the engine's device lock keeps their model stages taking turns (`qace.engine.device_lock`). A batch's
results do not depend on what runs beside it.

Back-pressure instead of hangs: admission counts queued items, and a request that would push the
count past ``max_queue`` is refused at once (`Overloaded` -> HTTP 429 with Retry-After); a request
that waits longer than ``timeout_s`` is abandoned (`Unavailable` -> HTTP 503 with Retry-After) and
skipped if the worker reaches it later. An empty request is answered at once with no results.

One item never fails the others: when scoring a batch raises, its halves are scored apart, down to
single items, and an item that fails alone gets ``on_error(item, exc)`` as its result (the service's
invalid reward, with the reason). No exception leaves the worker, so it serves until it is stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from qace.errors import QACEError

log = logging.getLogger(__name__)


class Overloaded(QACEError):
    """The queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(Overloaded):
    """The service is stopping, or the request waited too long; retry after ``retry_after`` seconds."""


@dataclass(frozen=True)
class Item:
    """One caption to reward, with its context (references, an image id or an image file)."""

    caption: Any
    image_id: str | None = None
    references: tuple[str, ...] | None = None
    image: str | None = None
    problem: str | None = None
    """Why the item cannot be scored, found as it was read (it is then rewarded as invalid), or None."""


@dataclass
class _Request:
    items: Sequence[Item]
    future: asyncio.Future[list[Any]]
    enqueued: float = field(default_factory=time.monotonic)


@dataclass
class Stats:
    """Counters for the metrics endpoint (only the event-loop thread writes them)."""

    batches: int = 0
    batched_items: int = 0
    rejected: int = 0
    timed_out: int = 0
    failed: int = 0
    """Batches whose scoring raised (their items were then scored apart)."""
    failed_items: int = 0
    """Items that could not be scored even alone (rewarded as invalid)."""
    score_seconds: float = 0.0
    queued_items: int = 0


ScoreFn = Callable[[list[Item]], list[Any]]
ErrorFn = Callable[[Item, Exception], Any]


class MicroBatcher:
    """Collect requests into batches for ``score_fn`` (one list of items in, one result per item out);
    ``on_error(item, exc)`` is the result of an item that fails alone (see the module docstring)."""

    def __init__(
        self,
        score_fn: ScoreFn,
        *,
        on_error: ErrorFn,
        max_batch: int = 64,
        max_wait_s: float = 0.005,
        max_queue: int = 1024,
        timeout_s: float = 60.0,
        retry_after_s: float = 1.0,
        concurrency: int = 1,
    ) -> None:
        if max_batch < 1 or max_queue < 1 or concurrency < 1 or timeout_s <= 0:
            raise QACEError("max_batch, max_queue and concurrency must be positive, timeout_s above zero")
        self.score_fn, self.on_error = score_fn, on_error
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
        self.timeout_s, self.retry_after_s = timeout_s, retry_after_s
        self.concurrency = concurrency
        self.stats = Stats()
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: dict[asyncio.Task[None], list[_Request]] = {}
        """Each batch being scored, by the task scoring it."""
        self._gathering: list[_Request] = []
        """The batch being gathered (taken from the queue, not yet scored)."""

    @property
    def running(self) -> bool:
        return self._worker is not None and not self._worker.done()

    async def start(self) -> None:
        """Start the worker on the running event loop (call from the app's lifespan)."""
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="qace-score")
        self._worker = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop taking work; queued requests fail with `Unavailable` so no client hangs."""
        serving = list(self._inflight)
        waiting = [*self._gathering, *(request for batch in self._inflight.values() for request in batch)]
        for task in [self._worker, *serving]:
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        while self._queue is not None and not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        for request in waiting:
            if not request.future.done():
                request.future.set_exception(
                    Unavailable("the reward service is shutting down", self.retry_after_s)
                )
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, items: Sequence[Item]) -> list[Any]:
        """Queue ``items`` as one request and wait for their results (in order); no items, no results."""
        if not items:
            return []
        if not self.running or self._queue is None:
            raise Unavailable("the reward service is not running", self.retry_after_s)
        if self.stats.queued_items + len(items) > self.max_queue:
            self.stats.rejected += 1
            raise Overloaded(
                f"queue full ({self.stats.queued_items} items waiting, limit {self.max_queue})",
                self.retry_after_s,
            )
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.stats.queued_items += len(items)
        self._queue.put_nowait(_Request(items, future))
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            future.cancel()  # the worker skips it
            self.stats.timed_out += 1
            raise Unavailable(
                f"no result within {self.timeout_s:g}s; the service is busy", self.retry_after_s
            ) from None

    async def _run(self) -> None:
        assert self._queue is not None and self._executor is not None  # set by start()
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.concurrency)
        while True:
            await slots.acquire()  # requests gather in the queue while every slot is scoring
            batch = await self._gather(loop)
            task = loop.create_task(self._serve_batch(loop, batch))
            self._inflight[task], self._gathering = batch, []

            def finished(done: asyncio.Task[None]) -> None:
                self._inflight.pop(done, None)
                slots.release()

            task.add_done_callback(finished)

    async def _serve_batch(self, loop: asyncio.AbstractEventLoop, batch: list[_Request]) -> None:
        try:
            await self._serve(loop, batch)
        except Exception as exc:  # noqa: BLE001 - a bug here must fail its requests, not the service
            log.exception("serving a batch of %d requests failed", len(batch))
            self.stats.failed += 1
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(exc)
        finally:
            self.stats.queued_items -= sum(len(r.items) for r in batch)

    async def _serve(self, loop: asyncio.AbstractEventLoop, batch: list[_Request]) -> None:
        """Score the live requests of ``batch`` in one call on the worker thread and resolve them."""
        live = [r for r in batch if not r.future.done()]
        items = [item for r in live for item in r.items]
        started = time.perf_counter()
        failures: list[int] = []  # the worker thread counts here; this thread adds it up
        results = await loop.run_in_executor(self._executor, self._score, items, failures)
        self.stats.failed += bool(failures)
        self.stats.failed_items += sum(failures)
        self.stats.batches += 1
        self.stats.batched_items += len(items)
        self.stats.score_seconds += time.perf_counter() - started
        at = 0
        for request in live:
            if not request.future.done():
                request.future.set_result(results[at : at + len(request.items)])
            at += len(request.items)

    async def _gather(self, loop: asyncio.AbstractEventLoop) -> list[_Request]:
        """The first waiting request plus what arrives within ``max_wait_s``, up to ``max_batch`` items."""
        assert self._queue is not None
        batch = self._gathering = [await self._queue.get()]
        size = len(batch[0].items)
        deadline = loop.time() + self.max_wait_s
        while size < self.max_batch:
            if self._queue.empty():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    request = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
            else:
                request = self._queue.get_nowait()
            batch.append(request)
            size += len(request.items)
        return batch

    def _score(self, items: list[Item], failures: list[int]) -> list[Any]:
        """One result per item: the batch scored whole, else its halves apart, down to single items; an
        item that fails alone gets ``on_error``'s result and a 1 in ``failures`` (a failed call, 0)."""
        if not items:
            return []
        try:
            results = list(self.score_fn(items))
            if len(results) != len(items):
                raise QACEError(f"the scorer returned {len(results)} results for {len(items)} items")
            return results
        except Exception as exc:  # noqa: BLE001 - isolated below; one bad item must not fail the others
            if len(items) == 1:
                log.warning("an item could not be scored: %s: %s", type(exc).__name__, exc, exc_info=True)
                failures.append(1)
                return [self.on_error(items[0], exc)]
            log.info("a batch of %d items failed (%s); scoring its halves apart", len(items), exc)
            failures.append(0)
            half = len(items) // 2
            return self._score(items[:half], failures) + self._score(items[half:], failures)
