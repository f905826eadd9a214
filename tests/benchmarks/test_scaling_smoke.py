"""``benchmarks/scaling.py --tiny``: one and two CPU shard workers on the distinct workload, a sane report,
forced outputs in workers; each worker's share of a GPU host's cores.

The shard workers build their scorer through ``benchmarks.scaling:forced_scorer``; their scores must
equal those of an in-process scorer with the same forced outputs (a worker without them would score
the tiny random models' own outputs, which differ).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import scaling
from benchmarks.workload import force_lengths, pascal_workload
from qace.api import QACE
from qace.data.features import RandomFeatureStore
from qace.data.records import Record
from tests.helpers import SHARED_DATA

N = 24


@pytest.fixture(scope="module")
def report(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("scaling") / "scaling.json"
    argv = ["--tiny", "--variants", "img", "--n", str(N), "--out", str(out), "--models-dir", str(tiny_models)]
    assert scaling.main(argv) == 0  # QACE-Ref's shards run in test_scaling_ray_smoke.py
    return json.loads(out.read_text())


def test_report_shape(report: dict[str, Any]) -> None:
    assert report["command"].startswith("python -m benchmarks.scaling --tiny")
    assert (report["precision"], report["gpu"], report["tiny"]) == ("fp32", None, True)
    assert report["paths"]["shards"].endswith("scorer_factory=benchmarks.scaling:forced_scorer")
    assert report["workload"] | {"name": None} == {
        "name": None, "kind": "distinct", "records": N, "distinct_captions": N, "repeat": 1,
    }  # fmt: skip
    assert report["settings"]["candidate_cache"] is False  # distinct: every caption parsed
    assert [r["variant"] for r in report["results"]] == ["img"]
    assert set(report["target_met_steady"]) == {"shards"}
    assert isinstance(report["target_met_steady"]["shards"], bool)
    for result in report["results"]:
        one, two = result["runs"]
        assert (one["devices"], two["devices"]) == (["cpu"], ["cpu", "cpu"])
        for run in (one, two):
            assert run["path"] == "shards" and run["captions"] == N
            assert run["settings_per_worker"] == {}  # on the CPU: QACE's own (no processes)
            assert 0 < run["steady_seconds"] < run["wall_seconds"]
            assert run["captions_per_s_wall"] == pytest.approx(N / run["wall_seconds"])
            assert run["captions_per_s_steady"] == pytest.approx(N / run["steady_seconds"])
            assert 0.0 < run["host_cpu_busy_steady"] <= 1.0  # the workers were busy on this host's CPUs
            assert len(run["workers"]) == len(run["devices"])
            assert sum(w["rows"] for w in run["workers"]) == N
            for w in run["workers"]:
                assert (w["host_workers"], w["spacy_workers"], w["engine_core"]) == (0, 0, False)
                assert w["load_seconds"] > 0 and w["warmup_seconds"] > 0 and w["imports_seconds"] > 0
                assert 0 <= w["begun_after_seconds"] < w["ready_after_seconds"]
                assert w["ready_after_seconds"] <= w["started_after_seconds"] < w["ended_after_seconds"]
                assert w["ended_after_seconds"] <= run["wall_seconds"]
        for kind in ("wall", "steady"):
            speedup = two[f"captions_per_s_{kind}"] / one[f"captions_per_s_{kind}"]
            assert two[f"speedup_{kind}"] == pytest.approx(speedup)
            assert two[f"efficiency_{kind}"] == pytest.approx(speedup / 2)
        assert two["vs_first_run"]["max_abs_qace_diff"] < 1e-5  # fp32: batching moves the 7th digit


def test_workers_used_the_forced_outputs(report: dict[str, Any], tiny_models: Path) -> None:
    scorer = force_lengths(
        QACE(
            models=tiny_models,
            variant="img",
            features=RandomFeatureStore(seed=0),
            device="cpu",
            precision="fp32",
            progress=False,
        )
    )
    rows = list(scorer.score_records(pascal_workload(SHARED_DATA, N)))
    (result,) = report["results"]
    for run in result["runs"]:
        assert run["mean_qace"] == pytest.approx(float(np.mean([r["qace"] for r in rows])), abs=1e-6)


def test_workers_start_up_side_by_side_and_score_together(report: dict[str, Any]) -> None:
    for result in report["results"]:
        run = result["runs"][1]
        workers = run["workers"]
        assert run["startup"]["concurrent"] is True  # each began before the first was ready
        assert all(w["begun_after_seconds"] < run["startup"]["first_ready_after_seconds"] for w in workers)
        assert run["startup"]["last_ready_after_seconds"] == max(w["ready_after_seconds"] for w in workers)
        assert all(w["started_after_seconds"] >= run["startup"]["last_ready_after_seconds"] for w in workers)


def test_per_worker_settings_share_a_gpu_hosts_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 cores a GPU (the 2-GPU H200 host's 32): 4 host and 10 spaCy processes a worker, as
    ``qace score --gpus`` gives them; settings given on the command line are kept for every worker."""
    monkeypatch.setattr("qace.config._cores", lambda: 32)
    args = argparse.Namespace(host_workers=None, spacy_workers=None)
    assert scaling.per_worker_settings(args, ["cuda:0", "cuda:1"]) == {"host_workers": 4, "spacy_workers": 10}
    assert scaling.per_worker_settings(args, ["cuda:0"]) == {"host_workers": 4, "spacy_workers": 14}
    assert scaling.per_worker_settings(args, ["cpu", "cpu"]) == {}
    given = argparse.Namespace(host_workers=2, spacy_workers=None)
    assert scaling.per_worker_settings(given, ["cuda:0", "cuda:1"]) == {
        "host_workers": 2,
        "spacy_workers": 12,
    }
    actor = scaling.ray_actor_settings(
        argparse.Namespace(device="cuda", ray_batch_size=8192, ray_concurrent_calls=None),
        2,
        {"host_workers": 4, "spacy_workers": 10},
    )
    assert actor == {
        "actors": 2, "gpus_per_actor": 1.0, "cpus_per_actor": 16.0, "batch_size": 8192, "concurrent_calls": 2,
        "torch_threads": None,
    }  # fmt: skip


