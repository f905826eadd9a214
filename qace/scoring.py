"""Score a whole file with any scorer (`score_file`): progress, crash-safe resumable output, errors file.

QACE and the other judges (`qace.judges`) share this loop (`write_results`; the ``--gpus`` shards
run it too), so they share its guarantees: every input record is scored once or listed in the errors
file with its line and reason, a killed run resumes to the same bytes, and a resumed run refuses an
input that differs from the one it started on (`qace.data.fingerprint`).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qace.data.records import Record, RecordError, References
from qace.errors import InputError, QACEError

if TYPE_CHECKING:
    from qace.data.fingerprint import InputMark
    from qace.data.output import ResultWriter
    from qace.scorers import Scorer

log = logging.getLogger(__name__)


class FileScorer:
    """Base of QACE and the judges: what every scorer does the same way around its ``score_records``
    (the `qace.scorers.Scorer` protocol).

    Subclasses set ``signature``, ``score_key`` and ``config`` (with ``chunk_size`` and ``progress``)
    and implement ``_score_chunk`` (one chunk's results, in order), or ``score_records`` itself.
    """

    signature: str
    score_key: str
    config: Any
    uses_test_models: bool = False

    @property
    def chunk_size(self) -> int:
        return int(self.config.chunk_size)

    @property
    def progress(self) -> bool:
        return bool(self.config.progress)

    def score_records(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        """Stream rows (or ``RecordError`` naming the record) in input order, a chunk at a time."""
        iterator = iter(records)
        while chunk := list(itertools.islice(iterator, self.chunk_size)):
            yield from self._score_chunk(chunk)

    def _score_chunk(self, chunk: list[Record | RecordError]) -> list[dict[str, Any] | RecordError]:
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
        references: References | None = None,
        fmt: str = "auto",
        resume: bool = False,
        force: bool = False,
    ) -> Summary:
        """`score_file` with this scorer (the same power as ``qace score``)."""
        return score_file(
            self, input_path, output_path, references=references, fmt=fmt, resume=resume, force=force
        )


def score_file(
    scorer: Scorer,
    input_path: str | Path,
    output_path: str | Path,
    *,
    references: References | None = None,
    fmt: str = "auto",
    resume: bool = False,
    force: bool = False,
) -> Summary:
    """Score a JSONL/CSV/COCO/Parquet file into JSONL or Parquet with ``scorer`` (any `qace.scorers.Scorer`),
    committing whole chunks (resumable).

    ``force`` lets ``resume`` continue an output that cannot be checked: a partial output without an
    input fingerprint, or a finished one without a signature (`qace.data.output`)."""
    from qace.data.output import ResultWriter
    from qace.data.records import check_readable, read_records

    start = time.perf_counter()
    check_readable(input_path, references=references, fmt=fmt)  # before an output exists
    with ResultWriter(
        output_path,
        signature=scorer.signature,
        resume=resume,
        chunk_size=scorer.chunk_size,
        input_log=True,
        force=force,
    ) as writer:
        counts = write_results(
            scorer,
            read_records(input_path, references=references, fmt=fmt),
            writer,
            progress=scorer.progress,
            expected=count_jsonl_records(input_path, fmt),
        )
    seconds = time.perf_counter() - start
    return Summary(*counts, seconds, scorer.score_key)


def write_results(
    scorer: Scorer,
    items: Iterable[Record | RecordError],
    writer: ResultWriter,
    *,
    progress: bool = False,
    committed: bool = True,
    expected: int | None = None,
    advance: Callable[[int], object] | None = None,
) -> tuple[int, int, int, float | None]:
    """Score ``items`` (a file's records in input order) with ``scorer.score_committed`` (or, with
    ``committed=False``, ``scorer.score_records``) into ``writer`` (a `qace.data.output.ResultWriter`
    logging its input); returns (scored, errors, skipped, mean score). ``expected``, the number of input
    records when known, gives the progress display its ETA; ``advance`` is called with 1 for each record
    scored, failed or skipped (a `--gpus` worker reports to its parent so).

    What an earlier run of the writer's output committed is skipped, after checking that the input
    still holds those same records (`qace.data.fingerprint.InputCheck`; a difference raises
    `ResumeError` before anything is written). Each result is matched to its input record, so an error
    is written with the record's input line whatever the scorer put in it.
    """
    from qace.data.fingerprint import InputCheck, input_mark
    from qace.progress import track

    check = InputCheck(writer.committed_marks(), str(writer.path))
    done_ids, done_lines = writer.done_ids(), writer.done_lines()
    queued: deque[tuple[Record | RecordError, InputMark]] = deque()  # filled by the prefetch thread
    skipped = 0

    def pending() -> Iterator[Record | RecordError]:
        nonlocal skipped
        for item in items:
            mark = input_mark(item)
            done = check.matches(mark) or (
                item.line in done_lines
                if isinstance(item, RecordError) and item.line is not None
                else item.id in done_ids or item.line in done_lines
            )
            if done:
                skipped += 1
                tick(1)
            else:
                queued.append((item, mark))
                yield item
        check.finish()

    scored = errors = 0
    total = 0.0
    score = scorer.score_committed if committed else scorer.score_records
    tick = advance or (lambda n: None)
    left = None if expected is None else max(expected - len(done_ids) - len(done_lines), 0)
    with track("scoring", total=left, unit="caption", enabled=progress) as bar:
        for result in score(pending()):
            item, mark = queued.popleft()
            result_id = result.id if isinstance(result, RecordError) else result.get("id")
            if result_id != item.id:
                raise QACEError(f"{type(scorer).__name__} answered id {result_id!r} for record {item.id!r}")
            if isinstance(result, RecordError):
                writer.add_error(result.id, result.reason, line=item.line, mark=mark)
                where = (
                    ""
                    if item.line is None or result.reason.startswith(f"line {item.line}:")
                    else (f" (line {item.line})")
                )
                named = "without an id" if result.id is None else result.id
                log.warning("record %s%s: %s", named, where, result.reason)
                errors += 1
            else:
                writer.add(result, mark=mark)
                scored += 1
                total += result[scorer.score_key]
            bar.update(1)
            tick(1)
    return scored, errors, skipped, total / scored if scored else None


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
