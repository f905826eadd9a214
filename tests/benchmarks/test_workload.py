"""The benchmarks' shared workload helpers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from benchmarks.workload import score_in_full_chunks
from qace.api import _Tapered


class _Scorer:
    """Records the chunks each call is cut into, as `QACE.score_records` cuts them."""

    def __init__(self, chunk_size: int) -> None:
        self.config = SimpleNamespace(chunk_size=chunk_size)
        self.chunks: list[int] = []

    def score_records(self, records: list[Any]) -> Any:
        if len(records) <= self.config.chunk_size:
            self.chunks.append(len(records))
        else:
            tapered = _Tapered(iter(records), self.config.chunk_size)
            while chunk := tapered.next_chunk():
                self.chunks.append(len(chunk))
        return iter(records)


def test_profiled_passes_run_every_chunk_at_its_full_size() -> None:
    one_call = _Scorer(2048)
    list(one_call.score_records(list(range(4096))))
    assert one_call.chunks == [256, 512, 1024, 1152, 576, 288, 288]  # what one call of 4,096 does
    scorer = _Scorer(2048)
    score_in_full_chunks(scorer, list(range(4096 + 100)))
    assert scorer.chunks == [2048, 2048, 100]
