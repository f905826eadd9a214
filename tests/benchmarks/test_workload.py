"""The benchmarks' shared workload helpers."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.workload import (
    MODELS_STAMP,
    build_models,
    flickr_workload,
    model_corpus,
    pascal_workload,
    score_in_full_chunks,
)
from qace.chunks import Tapered
from tests.helpers import SHARED_DATA


def test_profiled_passes_run_every_chunk_at_its_full_size() -> None:
    """One call longer than a chunk tapers (the reason for the helper); the helper makes calls of one
    full chunk each, the last one the rest."""
    tapered, chunks = Tapered(iter(range(4096)), 2048), []
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


def test_the_model_corpus_holds_both_workloads_text() -> None:
    """Whichever benchmark builds the models, the tokenizer learns PASCAL-50S's and Flickr8k-Expert's
    captions and references alike."""
    corpus = model_corpus(SHARED_DATA)
    assert corpus == sorted(set(corpus))
    flickr = flickr_workload(SHARED_DATA)
    pascal = pascal_workload(SHARED_DATA, 50, seed=7)
    for record in [*flickr[:50], *pascal]:
        assert record.caption in corpus and set(record.references or ()) <= set(corpus)


def test_a_models_dir_built_otherwise_is_refused(tmp_path: Path) -> None:
    """A complete build is reused only with the same corpus and seed in its stamp; a build without a
    stamp or with another seed raises (it would give other token counts), naming the way out."""
    (tmp_path / "bertscore").mkdir()
    (tmp_path / "bertscore" / "model.safetensors").write_bytes(b"")  # what marks a complete build
    with pytest.raises(RuntimeError, match="remove it or pass another --models-dir"):
        build_models(tmp_path, tmp_path / "no-data")
    stamp = {"corpus": "PASCAL-50S and Flickr8k-Expert captions and references", "seed": 0, "texts": 5}
    (tmp_path / MODELS_STAMP).write_text(json.dumps(stamp))
    assert build_models(tmp_path, tmp_path / "no-data") == tmp_path  # reused: the data is not read
    with pytest.raises(RuntimeError, match="another corpus or seed"):
        build_models(tmp_path, tmp_path / "no-data", seed=1)
