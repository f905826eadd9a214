"""Sharded scoring on CPU: the same rows as one unsharded run, in input order; a killed shard resumes.

Scores are compared to 1e-6, not bitwise: shards form other batches than one run does, and fp32
answerability moves in the 7th digit with batch composition (an engine property, not a shard one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qace.api import QACE
from qace.errors import QACEError, ResumeError
from qace.scale import shards
from qace.scale.shards import score_file_sharded
from tests.data.fuzz_corpus import check_invariant, make_corpus

EXAMPLES = Path(__file__).resolve().parents[2] / "qace" / "examples" / "captions.jsonl"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled examples plus records the reader or scorer reject, so errors keep their place."""
    path = tmp_path_factory.mktemp("shards") / "input.jsonl"
    lines = EXAMPLES.read_text().splitlines()
    lines.insert(3, '{"id": "bad-json", ')
    lines.insert(7, json.dumps({"id": "empty", "caption": "  ", "references": ["a dog"]}))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def scorer_kwargs(test_models_dir: Path) -> dict:
    return {"models": str(test_models_dir), "chunk_size": 3, "progress": False}


@pytest.fixture(scope="module")
def expected(
    inputs: Path, scorer_kwargs: dict, tmp_path_factory: pytest.TempPathFactory
) -> tuple[bytes, bytes]:
    out = tmp_path_factory.mktemp("single") / "out.jsonl"
    QACE(**scorer_kwargs).score_file(inputs, out)
    return out.read_bytes(), out.with_name("out.errors.jsonl").read_bytes()


def assert_same_rows(got: bytes, want: bytes) -> None:
    got_rows = [json.loads(line) for line in got.decode().splitlines()]
    want_rows = [json.loads(line) for line in want.decode().splitlines()]
    assert [r["id"] for r in got_rows] == [r["id"] for r in want_rows]
    for a, b in zip(got_rows, want_rows, strict=True):
        assert a.keys() == b.keys()
        for key, value in b.items():
            assert a[key] == (pytest.approx(value, abs=1e-6) if isinstance(value, float) else value), key


def test_two_cpu_shards_equal_one_run(inputs, scorer_kwargs, expected, tmp_path) -> None:
    out = tmp_path / "out.jsonl"
    summary = score_file_sharded(inputs, out, devices=["cpu", "cpu"], scorer_kwargs=scorer_kwargs)
    assert_same_rows(out.read_bytes(), expected[0])
    assert (tmp_path / "out.errors.jsonl").read_bytes() == expected[1]
    assert summary.scored == 11 and summary.errors == 3 and summary.skipped == 0
    assert not (tmp_path / "out.jsonl.shards").exists()
    with pytest.raises(ResumeError):
        score_file_sharded(inputs, out, devices=["cpu"], scorer_kwargs=scorer_kwargs)
    again = score_file_sharded(inputs, out, devices=["cpu", "cpu"], scorer_kwargs=scorer_kwargs, resume=True)
    assert again.scored == 0 and again.skipped == 14
    assert_same_rows(out.read_bytes(), expected[0])


def test_killed_shard_resumes_and_parquet_merge(
    inputs, scorer_kwargs, expected, tmp_path, monkeypatch
) -> None:
    """Shard 1 dies after its first committed chunk; the rerun scores only what it had not committed."""
    out = tmp_path / "out.parquet"
    work = tmp_path / "out.parquet.shards"
    shards._plan(inputs, work, 2, references=None, fmt="auto")
    job = shards.ShardJob(
        1, "cpu", str(work / "input-1.jsonl"), str(work / "shard-1.jsonl"), scorer_kwargs, False
    )
    real = QACE.score_records
    produced = []

    def dies_after_one_chunk(self, records):  # noqa: ANN001, ANN202
        for result in real(self, records):
            if len(produced) == 3:
                raise KeyboardInterrupt("killed")
            produced.append(result)
            yield result

    monkeypatch.setattr(QACE, "score_records", dies_after_one_chunk)
    with pytest.raises(KeyboardInterrupt):
        shards.run_shard(job)
    monkeypatch.undo()
    assert (work / "shard-1.jsonl.partial" / "manifest.json").exists()

    summary = score_file_sharded(
        inputs, out, devices=["cpu", "cpu"], scorer_kwargs=scorer_kwargs, resume=True
    )
    assert summary.skipped == 3 and summary.scored + summary.errors == 11
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    want = [json.loads(line) for line in expected[0].decode().splitlines()]
    assert table.column("id").to_pylist() == [row["id"] for row in want]
    assert table.column("qace").to_pylist() == pytest.approx([row["qace"] for row in want], abs=1e-6)
    assert (tmp_path / "out.parquet.errors.jsonl").read_bytes() == expected[1]


def test_failed_worker_is_reported(inputs, tmp_path) -> None:
    with pytest.raises(QACEError, match="shard 0 on cpu"):
        score_file_sharded(
            inputs,
            tmp_path / "o.jsonl",
            devices=["cpu"],
            scorer_kwargs={"models": str(tmp_path / "missing"), "progress": False},
        )
    shutil.rmtree(tmp_path / "o.jsonl.shards")


def test_resolve_devices_refuses_missing_gpus() -> None:
    import torch

    from qace.errors import BackendUnavailableError

    if torch.cuda.is_available():
        pytest.skip("this host has GPUs")
    with pytest.raises(BackendUnavailableError):
        shards.resolve_devices("all")
    with pytest.raises(BackendUnavailableError):
        shards.resolve_devices(2)


def test_cli_sharded_score(inputs, test_models_dir, tmp_path, capsys) -> None:
    from qace.cli import build_parser
    from qace.scale.cli import cmd_score_sharded

    out = tmp_path / "cli.jsonl"
    args = build_parser().parse_args(["score", str(inputs), "-o", str(out), "--models", str(test_models_dir)])
    assert cmd_score_sharded(args, devices=["cpu"]) == 0
    assert "scored 11 captions (3 errors" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 11


def test_resume_refuses_an_input_that_changed_since_the_plan(inputs, tmp_path) -> None:
    source = tmp_path / "in.jsonl"
    shutil.copy(inputs, source)
    work = tmp_path / "out.jsonl.shards"
    shards._plan(source, work, 2, references=None, fmt="auto")
    lines = source.read_text().splitlines()
    lines[9] = lines[9].replace('"caption": "', '"caption": "changed: ', 1)
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(ResumeError, match="line 10.*differs from when"):
        shards._plan(source, work, 2, references=None, fmt="auto")
    source.write_text("\n".join(lines[:5]) + "\n")
    with pytest.raises(ResumeError, match="fewer records"):
        shards._plan(source, work, 2, references=None, fmt="auto")


def test_fuzz_corpus_through_cpu_shards(test_models_dir, tmp_path, capsys) -> None:
    """The invariant of `qace score` holds through `--gpus` shards: every record of the CSV fuzz corpus
    is scored exactly once or listed with its line and reason."""
    from qace.cli import build_parser
    from qace.scale.cli import cmd_score_sharded

    corpus = make_corpus(tmp_path / "in", "csv", seed=18)
    out = tmp_path / "out.jsonl"
    argv = ["score", str(corpus.input), "-o", str(out), "--models", str(test_models_dir), *corpus.args]
    assert cmd_score_sharded(build_parser().parse_args(argv), devices=["cpu", "cpu"]) == 0
    ids = [json.loads(line)["id"] for line in out.open(encoding="utf-8")]
    errors = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").open(encoding="utf-8")]
    assert f"scored {len(ids)} captions ({len(errors)} errors" in capsys.readouterr().out
    check_invariant(corpus, ids, errors)
