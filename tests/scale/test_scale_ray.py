"""Ray Data path on CPU with the test models: scores equal the in-process scorer; resume by input
position; the fuzz corpus's every record gets exactly one row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # from inside Ray Data

from qace.api import QACE  # noqa: E402
from qace.scale.ray_data import read_scores, score_to_parquet  # noqa: E402
from tests.data.fuzz_corpus import check_invariant, make_corpus  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "qace" / "examples" / "captions.jsonl"


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray for the module; more logical CPUs than cores, or actors and reads deadlock."""
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        ignore_reinit_error=True,
        configure_logging=False,
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def test_ray_scores_and_resumes_by_input_position(ray_local, test_models_dir, tmp_path) -> None:
    records = [json.loads(line) for line in EXAMPLES.read_text().splitlines()]
    source = tmp_path / "captions.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records[:5]))
    kwargs = {"models": str(test_models_dir), "device": "cpu"}
    out = tmp_path / "scores"
    run = dict(scorer_kwargs=kwargs, actors=1, gpus_per_actor=0, batch_size=4, torch_threads=1)

    first = score_to_parquet(str(source), out, **run)  # a run that "died" after the first 5 captions
    assert first == {"scored": 5, "skipped": 0, "seconds": first["seconds"]}
    source.write_text(EXAMPLES.read_text())
    (out / "torn-write.parquet").write_bytes(b"PAR1 not a finished file")
    with pytest.raises(Exception, match="resume"):
        score_to_parquet(str(source), out, **run)
    second = score_to_parquet(str(source), out, resume=True, **run)
    assert second["scored"] == len(records) - 5 and second["skipped"] == 5
    assert not (out / "torn-write.parquet").exists()

    table = read_scores(out).to_pylist()
    got = {row["id"]: row for row in table}
    assert len(table) == len(got) == len(records)
    want = QACE(models=str(test_models_dir), progress=False).score(
        [r["caption"] for r in records],
        references=[r["references"] for r in records],
        ids=[r["id"] for r in records],
    )
    for row in want:
        if "error" in row:
            # the reader rejects it first, naming its line
            assert got[row["id"]]["error"].endswith(row["error"]) and got[row["id"]]["qace"] is None
        else:
            assert got[row["id"]]["qace"] == pytest.approx(row["qace"], abs=1e-6)
            assert got[row["id"]]["flags"] == row["flags"] and got[row["id"]]["signature"] == row["signature"]


def test_ray_fuzz_corpus_gets_one_row_per_record(ray_local, test_models_dir, tmp_path) -> None:
    """Malformed JSONL lines and Parquet rows become error rows with their file and line; none stops
    the job and none is lost or scored twice."""
    corpora = [make_corpus(tmp_path / fmt, fmt, seed=18) for fmt in ("jsonl", "parquet")]
    kwargs = {"models": str(test_models_dir), "device": "cpu"}
    result = score_to_parquet(
        [str(c.input) for c in corpora], tmp_path / "scores", scorer_kwargs=kwargs, actors=1,
        gpus_per_actor=0, batch_size=256, torch_threads=1,
    )  # fmt: skip
    table = read_scores(tmp_path / "scores").to_pylist()
    assert result["scored"] == len(table) == sum(len(c.records) for c in corpora)
    for corpus in corpora:
        rows = [row for row in table if row["source"] == str(corpus.input)]
        scored = [row["id"] for row in rows if row["error"] is None]
        assert all(row["qace"] is not None for row in rows if row["error"] is None)
        errors = [
            {"id": row["id"], "line": row["line"], "reason": row["error"]} for row in rows if row["error"]
        ]
        check_invariant(corpus, scored, errors)


def test_ray_scores_a_registered_metric_through_the_cli(ray_local, tmp_path) -> None:
    """``qace score-ray --metric``: the actors build the toy metric (`tests.toy_scorer`) from its entry;
    each record gets one row, with the metric's own columns and the reader's or the scorer's errors."""
    from qace.cli import main
    from tests.toy_scorer import registered

    out = tmp_path / "scores"
    argv = ["score-ray", str(EXAMPLES), "-o", str(out), "--metric", "length", "--length-unit", "chars"]
    with registered() as entry:
        assert main([*argv, "--gpus-per-actor", "0", "--batch-size", "4"]) == 0
    table = read_scores(out, entry.columns).to_pylist()
    rows = {row["id"]: row for row in table}
    records = [json.loads(line) for line in EXAMPLES.read_text().splitlines()]
    assert len(table) == len(rows) == len(records)
    for record in records:
        row = rows[record["id"]]
        if record["caption"].strip():
            assert row["length"] == len(record["caption"]) and row["error"] is None
        else:
            assert row["length"] is None and "empty" in row["error"]
        assert row["signature"].startswith("Length|unit:chars|")


