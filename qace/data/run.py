"""Score a whole file with any scorer: progress bar, crash-safe resumable output, errors file.

QACE and the other judges (`qace.judges`) share this loop, so they share its guarantees: every
input id is scored once or listed with its reason, and a killed run resumes to the same bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from qace.data.records import Record, RecordError
from qace.errors import InputError

log = logging.getLogger(__name__)


class FileScorer:
    """Base of QACE and the judges: what every scorer does the same way around its ``score_records``.

    Subclasses set ``signature``, ``score_key`` and ``config`` (with ``chunk_size`` and ``progress``)
    and implement ``score_records``.
    """

    signature: str
    score_key: str
    config: Any

    @property
    def chunk_size(self) -> int:
        return int(self.config.chunk_size)

    @property
    def progress(self) -> bool:
        return bool(self.config.progress)

    def score_records(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        raise NotImplementedError

    def score_committed(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        """What `score_file` scores with: `score_records`, unless a scorer must cut its chunks where
        the writer commits (every ``chunk_size`` records), so that a resumed run, which starts at a
        commit, scores every later chunk exactly as the first run did."""
        return self.score_records(records)

    def _rows(self, records: Iterable[Record | RecordError]) -> list[dict[str, Any]]:
        """The list APIs' result: one row per record, in order; a record that cannot be scored gets
        ``{"id", "error"}`` instead of raising, so one bad caption never costs the others."""
        return [
            {"id": r.id, "error": r.reason} if isinstance(r, RecordError) else r
            for r in self.score_records(records)
        ]

    def score_file(
        self,
        input_path: str | Path,
        output_path: str | Path,
        *,
        references: str | Path | None = None,
        fmt: str = "auto",
        resume: bool = False,
    ) -> Summary:
        """Score a JSONL/CSV/COCO file into JSONL or Parquet, committing whole chunks (resumable)."""
        from qace.data.output import ResultWriter
        from qace.data.records import read_records
        from qace.progress import track

        start = time.perf_counter()
        scored = errors = skipped = 0
        total = 0.0
        with ResultWriter(
            output_path, signature=self.signature, resume=resume, chunk_size=self.chunk_size
        ) as writer:
            done = writer.done_ids()

            def pending() -> Iterator[Record | RecordError]:
                nonlocal skipped
                for record in read_records(input_path, references=references, fmt=fmt):
                    if record.id in done:
                        skipped += 1
                    else:
                        yield record

            records = count_jsonl_records(input_path, fmt)
            left = None if records is None else max(records - len(done), 0)
            bar = track("scoring", total=left, unit="caption", enabled=self.progress)
            for result in self.score_committed(pending()):
                if isinstance(result, RecordError):
                    writer.add_error(result.id, result.reason)
                    log.warning("record %s: %s", result.id, result.reason)
                    errors += 1
                else:
                    writer.add(result)
                    scored += 1
                    total += result[self.score_key]
                bar.update(1)
            bar.close()
        seconds = time.perf_counter() - start
        return Summary(scored, errors, skipped, total / scored if scored else None, seconds, self.score_key)


def count_jsonl_records(path: str | Path, fmt: str = "auto") -> int | None:
    """The number of records of a JSONL input (its non-blank lines; cheap next to scoring them), for a
    progress bar's ETA; ``None`` for the other formats."""
    from qace.data.records import detect_format

    path = Path(path)
    if (fmt if fmt != "auto" else detect_format(path)) != "jsonl":
        return None
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def list_ids(
    captions: Sequence[Any], ids: Sequence[Any] | None = None, **columns: Sequence[Any] | None
) -> list[str]:
    """The ids of a list-API call (``0..n-1`` by default) as strings, after checking that ``ids`` and every
    given column (``references=``, ``images=``, ...) have one entry per caption: a misaligned column would
    score captions against the wrong context, so it is the caller's error, raised before any work."""
    n = len(captions)
    for name, values in {"ids": ids, **columns}.items():
        if values is not None and len(values) != n:
            raise InputError(f"got {n} captions but {len(values)} {name}; give one per caption")
    return [str(i) for i in (ids if ids is not None else range(n))]


@dataclass(frozen=True)
class Summary:
    """What a file run did: counts, mean score and throughput."""

    scored: int
    errors: int
    skipped: int
    mean: float | None
    seconds: float
    metric: str = "qace"

    @property
    def captions_per_second(self) -> float:
        return self.scored / self.seconds if self.seconds > 0 else 0.0

    def fields(self) -> dict[str, Any]:
        """The summary as plain values (for a JSON summary line)."""
        return {**asdict(self), "captions_per_second": round(self.captions_per_second, 3)}

    def line(self) -> str:
        mean = "n/a" if self.mean is None else f"{self.mean:.4f}"
        return (
            f"scored {self.scored} captions ({self.errors} errors, {self.skipped} already done) "
            f"mean {self.metric} {mean} | {self.captions_per_second:.1f} captions/s"
        )
