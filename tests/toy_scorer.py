"""A toy metric, added the way any metric is: one module (this one) and one registry entry (`ENTRY`).

It scores a caption by its length in words (or characters), so its numbers are known exactly. Importable
as ``tests.toy_scorer`` from the repository root, as ``--gpus`` workers and Ray actors import it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qace import scorers
from qace.data.records import Record, RecordError
from qace.scoring import FileScorer
from qace.signature import Signature


@dataclass(frozen=True)
class LengthConfig:
    unit: str = "words"
    chunk_size: int = 4
    progress: bool = True
    device: str = "cpu"


class CaptionLength(FileScorer):
    """``length``: the caption's length in ``unit``s (``words`` or ``chars``); empty captions are errors."""

    score_key = "length"

    def __init__(self, *, device: str = "cpu", **settings: Any) -> None:
        self.config = LengthConfig(device=device, **settings)
        self.signature = str(Signature.of_scorer("Length", ("unit", self.config.unit)))

    def score_records(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        iterator = iter(records)
        while chunk := list(itertools.islice(iterator, self.chunk_size)):
            yield from map(self._row, chunk)

    def _row(self, record: Record | RecordError) -> dict[str, Any] | RecordError:
        if isinstance(record, RecordError):
            return record
        if not record.caption.strip():
            return RecordError(record.id, "empty caption", record.line)
        units = record.caption.split() if self.config.unit == "words" else record.caption
        return {"id": record.id, "length": float(len(units)), "flags": [], "signature": self.signature}


class MeetingLength(CaptionLength):
    """`CaptionLength` whose first two ``score_committed`` calls each wait, up to ``wait_s`` seconds, for the
    other to begin: called one at a time, their records come back as errors saying the calls never met."""

    def __init__(self, *, wait_s: float = 60.0, **settings: Any) -> None:
        super().__init__(**settings)
        self._meeting = threading.Barrier(2, timeout=wait_s)
        self._calls = itertools.count()

    def score_committed(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        batch = list(records)
        if next(self._calls) < 2:
            try:
                self._meeting.wait()
            except threading.BrokenBarrierError:
                return iter([RecordError(record.id, "the first two calls never met") for record in batch])
        return self.score_records(batch)


class CrowdedLength(CaptionLength):
    """`CaptionLength` whose every ``score_committed`` call first signs ``meeting_dir`` with its process id,
    then waits, up to ``wait_s`` seconds, until ``crowd`` processes have signed: where the calls reach fewer
    processes, their records come back as errors saying how many."""

    def __init__(self, *, meeting_dir: str, crowd: int, wait_s: float = 60.0, **settings: Any) -> None:
        super().__init__(**settings)
        self._meeting, self._crowd, self._wait_s = Path(meeting_dir), crowd, wait_s

    def score_committed(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        batch = list(records)
        (self._meeting / str(os.getpid())).touch()
        deadline = time.monotonic() + self._wait_s
        while (signed := len(list(self._meeting.iterdir()))) < self._crowd:
            if time.monotonic() > deadline:
                self._wait_s = 0.0  # waited once in vain: the process's later calls give up at once
                reason = f"only {signed} of {self._crowd} processes ever scored"
                return iter([RecordError(record.id, reason) for record in batch])
            time.sleep(0.05)
        return self.score_records(batch)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--length-unit", default="words", choices=["words", "chars"], help="the toy's unit")


def settings(args: argparse.Namespace) -> dict[str, Any]:
    chunk = {"chunk_size": args.chunk_size} if getattr(args, "chunk_size", None) else {}
    return {"unit": args.length_unit, "progress": not getattr(args, "no_progress", False), **chunk}


def demo(*, device: str = "cpu", download: bool = False) -> CaptionLength:
    return CaptionLength(device=device, chunk_size=5)


MODULE = "tests.toy_scorer"
ENTRY = scorers.ScorerEntry(
    name="length", help="a toy metric: the caption's length",
    score_key="length", columns=("length",), parts=(), signature="Length",
    factory=f"{MODULE}:CaptionLength", settings=f"{MODULE}:settings",
    options=f"{MODULE}:add_options", demo=f"{MODULE}:demo",
)  # fmt: skip
"""The one registry entry that adds the metric (`registered` registers it for a block)."""


@contextmanager
def registered() -> Iterator[scorers.ScorerEntry]:
    """The toy metric registered for the block, unregistered after it."""
    scorers.register(ENTRY)
    try:
        yield ENTRY
    finally:
        scorers.unregister(ENTRY.name)