def test_ray_scores_clip_s_and_refclip_s_in_one_pass(ray_local, tmp_path) -> None:
    """``qace score-ray --metric clip-s,refclip-s`` on the tiny CLIP: the actors build the combined entry
    from its strings; every record gets one row, with the single-process scores."""
    pytest.importorskip("PIL")
    from qace.cli import main
    from qace.combined import combined_entry
    from qace.testing.clip import make_clip_test_model

    clip = str(make_clip_test_model(tmp_path / "clip"))
    base = ["--metric", "clip-s,refclip-s", "--clip-model", clip]
    assert main(["score-ray", str(EXAMPLES), "-o", str(tmp_path / "ray"), *base, "--gpus-per-actor", "0",
                 "--batch-size", "4"]) == 0  # fmt: skip
    assert main(["score", str(EXAMPLES), "-o", str(tmp_path / "one.jsonl"), *base, "--no-progress"]) == 0
    rows = {
        row["id"]: row for row in read_scores(tmp_path / "ray", combined_entry(base[1]).columns).to_pylist()
    }
    single = [json.loads(line) for line in (tmp_path / "one.jsonl").open()]
    assert len(rows) == 12 and "empty" in rows["ex04"]["error"]
    for row in single:
        assert (rows[row["id"]]["clip_s"], rows[row["id"]]["refclip_s"]) == (row["clip_s"], row["refclip_s"])


@pytest.mark.parametrize("calls", [1, 2])
def test_an_actor_scores_its_concurrent_calls_at_once(ray_local, tmp_path, calls) -> None:
    """``concurrent_calls=2``: one actor runs two calls at the same time (the toy's first two calls wait for
    each other); with 1 they come one at a time and the toy says so in its rows."""
    from dataclasses import replace

    from tests.toy_scorer import ENTRY

    entry = replace(ENTRY, factory="tests.toy_scorer:MeetingLength")
    records = [json.loads(line) for line in EXAMPLES.read_text().splitlines()]
    inputs = []
    for i in range(4):  # four calls of three records
        path = tmp_path / f"part-{i}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records[3 * i : 3 * i + 3]))
        inputs.append(str(path))
    out = tmp_path / "scores"
    score_to_parquet(
        inputs, out, scorer_kwargs={"wait_s": 60.0 if calls == 2 else 2.0}, entry=entry, actors=1,
        gpus_per_actor=0, batch_size=3, concurrent_calls=calls,
    )  # fmt: skip
    table = read_scores(out, entry.columns).to_pylist()
    never_met = [row["id"] for row in table if row["error"] == "the first two calls never met"]
    assert len(table) == len(records)
    assert (len(never_met) == 0) if calls == 2 else (len(never_met) == 6)


@pytest.mark.parametrize("calls", [1, 2])
def test_the_calls_of_one_input_file_reach_every_actor(ray_local, tmp_path, calls) -> None:
    """One input file, four actors: every actor gets calls. The toy's calls each wait until all four actor
    processes have scored, so an actor that holds more than the calls it runs at once, or a file read as
    one task, leaves the waiting calls' records as errors."""
    from dataclasses import replace

    from tests.toy_scorer import ENTRY

    entry = replace(ENTRY, factory="tests.toy_scorer:CrowdedLength")
    source = tmp_path / "captions.jsonl"
    source.write_text("".join(json.dumps({"id": f"r{i}", "caption": "a dog runs"}) + "\n" for i in range(48)))
    (tmp_path / "meeting").mkdir()
    out = tmp_path / "scores"
    meeting = {"meeting_dir": str(tmp_path / "meeting"), "crowd": 4, "wait_s": 30.0}
    score_to_parquet(
        str(source), out, entry=entry, actors=4, gpus_per_actor=0, cpus_per_actor=0.5, batch_size=3,
        concurrent_calls=calls, scorer_kwargs=meeting,
    )  # fmt: skip
    table = read_scores(out, entry.columns).to_pylist()
    assert len(table) == 48
    assert [row["error"] for row in table if row["error"]] == []
    assert len(list((tmp_path / "meeting").iterdir())) == 4


def test_concurrent_calls_below_one_are_refused_before_the_cluster_is_reached(tmp_path) -> None:
    from qace.errors import ConfigError

    with pytest.raises(ConfigError, match="at least 1"):
        score_to_parquet(str(EXAMPLES), tmp_path / "out", actors=1, gpus_per_actor=0, concurrent_calls=0)
