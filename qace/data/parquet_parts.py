"""Parquet output in parts: each committed chunk becomes an Arrow part; `close` only joins them.

`qace.data.output.ResultWriter` commits Parquet output as one Arrow IPC file per chunk
(``NNNNNN.rows.arrow``), built column by column when the chunk commits, so the final assembly neither
parses JSON nor touches a row in Python: it reads the parts' schemas, unifies them, converts only the
columns whose kind differs between chunks, and streams fixed-size row groups.

Column kinds, per chunk and then over the whole output: booleans, integers, floats, strings and nulls
become typed columns (integers widen to float when mixed with floats); lists, dicts and columns of mixed
kinds become JSON strings, listed in the schema metadata key ``qace.json_columns``. Row groups hold
``ROW_GROUP`` rows whatever the chunk boundaries, so a resumed run writes the same bytes as an
uninterrupted one.

A row is checked when it is added (`plain_row`): non-finite floats and values JSON cannot hold are
refused there, before the row claims its id; numpy scalars and arrays become plain values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from itertools import chain, repeat
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP = 65536
JSON_COLUMNS = b"qace.json_columns"

_PLAIN = (str, int, bool, type(None))
_ARROW = {
    "null": pa.null(),
    "bool": pa.bool_(),
    "int": pa.int64(),
    "float": pa.float64(),
    "str": pa.string(),
    "json": pa.string(),
}
_KINDS = {pa.null(): "null", pa.bool_(): "bool", pa.int64(): "int", pa.float64(): "float", pa.string(): "str"}


class JsonText(str):
    """A value already encoded as JSON (a list, a dict, or a number too large for int64)."""


def plain_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with every value plain (str, int, bool, None, finite float or `JsonText`); raises
    ``ValueError``/``TypeError`` for a non-finite float or a value JSON cannot hold, as ``json.dumps``
    with ``allow_nan=False`` would."""
    out = row.copy()
    for key, value in row.items():
        kind = type(value)
        if kind is str or value is None or kind is bool:  # the common cases, which have no ``tolist``
            continue
        if kind is float:
            if math.isfinite(value):
                continue
        elif kind is int:
            if -(2**63) <= value < 2**63:
                continue
        elif kind is list and not value:  # no flags, without the encoder
            out[key] = _EMPTY_LIST
            continue
        out[key] = _plain_value(key, value)
    return out


def _plain_value(key: str, value: Any) -> Any:
    """One value of `plain_row`."""
    if hasattr(value, "tolist"):  # numpy scalars and arrays, as the JSONL writer stores them
        value = value.tolist()
    kind = type(value)
    if kind is float:
        if not math.isfinite(value):
            raise ValueError(f"out of range float value {value!r} in {key!r}")
    elif kind in _PLAIN:
        if kind is int and not -(2**63) <= value < 2**63:
            value = JsonText(value)
    elif value == []:
        value = _EMPTY_LIST
    else:
        value = JsonText(_ENCODE(value))
    return value


_EMPTY_LIST = JsonText("[]")


