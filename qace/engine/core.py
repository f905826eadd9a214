"""The engine core: the one thread of the device's process that only feeds the device.

Host processes (`qace.engine.host_pool`) do a chunk's host work (prompts, tokenising, de-duplication,
decoding ids to text, comparisons, rows) and send the core ready work over a pipe each: padded id
arrays of one batch for a model (`TextBatch`, or a `VisualBatch` whose regions are named by `ImageRows`),
or a call of a named device function (BERTScore's encoder and matching). The core runs work in arrival
order, every host process's batches in one stream, so the next batch's encoder overlaps this one's
decoding also across host processes (`Runner.generate_jobs`), and sends each result back as soon as
it is ready. It holds the device lock around device work (`qace.engine.device_lock`), so scorers of
the same process still take turns with it.

The core knows no metric: it serves the runners and functions it is given, by name. A host process
reaches them through `CoreClient` (`RemoteRunner` is a `Runner` whose batches run in the core).

Protocol, one duplex pipe per host process: the host sends ``(seq, name, payload)`` and receives
``(seq, ok, result)`` for each request, in order; ``payload`` is ``(batch, unanswerable_id,
max_new_tokens)`` for a runner, the argument for a function. A failed request answers ``ok=False``
with the error; the requests after it still run.
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar, cast

import numpy as np

from qace.engine import instrument
from qace.engine.batches import Generated, TextBatch, VisualBatch
from qace.engine.engine import gather_features

log = logging.getLogger(__name__)

K = TypeVar("K")

SWITCH_INTERVAL_S = 0.001
"""The interpreter's thread switch interval in a process with an engine core (Python's default: 5 ms)."""


@dataclass
class _Request:
    conn: Connection
    seq: int
    name: str
    payload: Any


@dataclass(eq=False)
class DeviceCore:
    """Serves the ``runners`` and ``functions`` named in requests from host processes' pipes, in a
    thread of its own (`start`). ``features`` loads an image's region features for visual batches
    that name them (`gather_features`)."""

    runners: dict[str, Any]
    functions: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    features: Callable[[str], np.ndarray] | None = None
    lock: AbstractContextManager[Any] = field(default_factory=nullcontext)

    def __post_init__(self) -> None:
        self._conns: list[Connection] = []
        self._pending: deque[_Request] = deque()
        self._added: queue.SimpleQueue[Connection] = queue.SimpleQueue()
        self._wake_r, self._wake_w = _pipe()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.idle_seconds = 0.0
        """Time the core has waited with no request to run (it waited for host work)."""

    def attach(self, conn: Connection) -> None:
        """Serve requests arriving on ``conn`` (the core's end of a host process's pipe)."""
        self._added.put(conn)
        self._wake_w.send_bytes(b"+")

    def start(self) -> None:
        """Serve from a thread of this process. The interpreter's switch interval drops to
        `SWITCH_INTERVAL_S`, so the core takes the interpreter lock back within about a millisecond
        when a decoding step returns, not 5 ms later, while this process's other threads (reading
        records, collecting rows) hold it."""
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="qace-core", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop serving (requests not yet run are dropped: their host processes are being stopped)."""
        self._stopped = True
        try:
            self._wake_w.send_bytes(b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    # -- the loop ------------------------------------------------------------------------------------

    def _serve(self) -> None:
        """Serve until stopped. Should the loop itself fail (a request that cannot be read, an answer
        that cannot be sent), the core closes every host process's pipe, so a host waiting for an
        answer reads the end of it and fails its call, rather than waiting for good."""
        try:
            while not self._stopped:
                if self._pending:
                    self._receive(block=False)
                else:
                    start = time.perf_counter()
                    self._receive(block=True)
                    self.idle_seconds += time.perf_counter() - start
                while self._pending and not self._stopped:
                    self._run_next()
        except BaseException:
            log.exception("engine core: its loop failed; the host processes' pipes are closed")
            self._stopped = True
            while True:
                try:
                    self._conns.append(self._added.get_nowait())
                except queue.Empty:
                    break
            for conn in self._conns:
                conn.close()

    def _receive(self, *, block: bool) -> None:
        """Move every request that has arrived into the queue; with ``block``, wait for one first."""
        while True:
            try:
                self._conns.append(self._added.get_nowait())
            except queue.Empty:
                break
        ready = cast(list[Connection], wait([self._wake_r, *self._conns], timeout=None if block else 0))
        for conn in ready:
            if conn is self._wake_r:
                self._wake_r.recv_bytes()
                continue
            try:
                while conn.poll():
                    seq, name, payload = conn.recv()
                    self._pending.append(_Request(conn, seq, name, payload))
            except (EOFError, OSError):  # its host process ended: nothing to answer any more
                self._conns.remove(conn)
                self._pending = deque(r for r in self._pending if r.conn is not conn)

    def _run_next(self) -> None:
        head = self._pending[0]
        if head.name in self.functions:
            self._pending.popleft()
            self._note(head)
            with self.lock:
                self._answer(head, lambda: self.functions[head.name](head.payload))
            return
        self._run_stream()

    def _run_stream(self) -> None:
        """Runner requests from the head of the queue as one stream of jobs, taking requests that
        arrive meanwhile, until the queue holds none or a function call comes next."""
        head = self._pending[0]
        max_new_tokens = head.payload[2]
        pulled: deque[_Request] = deque()

        def jobs() -> Iterator[tuple[Any, _Request, TextBatch | VisualBatch, int | None]]:
            while True:
                if not self._pending:
                    self._receive(block=False)
                if not self._pending or self._stopped:
                    return
                request = self._pending[0]
                if request.name in self.functions or request.payload[2] != max_new_tokens:
                    return
                self._pending.popleft()
                pulled.append(request)
                self._note(request)
                runner = self.runners.get(request.name)
                if runner is None:
                    raise KeyError(f"the engine core serves no model named {request.name!r}")
                batch, unanswerable_id, _ = request.payload
                if isinstance(batch, VisualBatch):
                    assert self.features is not None, "visual batches need the core's feature loader"
                    batch = gather_features(runner, self.features, batch)
                yield runner, request, batch, unanswerable_id

        with self.lock:
            try:
                for request, generated in generate_jobs(jobs(), max_new_tokens):
                    assert pulled[0] is request
                    pulled.popleft()
                    _send(request, True, generated)
            except Exception as exc:  # noqa: BLE001 - answered to the hosts that asked
                log.exception("engine core: a batch failed")
                for request in pulled:
                    _send(request, False, exc)

    def _note(self, request: _Request) -> None:
        requests = instrument.of(self).requests
        if requests is not None:
            requests.append((request.name, request.payload))

    def _answer(self, request: _Request, run: Callable[[], Any]) -> None:
        try:
            result, ok = run(), True
        except Exception as exc:  # noqa: BLE001 - answered to the host that asked
            log.exception("engine core: %s failed", request.name)
            result, ok = exc, False
        _send(request, ok, result)


def generate_jobs(
    jobs: Iterable[tuple[Any, K, TextBatch | VisualBatch, int | None]], max_new_tokens: int
) -> Iterator[tuple[K, Generated]]:
    """The runners' own overlapping stream (`Runner.generate_jobs`) when they share one, else one
    batch after another."""
    it = iter(jobs)
    first = next(it, None)
    if first is None:
        return
    stream = itertools.chain([first], it)
    generate_jobs = getattr(type(first[0]), "generate_jobs", None)
    if generate_jobs is not None:
        yield from generate_jobs(stream, max_new_tokens=max_new_tokens)
        return
    for runner, key, batch, uid in stream:
        yield key, runner.generate(batch, max_new_tokens=max_new_tokens, unanswerable_id=uid)


def _send(request: _Request, ok: bool, result: Any) -> None:
    try:
        request.conn.send((request.seq, ok, result))
    except (BrokenPipeError, EOFError, OSError):  # its host process ended meanwhile
        pass
    except Exception as exc:  # noqa: BLE001 - e.g. an error that does not pickle
        request.conn.send((request.seq, False, RuntimeError(f"{type(result).__name__}: {result}; {exc}")))


def _pipe() -> tuple[Connection, Connection]:
    from multiprocessing import Pipe

    read, write = Pipe(duplex=False)
    return read, write


class CoreError(RuntimeError):
    """A request failed in the engine core (the device's process); the message is the core's error."""


class CoreClient:
    """A host process's end of its pipe to the engine core. Requests are answered in order; one
    stream of runner jobs is open at a time (`RemoteRunner.generate_jobs`), as a chunk's stages run one
    after another."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._seq = 0
        self._send_lock = threading.Lock()

    def send(self, name: str, payload: Any) -> int:
        with self._send_lock:
            self._seq += 1
            self.conn.send((self._seq, name, payload))
            return self._seq

    def receive(self, seq: int) -> Any:
        got, ok, result = self.conn.recv()
        if got != seq:
            raise CoreError(f"engine core answered request {got} where {seq} was due")
        if not ok:
            if isinstance(result, BaseException):
                raise CoreError(f"engine core: {type(result).__name__}: {result}") from result
            raise CoreError(f"engine core: {result}")
        return result

    def call(self, name: str, argument: Any) -> Any:
        """Run the core's function ``name`` on ``argument`` and return its result."""
        return self.receive(self.send(name, argument))


class RemoteRunner:
    """A `Runner` whose batches run in the engine core: the model ``name`` there. Visual batches
    name their regions (``gathers_features``); the core gathers them."""

    gathers_features = True

    def __init__(self, client: CoreClient, name: str) -> None:
        self.client = client
        self.name = name

    def generate(
        self, batch: TextBatch | VisualBatch, *, max_new_tokens: int, unanswerable_id: int | None = None
    ) -> Generated:
        return self.client.call(self.name, (batch, unanswerable_id, max_new_tokens))

    @staticmethod
    def generate_jobs(
        jobs: Iterable[tuple[RemoteRunner, K, TextBatch | VisualBatch, int | None]], *, max_new_tokens: int
    ) -> Iterator[tuple[K, Generated]]:
        """Send every job as soon as it is built (a thread builds and sends: building a later batch
        tokenises its prompts) and yield ``(key, Generated)`` as the core answers, in order. Every
        request sent is answered before this returns, also when the caller stops early or an answer
        fails: the thread then sends no more, and the answers due are read while it stops (the core
        blocks sending answers no one reads, and then reads no more requests)."""
        sent: queue.SimpleQueue[tuple[CoreClient, int, Any] | BaseException | None] = queue.SimpleQueue()
        stop = threading.Event()

        def send_all() -> None:
            try:
                for runner, key, batch, uid in jobs:
                    if stop.is_set():
                        break
                    seq = runner.client.send(runner.name, (batch, uid, max_new_tokens))
                    sent.put((runner.client, seq, key))
                sent.put(None)
            except BaseException as exc:  # noqa: BLE001 - raised again where the results are read
                sent.put(exc)

        sender = threading.Thread(target=send_all, name="qace-send", daemon=True)
        sender.start()
        done = False
        try:
            while (item := sent.get()) is not None:
                if isinstance(item, BaseException):
                    done = True
                    raise item
                client, seq, key = item
                yield key, client.receive(seq)
            done = True
        finally:
            if not done:  # answers still due would be read as the next stage's: read and drop them
                stop.set()
                while (item := sent.get()) is not None and not isinstance(item, BaseException):
                    client, seq, _ = item
                    try:
                        client.receive(seq)
                    except CoreError:
                        pass
                sender.join()
