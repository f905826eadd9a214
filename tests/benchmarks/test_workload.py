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
        raise AssertionError("score_records tapers input longer than a chunk")

    def score_committed(records: list[Any]) -> Any:
        calls.append(len(records))
        return iter(records)

    scorer = SimpleNamespace(
        config=SimpleNamespace(chunk_size=2048), score_records=score_records, score_committed=score_committed
    )
    score_in_full_chunks(scorer, list(range(4096 + 100)))  # type: ignore[arg-type]
    assert calls == [4196], "one stream of whole chunks, so host processes take it as in a long run"


def test_the_helper_scores_every_chunk_whole_from_the_first(test_models_dir: Any) -> None:
    """On a real scorer: chunks of ``chunk_size`` from the first, the last one the rest, each record
    scored once."""
    from qace.api import QACE
    from qace.data.records import Record

    scorer = QACE(models=test_models_dir, variant="ref", chunk_size=8, progress=False, host_workers=0)
    sizes: list[int] = []
    finish = scorer._finish

    def counted(prepared: Any) -> Any:
        sizes.append(len(prepared.results))
        return finish(prepared)

    scorer._finish = counted  # type: ignore[method-assign]
    records = [Record(str(i), f"a dog number {i} runs", None, ("a dog runs",)) for i in range(19)]
    score_in_full_chunks(scorer, records)
    assert sizes == [8, 8, 3]