def test_write_input_repeats_with_new_ids(tmp_path: Path) -> None:
    records = [Record("a", "a dog", "i1", ("a dog runs",)), Record("b", "a cat", "i2", ("a cat sits",))]
    path = tmp_path / "in.jsonl"
    assert scaling.write_input(records, 3, path) == 6
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "a~1", "b~1", "a~2", "b~2"]
    assert [r["caption"] for r in rows] == ["a dog", "a cat"] * 3
    assert rows[3]["references"] == ["a cat sits"] and rows[3]["image_id"] == "i2"
    parts = scaling.split_input(path, 4, tmp_path / "parts")
    assert [len(p.read_text().splitlines()) for p in parts] == [2, 2, 1, 1]
    assert "".join(p.read_text() for p in parts) == path.read_text()


def test_compare_scores() -> None:
    got = scaling.compare({"a": 0.5, "b": 0.25}, {"a": 0.5, "b": 0.5})
    assert got == {"max_abs_qace_diff": 0.25, "mean_abs_qace_diff": 0.125, "share_identical": 0.5}
    with pytest.raises(RuntimeError, match="different ids"):
        scaling.compare({"a": 0.5}, {"b": 0.5})


@pytest.mark.parametrize("start", ["ready", "scoring"])
def test_a_worker_starting_as_qace_score_does_is_ready_once_loaded(tiny_models: Path, start: str) -> None:
    """``--start scoring``: the factory returns with no host process started (scoring starts them, as
    ``qace score``'s workers do); ``--start ready``: with every host process ready."""
    scorer = scaling.forced_scorer(
        device="cpu", start=start, models=tiny_models, variant="img", features=RandomFeatureStore(seed=0),
        precision="fp32", progress=False, host_workers=1, spacy_workers=0,
    )  # fmt: skip
    try:
        assert (scorer.host is not None and scorer.host.ready()) == (start == "ready")
    finally:
        scorer.close()


def test_an_unknown_start_is_refused_before_the_models_load(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'ready' or 'scoring'"):
        scaling.forced_scorer(device="cpu", start="eager", models=tmp_path / "no-models")


def test_the_host_cpu_share_is_read_between_the_samples_around_a_window() -> None:
    cpu = scaling.HostCpu()
    cpu.samples = [(10.0, 100, 1000), (11.0, 400, 1400), (12.0, 500, 1800)]
    assert cpu.busy(10.0, 11.0) == pytest.approx(300 / 400)
    assert cpu.busy(10.5, 11.5) == pytest.approx(400 / 800)  # widened to the samples at 10 and 12
    assert cpu.busy(9.0, 11.0) is None and cpu.busy(10.0, 13.0) is None  # no sample before / after
