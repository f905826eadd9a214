"""ResultWriter: commit, kill, resume, signature checks and byte equality with an uninterrupted run."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from qace.data.output import ResultWriter, errors_path
from qace.errors import OutputError, QACEError, ResumeError

ROOT = Path(__file__).resolve().parents[2]
SIG = "QACE-Ref|qg:t5-base|version:0.1.0"
N = 23


def _row(i: int) -> dict[str, Any]:
    """Rows with nested fields and kinds that vary between rows, like real explanations."""
    row: dict[str, Any] = {
        "id": f"r{i}",
        "score": i / 7,
        "n_questions": i % 4,
        "questions": [{"q": f"what is {i}?", "a": "a dog", "f1": 0.5}] * (i % 3),
        "flags": ["truncated"] if i % 5 == 0 else [],
        "signature": SIG,
    }
    if i % 6 == 0:
        row["note"] = "only some rows have this"
    if i == 4:
        row["score"] = 1  # an int among floats
    return row


def _feed(writer: ResultWriter, ids: range) -> None:
    done = writer.done_ids()
    for i in ids:
        if f"r{i}" in done:
            continue
        if i % 9 == 3:
            writer.add_error(f"r{i}", "line {i}: empty caption")
        else:
            writer.add(_row(i))


def _uninterrupted(path: Path) -> None:
    with ResultWriter(path, signature=SIG, chunk_size=4) as writer:
        _feed(writer, range(N))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_kill_and_resume_is_byte_identical(tmp_path: Path, suffix: str) -> None:
    reference = tmp_path / "ref" / f"scores{suffix}"
    reference.parent.mkdir()
    _uninterrupted(reference)

    path = tmp_path / f"scores{suffix}"
    killed = ResultWriter(path, signature=SIG, chunk_size=4)
    _feed(killed, range(10))  # commits chunks at 4 and 8 items; 2 stay pending and are lost
    partial = path.with_name(path.name + ".partial")
    (partial / "000002.rows.jsonl.tmp").write_text('{"id": "half-writ')  # killed mid-commit
    (partial / "000002.rows.jsonl").write_text('{"id": "r8"}\n')  # replaced but not in the manifest
    del killed
    assert not path.exists()

    with ResultWriter(path, signature=SIG, resume=True, chunk_size=4) as resumed:
        done = resumed.done_ids()
        assert done == {f"r{i}" for i in range(8)}
        _feed(resumed, range(N))

    assert path.read_bytes() == reference.read_bytes()
    errors = errors_path(path)
    assert errors.read_bytes() == errors_path(reference).read_bytes()
    assert not partial.exists() and not path.with_name(path.name + ".tmp").exists()
    assert [json.loads(x)["id"] for x in errors.read_text().splitlines()] == ["r3", "r12", "r21"]


def test_jsonl_content_and_order(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    _uninterrupted(path)
    rows = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(N) if i % 9 != 3]
    assert rows[0] == _row(0)


def test_parquet_unifies_schema_and_stores_nested_as_json(tmp_path: Path) -> None:
    path = tmp_path / "out.parquet"
    _uninterrupted(path)
    table = pq.read_table(path)
    meta = table.schema.metadata
    assert meta[b"qace.signature"].decode() == SIG
    assert set(json.loads(meta[b"qace.json_columns"])) == {"questions", "flags"}
    assert str(table.schema.field("score").type) == "double"
    assert str(table.schema.field("n_questions").type) == "int64"
    rows = table.to_pylist()
    assert (
        rows[3]["id"] == "r4"
        and rows[3]["score"] == 1.0
        and rows[1]["note"] is None
        and rows[0]["note"] == "only some rows have this"
    )
    assert json.loads(rows[2]["questions"]) == _row(2)["questions"]


def test_signature_mismatch_on_partial_names_both(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    writer = ResultWriter(path, signature=SIG, chunk_size=2)
    _feed(writer, range(3))
    with pytest.raises(ResumeError) as info:
        ResultWriter(path, signature="QACE-Img|other", resume=True)
    assert SIG in str(info.value) and "QACE-Img|other" in str(info.value)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_signature_mismatch_on_complete_output(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"out{suffix}"
    _uninterrupted(path)
    with pytest.raises(ResumeError, match="QACE-Img"):
        ResultWriter(path, signature="QACE-Img|other", resume=True)


def test_without_resume_existing_output_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    writer = ResultWriter(path, signature=SIG)
    writer.add(_row(0))
    with pytest.raises(ResumeError, match="--resume"):
        ResultWriter(path, signature=SIG)  # partial exists
    writer.close()
    with pytest.raises(ResumeError, match="--resume"):
        ResultWriter(path, signature=SIG)  # final exists


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_resume_complete_output_reports_all_ids_and_rewrites_nothing(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"out{suffix}"
    _uninterrupted(path)
    before = path.stat().st_mtime_ns, path.read_bytes()
    with ResultWriter(path, signature=SIG, resume=True) as writer:
        assert writer.done_ids() == {f"r{i}" for i in range(N)}
        _feed(writer, range(N))  # everything done: nothing added
        with pytest.raises(ResumeError, match="already complete"):
            writer.add(_row(N))
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before


def test_duplicate_id_is_a_caller_bug(tmp_path: Path) -> None:
    writer = ResultWriter(tmp_path / "out.jsonl", signature=SIG)
    writer.add(_row(1))
    with pytest.raises(QACEError, match="duplicate"):
        writer.add(_row(1))
    with pytest.raises(QACEError, match="duplicate"):
        writer.add_error("r1", "also a duplicate")
    with pytest.raises(QACEError, match="string 'id'"):
        writer.add({"score": 1.0})


def test_resumed_done_id_cannot_be_added_again(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    writer = ResultWriter(path, signature=SIG, chunk_size=1)
    writer.add(_row(0))
    resumed = ResultWriter(path, signature=SIG, resume=True, chunk_size=1)
    with pytest.raises(QACEError, match="duplicate"):
        resumed.add(_row(0))


def test_exception_inside_context_keeps_work_for_resume(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError), ResultWriter(path, signature=SIG, chunk_size=100) as writer:
        writer.add(_row(0))
        writer.add(_row(1))
        raise RuntimeError("model crashed")
    assert not path.exists()
    with ResultWriter(path, signature=SIG, resume=True, chunk_size=100) as writer:
        assert writer.done_ids() == {"r0", "r1"}


def test_numpy_values_and_non_finite(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with ResultWriter(path, signature=SIG) as writer:
        writer.add({"id": "a", "score": np.float32(0.5), "per_q": np.array([1.0, 0.0])})
        with pytest.raises(QACEError, match="'b'"):
            writer.add({"id": "b", "score": float("nan")})
        writer.add({"id": "b", "score": 0.0})  # the failed row did not claim its id
    assert json.loads(path.read_text().splitlines()[0]) == {"id": "a", "score": 0.5, "per_q": [1.0, 0.0]}


def test_format_and_format_mismatch(tmp_path: Path) -> None:
    with pytest.raises(QACEError, match="output format"):
        ResultWriter(tmp_path / "out.csv", signature=SIG)
    path = tmp_path / "out.data"
    writer = ResultWriter(path, signature=SIG, fmt="jsonl", chunk_size=1)
    writer.add(_row(0))
    with pytest.raises(ResumeError, match="jsonl"):
        ResultWriter(path, signature=SIG, fmt="parquet", resume=True)


def test_empty_run_writes_empty_output(tmp_path: Path) -> None:
    for suffix in (".jsonl", ".parquet"):
        path = tmp_path / f"empty{suffix}"
        with ResultWriter(path, signature=SIG):
            pass
        assert path.exists() and not path.with_name(f"empty{suffix}.partial").exists()
        with ResultWriter(path, signature=SIG, resume=True) as writer:
            assert writer.done_ids() == set()


def test_corrupt_partial_or_final_is_a_resume_error(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    writer = ResultWriter(path, signature=SIG, chunk_size=1)
    writer.add(_row(0))
    partial = path.with_name("out.jsonl.partial")
    (partial / "000000.rows.jsonl").unlink()
    with pytest.raises(ResumeError, match="missing committed chunk 000000.rows.jsonl"):
        ResultWriter(path, signature=SIG, resume=True, chunk_size=1)
    (partial / "manifest.json").write_text("{not json")
    with pytest.raises(ResumeError, match="unreadable"):
        ResultWriter(path, signature=SIG, resume=True, chunk_size=1)
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text("this is not ours\n")
    with pytest.raises(ResumeError, match="cannot read existing output"):
        ResultWriter(foreign, signature=SIG, resume=True, chunk_size=1)


def test_errors_are_keyed_by_input_line_not_id(tmp_path: Path) -> None:
    """An unreadable record (no id) and a duplicate of a scored id are errors of their own lines."""
    path = tmp_path / "out.jsonl"
    writer = ResultWriter(path, signature=SIG, chunk_size=2)
    writer.add(_row(1))
    writer.add_error("r1", "duplicate id 'r1'", line=7)
    writer.add_error(None, "malformed JSON", line=3)
    with pytest.raises(QACEError, match="input line 3"):
        writer.add_error(None, "again", line=3)
    with pytest.raises(QACEError, match="an id or an input line"):
        writer.add_error(None, "nowhere")
    writer.flush()
    resumed = ResultWriter(path, signature=SIG, resume=True, chunk_size=2)
    assert resumed.done_ids() == {"r1"} and resumed.done_lines() == {3, 7}
    resumed.close()
    errors = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").open()]
    assert errors == [
        {"id": "r1", "line": 7, "reason": "duplicate id 'r1'"},
        {"id": None, "line": 3, "reason": "malformed JSON"},
    ]


def test_output_without_signature_is_resumed_only_when_forced(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text(json.dumps({"id": "a", "score": 0.5}) + "\n")
    with pytest.raises(ResumeError, match="no signature.*--force"):
        ResultWriter(path, signature=SIG, resume=True)
    with ResultWriter(path, signature=SIG, resume=True, force=True) as writer:
        assert writer.done_ids() == {"a"}


def test_partial_without_input_log_is_resumed_only_when_forced(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    writer = ResultWriter(path, signature=SIG, chunk_size=1)  # as an older qace wrote it
    writer.add(_row(0))
    with pytest.raises(ResumeError, match="no fingerprint of its input.*--force"):
        ResultWriter(path, signature=SIG, resume=True, input_log=True, chunk_size=1)
    forced = ResultWriter(path, signature=SIG, resume=True, input_log=True, force=True, chunk_size=1)
    assert forced.done_ids() == {"r0"} and list(forced.committed_marks()) == []


def test_resume_refuses_another_chunk_size(tmp_path: Path) -> None:
    """A scorer batches within a chunk: resumed with other chunks, later rows would differ in rounding."""
    path = tmp_path / "out.jsonl"
    writer = ResultWriter(path, signature=SIG, chunk_size=4)
    _feed(writer, range(9))
    del writer  # killed
    with pytest.raises(ResumeError, match="written with --chunk-size 4 but this run has 8.*--chunk-size 4"):
        ResultWriter(path, signature=SIG, resume=True, chunk_size=8)
    with ResultWriter(path, signature=SIG, resume=True, chunk_size=4) as resumed:
        _feed(resumed, range(N))
    reference = tmp_path / "ref" / "out.jsonl"
    reference.parent.mkdir()
    _uninterrupted(reference)
    assert path.read_bytes() == reference.read_bytes()


def test_jsonl_and_parquet_outputs_keep_their_own_errors(tmp_path: Path) -> None:
    jsonl, parquet = tmp_path / "out.jsonl", tmp_path / "out.parquet"
    assert (errors_path(jsonl).name, errors_path(parquet).name) == (
        "out.errors.jsonl",
        "out.parquet.errors.jsonl",
    )
    _uninterrupted(jsonl)
    kept = errors_path(jsonl).read_bytes()
    with ResultWriter(parquet, signature=SIG, chunk_size=4) as writer:  # not refused: nothing is shared
        writer.add_error("other", "only the Parquet run's error")
    assert errors_path(jsonl).read_bytes() == kept
    assert [json.loads(line)["id"] for line in errors_path(parquet).open()] == ["other"]
    with ResultWriter(parquet, signature=SIG, resume=True, chunk_size=4):
        pass
    with ResultWriter(tmp_path / "clean.parquet", signature=SIG) as writer:
        writer.add(_row(0))
    assert errors_path(jsonl).read_bytes() == kept  # a run without errors removes only its own file


def test_a_run_that_fails_before_its_first_commit_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError), ResultWriter(path, signature=SIG, chunk_size=4):
        raise RuntimeError("the input could not be read")
    assert list(tmp_path.iterdir()) == []
    with ResultWriter(path, signature=SIG, chunk_size=4) as writer:  # the corrected rerun starts
        writer.add(_row(0))
    assert path.exists()


def _in_child(script: str, *, stdin: int | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_writer_in_another_process_is_refused(tmp_path: Path) -> None:
    """An output being written (a killed run's worker still going, a second --resume) is locked."""
    path = tmp_path / "out.jsonl"
    holder = _in_child(
        "import sys\nfrom qace.data.output import ResultWriter\n"
        f"w = ResultWriter({str(path)!r}, signature='s', chunk_size=1)\n"
        "w.add({'id': 'a', 'signature': 's'})\nprint('open', flush=True)\nsys.stdin.read()\nw.close()\n",
        stdin=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n", holder.stderr
        with pytest.raises(ResumeError, match="is being written by another process.*writer.lock"):
            ResultWriter(path, signature="s", resume=True, chunk_size=1)
    finally:
        holder.communicate("", timeout=60)
    assert holder.returncode == 0 and path.read_text() == '{"id": "a", "signature": "s"}\n'
    with ResultWriter(path, signature="s", resume=True, chunk_size=1) as writer:  # released
        assert writer.done_ids() == {"a"}


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_out_of_space_is_one_line_removes_temporaries_and_resume_continues(
    tmp_path: Path, suffix: str
) -> None:
    """``ulimit -f`` below the final file's size: every chunk commits, assembling the output fails
    with one message naming the file and its bytes, no ``.tmp`` stays, and ``--resume`` finishes it."""
    reference = tmp_path / "ref" / f"scores{suffix}"
    reference.parent.mkdir()
    _uninterrupted(reference)
    path = tmp_path / f"scores{suffix}"
    limit = reference.stat().st_size - 1
    child = _in_child(
        "import resource, sys\nfrom qace.data.output import ResultWriter\n"
        "from qace.errors import OutputError\nfrom tests.data.test_data_output import N, SIG, _feed\n"
        "hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, hard))\n"
        "try:\n"
        f"    with ResultWriter({str(path)!r}, signature=SIG, chunk_size=4) as writer:\n"
        "        _feed(writer, range(N))\n"
        "except OutputError as exc:\n"
        "    sys.exit(f'error: {exc}')\n"
    )
    _, err = child.communicate(timeout=120)
    assert child.returncode == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: cannot write {path}: the file size limit (ulimit -f, or the file")
    assert " bytes; what was committed is kept, so make room and rerun with --resume" in err
    assert not path.exists() and not list(tmp_path.rglob("*.tmp"))
    with ResultWriter(path, signature=SIG, resume=True, chunk_size=4) as resumed:
        assert len(resumed.done_ids()) + len(resumed.done_lines()) == N
        _feed(resumed, range(N))
    assert path.read_bytes() == reference.read_bytes()


def test_a_full_disk_at_the_first_manifest_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    path = tmp_path / "out.jsonl"
    with pytest.raises(OutputError, match=r"manifest.json: no space left on its disk: \d+ bytes needed"):
        ResultWriter(path, signature=SIG)
    assert list(tmp_path.iterdir()) == []
