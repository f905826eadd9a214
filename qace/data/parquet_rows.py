"""Parquet input: rows a batch at a time; a string that is not UTF-8 costs its row, not the file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qace.data.bad_rows import RECORD_COLUMNS, Bad, has_surrogate
from qace.errors import InputError

BATCH_ROWS = 4096
"""Rows read per Parquet batch."""


def parquet_rows(path: Path) -> Iterator[tuple[int, str, Any]]:
    """Yield (row number, label, row dict) of a Parquet table, a batch of rows at a time."""
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
        names = [name for name in RECORD_COLUMNS if name in table.schema_arrow.names]
        if "caption" not in names:
            raise InputError(f"Parquet {str(path)!r} has no 'caption' column")
        number = 0
        for batch in table.iter_batches(batch_size=BATCH_ROWS, columns=names):
            try:
                rows: list[Any] = batch.to_pylist()
            except UnicodeDecodeError:  # a string that is not UTF-8: that row's error, not the file's
                rows = _rows_with_bad_bytes(batch)
            for row in rows:
                number += 1
                if isinstance(row, Bad):
                    yield number, f"row {number}", row
                    continue
                refs = row.get("references")
                if isinstance(refs, str) and refs.strip():
                    try:
                        row["references"] = json.loads(refs)
                    except ValueError:
                        row = Bad("references column is not a JSON list of strings", row.get("id"))
                yield number, f"row {number}", row
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        raise InputError(f"cannot read Parquet input {str(path)!r}: {exc}") from exc


def _rows_with_bad_bytes(batch: Any) -> list[Any]:
    """The rows of a Parquet batch whose strings are not all UTF-8: each string column read as bytes and
    decoded by row, a row with undecodable bytes a `Bad` (with its id when that decodes)."""
    import pyarrow as pa

    columns: dict[str, list[Any]] = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            column = column.cast(pa.binary())
        elif pa.types.is_list(kind) and pa.types.is_string(kind.value_type):
            column = column.cast(pa.list_(pa.binary()))
        columns[name] = [_decoded(value) for value in column.to_pylist()]
    rows: list[Any] = []
    for values in zip(*columns.values(), strict=True):
        row = dict(zip(columns, values, strict=True))
        bad = [name for name, value in row.items() if _holds_bad_bytes(value)]
        if bad:
            record_id = row.get("id") if "id" not in bad else None
            rows.append(Bad(f"non-UTF-8 bytes in {', '.join(bad)}", record_id))
        else:
            rows.append(row)
    return rows


def _decoded(value: Any) -> Any:
    """Bytes (alone or in a list) as text, undecodable bytes kept as surrogates (``surrogateescape``)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    if isinstance(value, list):
        return [_decoded(item) for item in value]
    return value


def _holds_bad_bytes(value: Any) -> bool:
    if isinstance(value, str):
        return has_surrogate(value)
    return isinstance(value, list) and any(_holds_bad_bytes(item) for item in value)
