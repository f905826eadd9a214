"""``benchmarks/latency.py --tiny``: runs on the CPU and writes a sane report (numbers are not checked).

One tiny run (both variants, batches of 4 and 8, in process and through the real service) is shared by
the tests; the service must return exactly the in-process rewards for the same batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from benchmarks import latency  # noqa: E402
from qace.data.records import Record  # noqa: E402
from tests.helpers import SHARED_DATA  # noqa: E402

PATHS = ["in-process", "in-process:worker-thread", "service:/v1/reward", "service:/get_reward"]


RESETS: list[str] = []
"""The variant of each `reset_caches` call the fixture's run made."""


@pytest.fixture(scope="module")
def report(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("latency") / "latency.json"
    real_reset = latency.reset_caches
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            latency, "reset_caches", lambda scorer: (RESETS.append(scorer.config.variant), real_reset(scorer))
        )
        argv = [
            "--tiny",
            "--worker-thread",
            "--rounds",
            "2",
            "--out",
            str(out),
            "--models-dir",
            str(tiny_models),
        ]
        assert latency.main(argv) == 0
    return json.loads(out.read_text())


def test_each_cell_starts_from_emptied_caches(report: dict[str, Any]) -> None:
    """The paths time the same batches: no cell's round may meet captions another left tokenised."""
    timed = [c["variant"] for c in report["cells"] if "p50_ms" in c]
    assert RESETS == [variant for variant in timed for _ in range(2)] and len(timed) > 2


def test_report_metadata(report: dict[str, Any]) -> None:
    assert report["command"].startswith("python -m benchmarks.latency --tiny")
    assert (report["device"], report["precision"], report["gpu"]) == ("cpu", "fp32", None)
    assert report["versions"]["torch"] and report["versions"]["transformers"] and report["tiny"] is True
    assert report["target_met"] is None  # no 256-caption cell in a tiny run
    for variant, prefix in (("img", "QACE-Img|"), ("ref", "QACE-Ref|")):
        assert report["variants"][variant]["signature"].startswith(prefix)
        assert report["variants"][variant]["warmup_records"] == 8


def test_every_cell_timed_and_sane(report: dict[str, Any]) -> None:
    cells = report["cells"]
    keys = [(c["variant"], c["batch"], c["path"]) for c in cells]
    assert keys == [(v, b, p) for v in ("img", "ref") for b in (4, 8) for p in PATHS]
    for cell in cells:
        assert "skipped" not in cell
        assert cell["iterations"] == 2 and cell["warmup"] == 1 and cell["rounds"] == 2
        assert len(cell["p50_ms_by_round"]) == 2 and cell["min_ms"] == min(cell["p50_ms_by_round"])
        assert 0 < cell["min_ms"] <= cell["p50_ms"] <= cell["p99_ms"] <= cell["max_ms"]
        assert cell["min_ms"] <= cell["mean_ms"] <= cell["max_ms"]
        assert 0.0 <= cell["mean_reward"] <= 1.0
        assert 1 <= cell["distinct_captions_per_batch"] <= cell["batch"]
        assert cell["graph_captures_in_timed_calls"] == 0  # CPU: no CUDA graphs


def test_other_paths_give_the_in_process_rewards(report: dict[str, Any]) -> None:
    """The service's paths, and the call made on a worker thread (the service's arrangement without
    HTTP, ``--worker-thread``), score the same batches: the in-process rewards."""
    others = [c for c in report["cells"] if c["path"] != "in-process"]
    assert len(others) == 12
    for cell in others:  # float32 tensor vs JSON float: equal to float32 rounding
        assert cell["max_abs_diff_vs_in_process"] <= 1e-6
    threaded = [c["max_abs_diff_vs_in_process"] for c in others if c["path"] == "in-process:worker-thread"]
    assert threaded == [0.0] * 4


def test_time_budget_skips_cells(tiny_models: Path, tmp_path: Path) -> None:
    out = tmp_path / "budget.json"
    argv = ["--tiny", "--no-service", "--variants", "ref", "--max-seconds", "1e-9"]
    assert latency.main([*argv, "--out", str(out), "--models-dir", str(tiny_models)]) == 0
    cells = json.loads(out.read_text())["cells"]
    assert [(c["path"], c["batch"]) for c in cells] == [("in-process", 4), ("in-process", 8)]
    assert all("skipped" in c and "p50_ms" not in c for c in cells)


