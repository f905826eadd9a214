"""Telling a JSON document from JSON lines by content, not by file name: published human-judgment
releases ship one object a line under a ``.json`` name, and a ``.jsonl`` file may hold an array.
Every reader of JSON (records, references, judgments, score files) asks `json_layout`, through
`table_format` where a table may also be CSV or Parquet; each takes a format that overrides the guess."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from qace.errors import InputError

JsonLayout = Literal["json", "jsonl"]
_BLANK = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"


def first_line(path: str | Path) -> bytes:
    """The first line of ``path`` holding more than blanks (without a UTF-8 BOM), stripped; ``b""``
    for an empty file."""
    with Path(path).open("rb") as f:
        for number, raw in enumerate(f):
            line = (raw.removeprefix(_BOM) if number == 0 else raw).strip(_BLANK)
            if line:
                return line
    return b""


def json_layout(path: str | Path) -> JsonLayout:
    """``"json"`` when ``path`` holds one JSON document (an array, or an object spread over lines),
    ``"jsonl"`` when its first line is a whole JSON object (one object a line, however the file is
    named). A one-line object is read as JSON lines: one record; pass the format to read it otherwise."""
    line = first_line(path)
    if not line.startswith(b"{"):
        return "json"
    try:
        json.loads(line)
    except ValueError:  # an object that goes on over the next lines
        return "json"
    return "jsonl"


TABLE_FORMATS = ("auto", "json", "jsonl", "csv", "parquet")


def table_format(path: str | Path, fmt: str = "auto") -> str:
    """The format to read a table of rows in: ``fmt`` unless ``auto``; else ``csv`` or ``parquet`` by
    the name, and for ``.json``/``.jsonl``/``.ndjson`` `json_layout` by the content."""
    if fmt not in TABLE_FORMATS:
        raise InputError(f"unknown format {fmt!r} for {path}; use one of {', '.join(TABLE_FORMATS)}")
    if fmt != "auto":
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix in (".csv", ".parquet"):
        return suffix[1:]
    if suffix in (".json", ".jsonl", ".ndjson"):
        return json_layout(path)
    raise InputError(
        f"{path}: cannot tell its format from its name; pass --format (json, jsonl, csv or parquet)"
    )


def read_json_lines(path: str | Path) -> list[object]:
    """Every value of a JSON-lines file (blank lines skipped); `InputError` naming the first bad line."""
    values = []
    with Path(path).open("rb") as f:
        for number, raw in enumerate(f, start=1):
            line = (raw.removeprefix(_BOM) if number == 1 else raw).strip(_BLANK)
            if not line:
                continue
            try:
                values.append(json.loads(line))
            except ValueError as exc:
                raise InputError(f"{path}: line {number} of these JSON lines is not JSON ({exc})") from exc
    return values
