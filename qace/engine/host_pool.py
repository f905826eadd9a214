"""Host processes: the host work of whole chunks, away from the process that owns the device.

`HostPool` starts ``n`` processes (`qace.engine.launch`: fresh interpreters with no GPU visible, which
never run the caller's script again, so a script without a ``__main__`` guard works), each with a pipe
for tasks and, given ``attach``, a pipe to the engine core (`qace.engine.core`), and hands each task to
an idle one. What a process does is named, not imported here (the engine knows no metric): ``setup``
is a ``"module:function"`` called once in each process with ``(argument, core_client)`` (``None``
without ``attach``) that returns the task function.

Failure handling: a process that dies (killed, out of memory, or at start) fails the task it held and
every later one with `HostWorkerError`, naming the process, its exit status and what to do; the pool
then stops the others. Each process ends within a fraction of a second of its parent's death (kill -9
included), ignores Ctrl-C (its parent stops it), and `close` ends every process, so none outlives the
pool.
"""

from __future__ import annotations

import logging
import threading
import traceback
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from qace.engine.gc_pause import freeze_heap
from qace.engine.launch import Child, resolve, start_child
from qace.errors import HostWorkerError

log = logging.getLogger(__name__)

HIDDEN = {
    "CUDA_VISIBLE_DEVICES": "",
    "TOKENIZERS_PARALLELISM": "false",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""The environment of every host process: no GPU, no tokenizer or BLAS threads of its own (the
processes share the host's cores)."""


@dataclass
class _Worker:
    index: int
    process: Child
    tasks: Connection
    ready: bool = False
    busy: Future[Any] | None = None


def _worker_main(job: tuple[str, Any], tasks: Connection, core: Connection | None = None) -> None:
    """A host process (`start_child`'s target): set up, say ready, then run tasks until the pipe closes."""
    setup_ref, argument = job
    try:
        client = None
        if core is not None:
            from qace.engine.core import CoreClient

            client = CoreClient(core)
        run = resolve(setup_ref)(argument, client)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        tasks.send(("failed", traceback.format_exc()))
        return
    freeze_heap()  # what setup loaded (torch, tokenizers, spaCy) is out of every later collection
    tasks.send(("ready", None))
    while True:
        try:
            task = tasks.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if task is None:
            return
        try:
            reply = ("ok", run(task))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the task
            reply = ("error", _portable(exc))
        try:
            tasks.send(reply)
        except (BrokenPipeError, OSError):
            return


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else a RuntimeError with its text (the traceback stays in the message)."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")


class HostPool:
    """``n`` processes running tasks with the function ``setup_ref`` builds from ``argument``. With
    ``attach`` (`DeviceCore.attach`), each process gets a pipe to the engine core, whose end is handed
    to ``attach``. ``label`` names the processes in messages and process lists (``"host"``: host
    processes, memory advice ``--host-workers``; others name their own setting in ``setting``).

    `submit` returns a future of the task's result; tasks queue while every process is busy, or while
    as many are busy as `limit` allows. Start-up (imports, the setup call) runs in the background from
    construction; `wait_ready` waits for it.
    """

    def __init__(
        self,
        n: int,
        setup_ref: str,
        argument: Any,
        attach: Callable[[Connection], None] | None = None,
        *,
        label: str = "host",
        setting: str = "--host-workers",
    ) -> None:
        if n < 1:
            raise ValueError(f"a host pool needs at least one process, got {n}")
        self._label, self._setting = label, setting
        self._lock = threading.RLock()  # futures' callbacks may submit again
        self._queue: deque[tuple[Any, Future[Any]]] = deque()
        self._workers: list[_Worker] = []
        self._broken: HostWorkerError | None = None
        self._closed = False
        self._limit: int | None = None
        self._all_ready = threading.Event()
        self._finalizer = weakref.finalize(self, HostPool._stop_processes, self._workers)
        for index in range(n):
            child = start_child(
                "qace.engine.host_pool:_worker_main",
                (setup_ref, argument),
                name=f"qace-{label.lower()}-{index}",
                pipes=0 if attach is None else 1,
                env=HIDDEN,
            )
            if attach is not None:
                attach(child.pipes[0])
            self._workers.append(_Worker(index, child, child.control))
        self._wake_r, self._wake_w = Pipe(duplex=False)
        self._collector = threading.Thread(
            target=self._collect, name=f"qace-{label.lower()}-collector", daemon=True
        )
        self._collector.start()

    @property
    def size(self) -> int:
        return len(self._workers)

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers]

    def ready(self) -> bool:
        """Whether every process has set up (raises `HostWorkerError` if one failed or died)."""
        if self._broken is not None:
            raise self._broken
        return self._all_ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every process has set up (raises `HostWorkerError` if one failed)."""
        self._all_ready.wait(timeout)
        if self._broken is not None:
            raise self._broken

    def submit(self, task: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if self._closed:
                raise HostWorkerError("the host pool is closed")
            self._queue.append((task, future))
            self._dispatch()
        return future

    def limit(self, processes: int | None) -> None:
        """Hand tasks to at most ``processes`` processes at once (``None``: to every one); tasks already
        running finish, and queued ones wait for a free place."""
        if processes is not None and processes < 1:
            raise ValueError(f"a host pool's limit must be at least 1 process, got {processes}")
        with self._lock:
            self._limit = processes
            self._dispatch()

    def run_everywhere(self, task: Any) -> list[Any]:
        """Run ``task`` once in every process, each once it is idle (benchmarks empty the processes'
        caches between passes this way); their results, in process order."""
        self.wait_ready()
        results = []
        for worker in self._workers:
            future: Future[Any] = Future()
            while True:
                with self._lock:
                    if self._broken is not None:
                        raise self._broken
                    if worker.busy is None:
                        worker.busy = future
                        worker.tasks.send(task)
                        break
                threading.Event().wait(0.01)
            results.append(future.result())
        return results

    def _dispatch(self) -> None:
        """Hand queued tasks to idle, ready processes, within the limit (holding the lock)."""
        busy = sum(1 for w in self._workers if w.busy is not None)
        for worker in self._workers:
            if not self._queue or (self._limit is not None and busy >= self._limit):
                return
            if worker.ready and worker.busy is None:
                busy += 1
                task, future = self._queue.popleft()
                worker.busy = future
                try:
                    worker.tasks.send(task)
                except (BrokenPipeError, OSError):
                    pass  # the collector sees the process end and fails the future

    def _collect(self) -> None:
        """Read results and readiness from every process; a process that ends breaks the pool."""
        while True:
            with self._lock:
                live = [w for w in self._workers if w.tasks is not None]
                if self._closed or self._broken is not None:
                    return
            try:
                ready = cast(list[Connection], wait([self._wake_r, *(w.tasks for w in live)]))
            except (OSError, ValueError):  # closed meanwhile
                return
            for conn in ready:
                if conn is self._wake_r:
                    self._wake_r.recv_bytes()
                    continue
                worker = next(w for w in live if w.tasks is conn)
                try:
                    kind, value = cast(tuple[str, Any], conn.recv())
                except (EOFError, OSError):
                    self._break(worker)
                    return
                with self._lock:
                    if kind == "ready":
                        worker.ready = True
                        if all(w.ready for w in self._workers):
                            self._all_ready.set()
                    elif kind == "failed":
                        where = f"{self._label} process {worker.index} (pid {worker.process.pid})"
                        self._broken = HostWorkerError(f"{where} failed to start:\n{value}")
                        self._fail_all(self._broken)
                        return
                    else:
                        future, worker.busy = worker.busy, None
                        if future is not None:
                            if kind == "ok":
                                future.set_result(value)
                            else:
                                future.set_exception(value)
                    self._dispatch()

    def _break(self, worker: _Worker) -> None:
        with self._lock:
            if self._closed:
                return
            worker.process.join(timeout=5)
            code = worker.process.exitcode
            how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited ({code})"
            self._broken = HostWorkerError(
                f"{self._label} process {worker.index} (pid {worker.process.pid}) {how}"
                + (" while scoring a chunk" if worker.busy is not None else "")
                + "; the run stopped. Output committed so far is kept: run the same command with "
                f"--resume to continue (a process killed for memory: fewer {self._setting} or a smaller "
                "--chunk-size)"
            )
            self._fail_all(self._broken)
        self.close()

    def _fail_all(self, error: HostWorkerError) -> None:
        """Fail every pending future with ``error`` (holding the lock)."""
        self._all_ready.set()
        for worker in self._workers:
            if worker.busy is not None and not worker.busy.done():
                worker.busy.set_exception(error)
            worker.busy = None
        while self._queue:
            _, future = self._queue.popleft()
            future.set_exception(error)

    def close(self) -> None:
        """Stop every process (idempotent); pending tasks fail."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._fail_all(self._broken or HostWorkerError("the host pool was closed"))
        try:
            self._wake_w.send_bytes(b"x")
        except OSError:
            pass
        self._finalizer()

    @staticmethod
    def _stop_processes(workers: list[_Worker]) -> None:
        for worker in workers:
            try:
                worker.tasks.send(None)
            except (BrokenPipeError, OSError):
                pass
        for worker in workers:
            worker.process.join(timeout=2)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5)
            worker.tasks.close()
