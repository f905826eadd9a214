"""The benchmarks' shared workload helpers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from benchmarks.workload import score_in_full_chunks
from qace.api import _Tapered


def test_profiled_passes_run_every_chunk_at_its_full_size() -> None:
    """One call longer than a chunk tapers (the reason for the helper); the helper makes calls of one
    full chunk each, the last one the rest."""
    tapered, chunks = _Tapered(iter(range(4096)), 2048), []
    while chunk := tapered.next_chunk():
        chunks.append(len(chunk))
    assert chunks == [256, 512, 1024, 1152, 576, 288, 288]

    calls: list[int] = []

    def score_records(records: list[Any]) -> Any:
        calls.append(len(records))
        return iter(records)

    scorer = SimpleNamespace(config=SimpleNamespace(chunk_size=2048), score_records=score_records)
    score_in_full_chunks(scorer, list(range(4096 + 100)))  # type: ignore[arg-type]
    assert calls == [2048, 2048, 100]
