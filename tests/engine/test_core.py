"""The engine core's request stream (`RemoteRunner.generate_jobs`) over a real pipe and core thread."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection

import numpy as np
import pytest

from qace.engine.batches import Generated, TextBatch
from qace.engine.core import CoreClient, CoreError, DeviceCore, RemoteRunner

ROWS, LENGTH = 256, 64


class _FailsFirst:
    """Stands in for a model runner: batch 0 fails on the device (say, out of memory), the others answer
    with large outputs, so unread answers fill the pipe back to the host."""

    def generate(
        self, batch: TextBatch, *, max_new_tokens: int, unanswerable_id: int | None = None
    ) -> Generated:
        if batch.input_ids[0, 0] == 0:
            raise RuntimeError("out of memory (a stand-in)")
        return Generated(tokens=[list(range(100, 120))] * ROWS, answerability=np.zeros(ROWS))


@pytest.fixture
def core_pipe() -> Iterator[tuple[threading.RLock, Connection]]:
    """A core serving `_FailsFirst` from its thread, its device lock, and a host's end of a pipe to it;
    stopped after the test, the interpreter's switch interval put back (`DeviceCore.start` lowers it)."""
    lock, interval = threading.RLock(), sys.getswitchinterval()
    core = DeviceCore({"tqa": _FailsFirst()}, lock=lock)
    core.start()
    host_end, core_end = Pipe()
    core.attach(core_end)
    try:
        yield lock, host_end
    finally:
        core.stop()
        sys.setswitchinterval(interval)


def _outcome(host: Callable[[], object], catch: type[BaseException]) -> list[object]:
    """What ``host`` returned or raised (of ``catch``), run in a thread; fails if it is still waiting
    after 60 s."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(host())
        except catch as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the host waited for good"
    return outcome


def test_a_failed_batch_fails_the_stream_at_once_while_later_batches_are_still_sent(core_pipe) -> None:
    """The answer of batch 0 fails while the host still sends the stage's other 200 batches: the call
    raises the core's error (before, the host waited for its sender while the core blocked sending
    answers no one read: both waited for good, the core holding the device lock)."""
    lock, host_end = core_pipe
    remote = RemoteRunner(CoreClient(host_end), "tqa")
    jobs = (
        (remote, i, TextBatch(np.full((ROWS, LENGTH), i, np.int64), np.ones((ROWS, LENGTH), np.int64)), None)
        for i in range(200)
    )
    outcome = _outcome(
        lambda: [key for key, _ in RemoteRunner.generate_jobs(jobs, max_new_tokens=20)], CoreError
    )
    assert len(outcome) == 1 and isinstance(outcome[0], CoreError) and "out of memory" in str(outcome[0])
    assert lock.acquire(timeout=30)  # the core is not left holding the device lock
    lock.release()


def test_a_core_whose_loop_fails_closes_the_pipes_so_hosts_do_not_wait_for_good(core_pipe) -> None:
    """A request the core cannot read (here: bytes that are no pickle) ends its loop; the host waiting
    for an answer then reads the end of its pipe instead of waiting for good."""
    _, host_end = core_pipe

    def host() -> object:
        host_end.send_bytes(b"not a pickle")
        return CoreClient(host_end).receive(1)

    outcome = _outcome(host, BaseException)
    assert len(outcome) == 1 and isinstance(outcome[0], EOFError | OSError)