def test_rounds_split_the_calls_and_give_each_its_own_warm_up_batches() -> None:
    assert latency.rounds(10, 3, 2) == [
        (range(0, 4), range(0, 2)),
        (range(4, 7), range(2, 4)),
        (range(7, 10), range(4, 6)),
    ]
    assert latency.rounds(5, 1, 0) == [(range(0, 5), range(0, 0))]
    with pytest.raises(SystemExit):
        latency.parse_args(["--tiny", "--rounds", "3"])  # 2 iterations a cell: at most 2 rounds
    assert latency.parse_args(["--tiny"]).rounds == 2  # the paths take turns by default
    assert latency.parse_args(["--tiny", "--iterations", "1"]).rounds == 1


def test_summary_statistics() -> None:
    stats = latency.summarize([0.010, 0.020, 0.030, 0.040, 1.0])
    assert stats["p50_ms"] == pytest.approx(30.0)
    assert stats["mean_ms"] == pytest.approx(220.0)
    assert 40.0 < stats["p99_ms"] < 1000.0 and stats["max_ms"] == pytest.approx(1000.0)


def test_batches_are_seeded_and_distinct_records() -> None:
    records = list(range(100))
    a = latency.draw(records, 10, seed=0, iteration=3)  # type: ignore[arg-type]
    assert a == latency.draw(records, 10, seed=0, iteration=3)  # type: ignore[arg-type]
    assert a != latency.draw(records, 10, seed=0, iteration=4)  # type: ignore[arg-type]
    assert len(set(a)) == 10


def test_no_host_processes_are_started(report: dict[str, Any]) -> None:
    """A reward call of one chunk is scored in the caller's process, host processes or not."""
    assert report["settings"]["host_workers"].startswith("not started")


@pytest.mark.parametrize("features_from", ["memory", "h5"])
def test_new_images_upload_every_call_and_change_no_reward(
    tiny_models: Path, tmp_path: Path, features_from: str
) -> None:
    """``--new-images``: each timed call uploads every image of its batch to the device's feature cache,
    and the rewards are those of the same batches without it (a renamed id has its image's features),
    with the features held in memory or read from an HDF5 store."""
    argv = ["--tiny", "--no-service", "--variants", "img", "--models-dir", str(tiny_models)]
    argv += ["--features-from", features_from]
    cells = {}
    for new in (False, True):
        out = tmp_path / f"new{new}.json"
        assert latency.main([*argv, "--out", str(out), *(["--new-images"] if new else [])]) == 0
        report = json.loads(out.read_text())
        assert report["settings"]["new_images_each_call"] is new
        assert report["settings"]["features_from"] == features_from
        cells[new] = {c["batch"]: c for c in report["cells"]}
    records = latency.flickr_workload(SHARED_DATA)
    for batch, cell in cells[True].items():
        assert cell["mean_reward"] == cells[False][batch]["mean_reward"]
        # two rounds of one timed call each: iterations 0 and 1
        images = [len({r.image_id for r in latency.draw(records, batch, 0, i)}) for i in range(2)]
        assert cell["feature_uploads_in_timed_calls"] == sum(images)


def test_new_image_ids_answer_with_their_image_features() -> None:
    from qace.data.features import RandomFeatureStore

    store = RandomFeatureStore(seed=3)
    new = latency.NewImageIds(store, ["a.jpg", "b@c.jpg"])
    assert new.identity == store.identity and new.ids() == ["a.jpg", "b@c.jpg"]
    assert (new.get("a.jpg@7") == store.get("a.jpg")).all() and new.get("a.jpg@-2") is new.get("a.jpg")
    assert (new.get("b@c.jpg@0") == store.get("b@c.jpg")).all()
    assert "a.jpg@5" in new and "z.jpg@5" not in new
    read: list[str] = []

    class Reading:
        signature, identity = "s", "i"

        def get(self, image_id: str) -> object:
            read.append(image_id)
            return store.get(image_id)

        def get_many(self, image_ids: list[str], pool: object) -> list[object]:
            return [self.get(i) for i in image_ids]

    through = latency.NewImageIds(Reading(), ["a.jpg"], held=False)
    assert (through.get("a.jpg@3") == store.get("a.jpg")).all() and read == ["a.jpg"]  # read when asked
    assert len(through.get_many(["a.jpg@4", "a.jpg@5"], None)) == 2 and read == ["a.jpg"] * 3
    records = [Record(id=str(i), caption=f"caption {i}", image_id=f"{i % 7}.jpg") for i in range(50)]
    renamed = latency.draw(records, 8, seed=0, iteration=4, new_images=True)
    plain = latency.draw(records, 8, seed=0, iteration=4)
    assert [r.image_id for r in renamed] == [f"{r.image_id}@4" for r in plain]
    assert [r.caption for r in renamed] == [r.caption for r in plain]
