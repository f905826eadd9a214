"""A Ray actor's side without a cluster: `BatchScorer` starts its scorer's host processes when built (each
batch is too short to start them by itself), and `score_dataset` sizes an actor's calls by its GPUs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from qace import scorers
from qace.scale.ray_data import CPU_ACTOR_BATCH, GPU_ACTOR_BATCH, BatchScorer


class _Scorer:
    signature = "fake"

    def __init__(self, **settings: Any) -> None:
        self.settings = settings
        self.started = 0

    def start_host_processes(self) -> None:
        self.started += 1

    def score_records(self, records: Any) -> Any:
        raise AssertionError("an actor's batch is scored in whole chunks (score_committed)")

    def score_committed(self, records: Any) -> Any:
        return ({"id": r.id, "qace": 0.5, "flags": []} for r in records)


class _Judge:
    """A scorer without host processes (the judges)."""

    signature = "judge"

    def __init__(self, **settings: Any) -> None:
        self.settings = settings


def scorer(**settings: Any) -> _Scorer:
    return _Scorer(**settings)


def judge(**settings: Any) -> _Judge:
    return _Judge(**settings)


def test_an_actor_starts_its_scorers_host_processes_when_built() -> None:
    entry = dataclasses.replace(scorers.get("qace-ref"), factory=f"{__name__}:scorer")
    actor = BatchScorer({"device": "cpu"}, entry=entry)
    assert isinstance(actor.scorer, _Scorer)
    assert actor.scorer.started == 1
    assert actor.scorer.settings["spacy_workers"] == 0  # Ray reserves the actor's CPUs


def test_an_actor_builds_a_scorer_without_host_processes() -> None:
    entry = dataclasses.replace(scorers.get("qace-ref"), factory=f"{__name__}:judge")
    assert isinstance(BatchScorer({"device": "cpu"}, entry=entry).scorer, _Judge)


class _Dataset:
    block_rows: int | None = None

    def repartition(self, *, target_num_rows_per_block: int) -> _Dataset:
        self.block_rows = target_num_rows_per_block
        return self

    def map_batches(self, fn: Any, **kwargs: Any) -> _Dataset:
        self.kwargs = kwargs
        return self


@pytest.mark.parametrize(
    ("gpus", "given", "expected"),
    [(1.0, None, GPU_ACTOR_BATCH), (0.0, None, CPU_ACTOR_BATCH), (1.0, 64, 64), (0.0, 4096, 4096)],
)
def test_an_actor_call_takes_a_gpu_sized_batch_unless_told(
    gpus: float, given: int | None, expected: int
) -> None:
    pytest.importorskip("ray")
    from qace.scale.ray_data import score_dataset

    ds = score_dataset(_Dataset(), gpus_per_actor=gpus, batch_size=given)
    assert ds.kwargs["batch_size"] == ds.block_rows == expected  # a block is one call


def test_an_actors_batch_is_scored_in_whole_chunks() -> None:
    """`score_committed`, not the ramp of `score_records` that each batch would pay again."""
    pa = pytest.importorskip("pyarrow")
    entry = dataclasses.replace(scorers.get("qace-ref"), factory=f"{__name__}:scorer")
    actor = BatchScorer({"device": "cpu"}, entry=entry)
    batch = pa.table({"id": ["a", "b"], "caption": ["a dog", "a cat"], "references": [["x"], ["y"]]})
    table = actor(batch)
    assert table.column("id").to_pylist() == ["a", "b"]
    assert table.column("qace").to_pylist() == [0.5, 0.5]
