"""``score_file_sharded(scorer_factory=...)``: every worker builds its scorer with the named callable.

The factory below records which device each worker gave it and turns on ``explain``, so its use is
visible both in the markers and in the rows; a wrong name fails before any shard work starts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from qace.api import QACE
from qace.errors import ConfigError, ResumeError
from qace.scale.shards import ShardJob, load_factory, run_shard, score_file_sharded
from qace.scoring import Summary

EXAMPLES = Path(__file__).resolve().parents[2] / "qace" / "examples" / "captions.jsonl"


def explaining_scorer(*, device: str, marker_dir: str, **kwargs: Any) -> QACE:
    """A factory taking one argument `QACE` does not know; it marks its call and explains every row."""
    (Path(marker_dir) / f"{os.getpid()}.json").write_text(json.dumps({"device": device}))
    return QACE(device=device, explain=True, **kwargs)


def _explained_on_two_cpus(out: Path, models: Path, markers: Path) -> Summary:
    """The example file scored into ``out`` by two CPU workers, each building `explaining_scorer`."""
    return score_file_sharded(
        EXAMPLES,
        out,
        devices=["cpu", "cpu"],
        scorer_kwargs={"models": str(models), "marker_dir": str(markers)},
        scorer_factory=f"{__name__}:explaining_scorer",
    )


def test_factory_builds_every_worker_scorer(test_models_dir: Path, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "out.jsonl"
    summary = _explained_on_two_cpus(out, test_models_dir, markers)
    calls = [json.loads(p.read_text()) for p in markers.iterdir()]
    assert sorted(c["device"] for c in calls) == ["cpu", "cpu"]  # one call per worker process
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    errors = [json.loads(line)["id"] for line in out.with_name("out.errors.jsonl").read_text().splitlines()]
    inputs = [json.loads(line)["id"] for line in EXAMPLES.read_text().splitlines()]
    assert [r["id"] for r in rows] == [i for i in inputs if i not in errors]  # input order kept
    assert (summary.scored, summary.errors) == (len(rows), len(errors))
    assert rows and all("explanation" in r for r in rows)  # the plain QACE default does not explain


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("qace.api.QACE", "must look like"),
        ("qace.no_such_module:f", "cannot load"),
        ("qace.api:no_such_function", "cannot load"),
        ("qace.api:log", "not callable"),
    ],
)
def test_wrong_factory_fails_before_any_work(name: str, message: str, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with pytest.raises(ConfigError, match=message):
        score_file_sharded(EXAMPLES, out, devices=["cpu"], scorer_factory=name)
    assert not out.with_name("out.jsonl.shards").exists()
    assert not out.exists()


def test_load_factory_returns_the_callable() -> None:
    assert load_factory("qace.api:QACE") is QACE


CLOSED: list[str] = []


def probed_scorer(*, device: str, **kwargs: Any) -> QACE:
    """A scorer whose candidate extractor reports being closed (into ``CLOSED``)."""
    scorer = QACE(device=device, **kwargs)
    close = scorer.candidates.close

    def recorded() -> None:
        CLOSED.append(device)
        close()

    scorer.candidates.close = recorded  # type: ignore[method-assign]
    return scorer


def test_shard_closes_the_spacy_pool(test_models_dir: Path, tmp_path: Path) -> None:
    """A spawned shard worker exits by joining its children: an open spaCy pool would hang it."""
    shard_input = tmp_path / "input-0.jsonl"
    lines = EXAMPLES.read_text().splitlines()[:2]
    shard_input.write_text("\n".join(lines) + "\n")
    job = ShardJob(
        0,
        "cpu",
        str(shard_input),
        str(tmp_path / "shard-0.jsonl"),
        {"models": str(test_models_dir), "spacy_workers": 1, "progress": False},
        False,
        scorer_factory=f"{__name__}:probed_scorer",
    )
    CLOSED.clear()
    assert run_shard(job)["scored"] == 2
    assert CLOSED == ["cpu"]


def test_workers_build_their_scorers_while_the_input_is_planned(
    test_models_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan (reading and splitting the input) waits here until both workers have called their
    factory: it completes only if the workers start before the plan, not after it."""
    from qace.scale import shards

    markers = tmp_path / "markers"
    markers.mkdir()
    out = tmp_path / "out.jsonl"
    plan = shards._plan

    def plan_once_both_build(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + 120  # a bound for a stuck run, not a speed
        while len(list(markers.iterdir())) < 2:
            assert time.monotonic() < deadline, "no worker called its factory before the plan"
            time.sleep(0.05)
        assert not out.with_name("out.jsonl.shards").exists()  # nothing planned yet
        return plan(*args, **kwargs)

    monkeypatch.setattr(shards, "_plan", plan_once_both_build)
    summary = _explained_on_two_cpus(out, test_models_dir, markers)
    rows = out.read_text().splitlines()
    assert summary.scored == len(rows) > 0 and summary.errors > 0  # the example holds bad records


def test_a_plan_that_fails_stops_the_workers_it_started(test_models_dir: Path, tmp_path: Path) -> None:
    """Resuming with another input fails at the plan; the workers, already loading, are stopped and no
    shard input or output is touched."""
    import psutil

    from qace.scale import shards

    other = tmp_path / "other.jsonl"
    other.write_text(EXAMPLES.read_text().splitlines()[0] + "\n")
    out = tmp_path / "out.jsonl"
    work = out.with_name("out.jsonl.shards")
    shards._plan(other, work, 2, references=None, fmt="auto")
    before = sorted(p.name for p in work.iterdir())
    with pytest.raises(ResumeError, match="planned for another input"):
        score_file_sharded(
            EXAMPLES, out, devices=["cpu", "cpu"], scorer_kwargs={"models": str(test_models_dir)}, resume=True
        )
    assert sorted(p.name for p in work.iterdir()) == before
    workers = [p for p in psutil.Process().children(recursive=True) if "qace-shard" in " ".join(p.cmdline())]
    assert workers == []
