"""``benchmarks/scaling.py --tiny --paths shards ray``: two CPU shard workers, then two Ray actors on a real
local cluster (``ray start --head``), on the same records: one row per record on each path, the same
scores, and the Ray settings in the record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # from inside Ray Data

from tests.helpers import run_benchmark  # noqa: E402

N = 24


@pytest.fixture(scope="module")
def report(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("scaling-ray") / "scaling.json"
    argv = ["--tiny", "--variants", "ref", "--counts", "2", "--paths", "shards", "ray", "--n", str(N),
            "--out", str(out), "--models-dir", str(tiny_models)]  # fmt: skip
    done = run_benchmark("scaling", argv)  # a process of its own: the Ray driver ends with it
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_both_paths_give_one_row_per_record_and_the_same_scores(report: dict[str, Any]) -> None:
    (result,) = report["results"]
    shards, ray = result["runs"]
    assert (shards["path"], ray["path"]) == ("shards", "ray")
    for run in (shards, ray):  # the benchmark fails a run with a record missing, twice, or in error
        assert run["captions"] == N and sum(w["rows"] for w in run["workers"]) == N
        assert run["device_count"] == 2 and len(run["workers"]) == 2
        assert run["startup"]["concurrent"] is True
    assert ray["vs_shards"]["max_abs_qace_diff"] < 1e-5  # the same tolerance as between shard counts
    assert ray["mean_qace"] == pytest.approx(shards["mean_qace"], abs=1e-6)


def test_ray_run_records_its_settings(report: dict[str, Any]) -> None:
    ray = report["results"][0]["runs"][1]
    placement = {key: ray[key] for key in ("actors", "gpus_per_actor", "cpus_per_actor", "batch_size")}
    assert placement == {"actors": 2, "gpus_per_actor": 0.0, "cpus_per_actor": 1.0, "batch_size": 8}
    settings = report["ray"]
    assert settings["cluster"]["num_cpus"] == 4 and settings["cluster"]["num_gpus"] == 0
    assert settings["cluster"]["object_store_memory_bytes"] == 2**28
    assert settings["read_parallelism"].startswith("2 input files")
    assert settings["batch_size_per_actor"] == 8 and "max_restarts=-1" in settings["concurrency"]
    assert report["versions"]["ray"] == settings["ray_version"]
    for w in ray["workers"]:
        assert w["ready_after_seconds"] > 0 and w["load_seconds"] > 0
