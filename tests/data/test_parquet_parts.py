"""Parquet output in Arrow parts: the result does not depend on where chunks were cut, kinds unify
across chunks as within one, and a chunk an older qace committed as JSONL still joins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from qace.data import parquet_parts
from qace.data.output import ResultWriter
from qace.data.parquet_parts import JsonText, plain_row
from qace.errors import QACEError

SIG = "QACE-Ref|qg:t5-base|version:0.1.0"

ROWS: list[dict[str, Any]] = [
    {"id": "a", "x": None, "n": 1, "mixed": "text", "flag": True},
    {"id": "b", "x": None, "n": 2, "mixed": "more", "flag": False},
    {"id": "c", "x": 0.25, "n": 3.5, "mixed": ["a", "list"], "flag": None, "late": {"k": [1, 2]}},
    {"id": "d", "x": 1.5, "n": 4, "mixed": 7, "flag": True, "big": 2**70},
    {"id": "e", "x": None, "n": -2, "mixed": None, "flag": False},
]


def _write(path: Path, chunk_size: int, rows: list[dict[str, Any]] = ROWS) -> None:
    with ResultWriter(path, signature=SIG, chunk_size=chunk_size) as writer:
        for row in rows:
            writer.add(row)


@pytest.mark.parametrize("chunk_size", [1, 2, 3])
def test_chunking_never_changes_the_bytes(tmp_path: Path, chunk_size: int) -> None:
    whole, cut = tmp_path / "whole.parquet", tmp_path / f"cut{chunk_size}.parquet"
    _write(whole, chunk_size=100)
    _write(cut, chunk_size=chunk_size)
    assert cut.read_bytes() == whole.read_bytes()


def test_kinds_unify_across_chunks_as_within_one(tmp_path: Path) -> None:
    path = tmp_path / "out.parquet"
    _write(path, chunk_size=2)  # chunk 1: x all null, n ints, mixed strings; chunk 2 brings the rest
    table = pq.read_table(path)
    types = {f.name: str(f.type) for f in table.schema}
    assert types == {
        "id": "string", "x": "double", "n": "double", "mixed": "string", "flag": "bool",
        "late": "string", "big": "string",
    }  # fmt: skip
    assert set(json.loads(table.schema.metadata[b"qace.json_columns"])) == {"mixed", "late", "big"}
    rows = table.to_pylist()
    assert [r["x"] for r in rows] == [None, None, 0.25, 1.5, None]
    assert [r["n"] for r in rows] == [1.0, 2.0, 3.5, 4.0, -2.0]
    assert [r["mixed"] for r in rows] == ['"text"', '"more"', '["a", "list"]', "7", None]
    assert json.loads(rows[2]["late"]) == {"k": [1, 2]} and rows[0]["late"] is None
    assert rows[3]["big"] == str(2**70)


def test_row_groups_have_a_fixed_size_whatever_the_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parquet_parts, "ROW_GROUP", 4)
    rows = [{"id": f"r{i}", "s": i / 3} for i in range(11)]
    path = tmp_path / "out.parquet"
    _write(path, chunk_size=3, rows=rows)
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [4, 4, 3]
    assert pq.read_table(path).column("s").to_pylist() == [i / 3 for i in range(11)]


def test_a_jsonl_chunk_of_an_older_qace_still_joins(tmp_path: Path) -> None:
    reference = tmp_path / "ref.parquet"
    _write(reference, chunk_size=2)
    path = tmp_path / "out.parquet"
    writer = ResultWriter(path, signature=SIG, chunk_size=2)
    for row in ROWS[:2]:
        writer.add(row)  # one committed chunk, rewritten below as an older qace committed it
    partial = path.with_name("out.parquet.partial")
    manifest = json.loads((partial / "manifest.json").read_text())
    del manifest["chunks"][0]["part"]
    (partial / "manifest.json").write_text(json.dumps(manifest))
    (partial / "000000.rows.arrow").unlink()
    (partial / "000000.rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:2]))
    del writer
    with ResultWriter(path, signature=SIG, resume=True, chunk_size=2) as resumed:
        assert resumed.done_ids() == {"a", "b"}
        for row in ROWS[2:]:
            resumed.add(row)
    assert path.read_bytes() == reference.read_bytes()


def test_errors_only_chunks_and_numpy_values(tmp_path: Path) -> None:
    path = tmp_path / "out.parquet"
    with ResultWriter(path, signature=SIG, chunk_size=1) as writer:
        writer.add_error("e1", "bad", line=1)
        writer.add({"id": "a", "score": np.float32(0.5), "per_q": np.array([1.0, 0.0])})
        with pytest.raises(QACEError, match="'b'"):
            writer.add({"id": "b", "score": float("inf")})
        writer.add({"id": "b", "score": 0.0})  # the refused row did not claim its id
    with ResultWriter(path, signature=SIG, resume=True) as again:
        assert again.done_ids() == {"a", "b"} and again.done_lines() == {1}
    rows = pq.read_table(path).to_pylist()
    assert rows == [
        {"id": "a", "score": 0.5, "per_q": "[1.0, 0.0]"},
        {"id": "b", "score": 0.0, "per_q": None},
    ]


def test_plain_row_values() -> None:
    row = {
        "id": "a",
        "s": "é",
        "none": None,
        "flag": False,
        "f": 0.25,
        "n": -(2**63),
        "big": 2**63,
        "np_f": np.float64(0.5),
        "np_i": np.int64(3),
        "flags": [],
        "per_q": np.array([1.0, 0.0]),
        "d": {"é": [1, None]},
    }
    plain = plain_row(row)
    assert list(plain) == list(row)
    assert plain["big"] == "9223372036854775808" and isinstance(plain["big"], JsonText)
    assert plain["flags"] == "[]" and isinstance(plain["flags"], JsonText)
    assert plain["per_q"] == "[1.0, 0.0]" and plain["d"] == '{"é": [1, null]}'
    assert type(plain["np_f"]) is float and type(plain["np_i"]) is int
    assert {k: plain[k] for k in ("s", "none", "flag", "f", "n")} == {
        k: row[k] for k in ("s", "none", "flag", "f", "n")
    }
    for bad in (float("nan"), np.float32("inf"), -float("inf")):
        with pytest.raises(ValueError):
            plain_row({"id": "b", "x": bad})
    with pytest.raises(TypeError):
        plain_row({"id": "c", "x": object()})