def _tolist(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_ENCODE = json.JSONEncoder(ensure_ascii=False, allow_nan=False, default=_tolist).encode
_ENCODE_TYPED = json.JSONEncoder(ensure_ascii=False).encode


def chunk_table(rows: list[dict[str, Any]]) -> pa.Table:
    """One chunk's rows (already `plain_row`) as an Arrow table, a column per key in order of first
    appearance (``id`` first), typed by the chunk's own kinds."""
    keys = dict.fromkeys(chain(("id",), chain.from_iterable(rows)))
    fields, arrays, json_columns = [], [], []
    for key in keys:
        values = list(map(dict.get, rows, repeat(key)))
        types = set(map(type, values))
        kind = _unify({_TYPE_KINDS.get(t, "json") for t in types})
        if kind == "json":
            values = [_as_json(v) for v in values]
            json_columns.append(key)
        elif kind == "float" and int in types:
            values = [None if v is None else float(v) for v in values]
        fields.append(pa.field(key, _ARROW[kind]))
        arrays.append(pa.array(values, type=_ARROW[kind]))
    schema = pa.schema(fields, metadata={JSON_COLUMNS: json.dumps(json_columns)})
    return pa.Table.from_arrays(arrays, schema=schema)


_TYPE_KINDS = {type(None): "null", bool: "bool", int: "int", float: "float", str: "str"}
"""A plain value's column kind (`plain_row` leaves no others but `JsonText`, which is ``json``)."""


def _as_json(value: Any) -> str | None:
    if value is None or isinstance(value, JsonText):
        return value
    return _ENCODE_TYPED(value)


def write_part(table: pa.Table, path: Path) -> None:
    """Write ``table`` as an Arrow IPC file at ``path`` (the caller makes it atomic)."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def read_part(path: Path) -> pa.Table:
    with pa.memory_map(str(path), "r") as source:
        return pa.ipc.open_file(source).read_all()


def part_ids(path: Path) -> list[str]:
    return [str(v) for v in read_part(path).column("id").to_pylist()]


def _part_kinds(schema: pa.Schema) -> dict[str, str]:
    json_columns = set(json.loads((schema.metadata or {}).get(JSON_COLUMNS, b"[]")))
    return {f.name: "json" if f.name in json_columns else _KINDS[f.type] for f in schema}


def assemble(parts: list[Path], target: Path, signature: str) -> None:
    """Join the Arrow ``parts`` (in order) into one Parquet file at ``target`` (see the module doc)."""
    kinds: dict[str, set[str]] = {"id": {"str"}}
    for path in parts:
        with pa.memory_map(str(path), "r") as source:
            schema = pa.ipc.open_file(source).schema
        for name, kind in _part_kinds(schema).items():
            kinds.setdefault(name, set()).add(kind)
    columns = {name: _unify(found) for name, found in kinds.items()}
    json_columns = [name for name, kind in columns.items() if kind == "json"]
    schema = pa.schema(
        [pa.field(name, _ARROW[kind]) for name, kind in columns.items()],
        metadata={"qace.signature": signature, "qace.json_columns": json.dumps(json_columns)},
    )
    with pq.ParquetWriter(target, schema) as writer:
        for group in _row_groups((_conform(read_part(p), columns, schema) for p in parts), schema):
            writer.write_table(group, row_group_size=ROW_GROUP)


def _unify(kinds: set[str]) -> str:
    kinds = kinds - {"null"}
    if not kinds:
        return "null"
    if len(kinds) == 1:
        return next(iter(kinds))
    return "float" if kinds == {"int", "float"} else "json"


def _conform(table: pa.Table, columns: dict[str, str], schema: pa.Schema) -> pa.Table:
    """``table`` (one part) under the output's unified ``schema``."""
    own = _part_kinds(table.schema)
    arrays = []
    for name, kind in columns.items():
        if name not in own or own[name] == "null":
            arrays.append(pa.nulls(table.num_rows, type=_ARROW[kind]))
            continue
        column = table.column(name).combine_chunks()
        if own[name] == kind:
            arrays.append(column)
        elif kind == "float":  # an int column among float ones: what float(value) gives
            arrays.append(column.cast(pa.float64(), safe=False))
        else:  # a typed column among other kinds: JSON text, as json.dumps writes each value
            arrays.append(pa.array([_as_json(v) for v in column.to_pylist()], type=pa.string()))
    return pa.Table.from_arrays(arrays, schema=schema)


def _row_groups(tables: Iterable[pa.Table], schema: pa.Schema) -> Iterator[pa.Table]:
    """Tables of exactly ``ROW_GROUP`` rows (the last one shorter; one empty table if there are no rows)."""
    pending: list[pa.Table] = []
    size = 0
    yielded = False
    for table in tables:
        pending.append(table)
        size += table.num_rows
        while size >= ROW_GROUP:
            joined = pa.concat_tables(pending)
            yield joined.slice(0, ROW_GROUP)
            yielded = True
            rest = joined.slice(ROW_GROUP)
            pending, size = [rest], rest.num_rows
    if size or not yielded:
        yield pa.concat_tables(pending) if pending else schema.empty_table()
