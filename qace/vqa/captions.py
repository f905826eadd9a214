"""Caption files for ``qace vqa-data``: COCO caption annotations, COCO-style results, JSONL or CSV.

Every usable row becomes a `Record` with its caption and image id; a row without either becomes a
`RecordError` naming its line and what to fix, and is left out of the data set.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qace.data.records import Record, RecordError, caption_problem, read_records
from qace.errors import InputError

FORMATS = ("auto", "coco", "jsonl", "csv")


def read_captions(path: str | Path, fmt: str = "auto") -> Iterator[Record | RecordError]:
    """The captions of ``path`` in file order.

    ``coco`` (any ``.json``): COCO caption annotations ``{"annotations": [{"id", "image_id",
    "caption"}]}`` (the ``captions_train2017.json`` layout) or a results array ``[{"image_id",
    "caption"}]``; ids are the annotation ids, else the positions. ``jsonl``/``csv``: the ``qace score``
    layouts (`qace.data.records.read_records`), an ``image_id`` required on every row.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise InputError(f"unknown caption format {fmt!r}; use one of {', '.join(FORMATS)}")
    if not path.is_file():
        raise InputError(f"caption file {str(path)!r} does not exist")
    if fmt == "coco" or (fmt == "auto" and path.suffix.lower() == ".json"):
        rows: Iterator[Record | RecordError] = _coco(path)
    else:
        rows = read_records(path, fmt=fmt)
    for row in rows:
        yield row if isinstance(row, RecordError) else _usable(row)


def _coco(path: Path) -> Iterator[Record | RecordError]:
    try:
        with path.open("rb") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read COCO captions {str(path)!r}: {exc}") from exc
    entries = data.get("annotations") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise InputError(
            f"{str(path)!r}: expected COCO caption annotations {{'annotations': [...]}} or a JSON array "
            "of {image_id, caption}"
        )
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            yield RecordError(str(index), f"entry {index} is a {type(entry).__name__}, not an object")
            continue
        yield Record(
            str(entry.get("id", index)),
            entry.get("caption"),  # type: ignore[arg-type]  # checked by _usable
            _text(entry.get("image_id")),
            line=index + 1,
        )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _usable(record: Record) -> Record | RecordError:
    problem = caption_problem(record.caption)
    if problem is None and not record.image_id:
        problem = "no image_id: a VQA triple needs the image whose region features answer it"
    if problem is None:
        return record
    return RecordError(record.id, f"{problem}; fix or drop this row", record.line)
