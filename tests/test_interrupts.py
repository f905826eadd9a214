"""A Ctrl-C that a library swallowed still stops a command-line run, at the next chunk commit."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from qace import interrupts
from qace.data.output import ResultWriter


@pytest.fixture
def installed() -> Iterator[None]:
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupts.install()
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        interrupts._pending = False


def _swallowed_ctrl_c() -> None:
    try:
        os.kill(os.getpid(), signal.SIGINT)
        signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a point where the handler runs
    except KeyboardInterrupt:
        pass  # as a library catching every exception around a callback does


def test_a_swallowed_ctrl_c_stops_the_run_before_the_next_commit(installed: None, tmp_path: Path) -> None:
    writer = ResultWriter(tmp_path / "out.jsonl", signature="S", chunk_size=2)
    writer.add({"id": "a"})
    _swallowed_ctrl_c()
    with pytest.raises(KeyboardInterrupt):
        writer.add({"id": "b"})  # the chunk is full: its commit raises instead
    assert not (tmp_path / "out.jsonl.partial" / "000000.rows.jsonl").exists()
    writer.flush()  # raised once: the writer goes on where the caller does
    assert (tmp_path / "out.jsonl.partial" / "000000.rows.jsonl").exists()


def test_a_process_that_ignores_ctrl_c_keeps_ignoring_it() -> None:
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        interrupts.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
