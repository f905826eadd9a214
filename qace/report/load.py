"""Score files as the report shows them: one item per id, each system's row trimmed to what is shown.

Captions come from the rows' explanations (``qace score --explain``) or from the scored input file
(``--input``), which also gives the references each answer was read from. Image files of regeneration
rows (the original and the saved generated images) become small inline thumbnails, so the page needs
nothing beside itself.
"""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qace import scorers
from qace.data.output import errors_path
from qace.errors import InputError

THUMBNAIL_PIXELS = 160


@dataclass
class System:
    """One score file: its rows by id, the metric, and what the summary shows about it."""

    name: str
    score_key: str
    components: tuple[str, ...]
    rows: dict[str, dict[str, Any]]
    signatures: list[str]
    errors: list[dict[str, str]] = field(default_factory=list)
    judges_image: bool = False
    """Its rows show the image they judged (from the row, else from ``--input``)."""


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``qace score`` JSONL or Parquet output (Parquet's JSON columns decoded)."""
    if not path.is_file():
        raise InputError(f"score file {str(path)!r} does not exist")
    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        meta = table.schema.metadata or {}
        json_columns = json.loads(meta.get(b"qace.json_columns", b"[]"))
        rows = table.to_pylist()
        for row in rows:
            for name in json_columns:
                if isinstance(row.get(name), str):
                    row[name] = json.loads(row[name])
        return rows
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"{path}: line {number} is not JSON ({exc.msg}); is this a qace score output?"
                ) from None
            if not isinstance(row, dict) or "id" not in row:
                raise InputError(f"{path}: line {number} has no 'id'; give the output of qace score")
            rows.append(row)
    return rows


def load_system(path: Path, name: str | None = None) -> System:
    """Read a score file and its errors file (`qace.data.output.errors_path`, if any) into a `System`."""
    rows = read_rows(path)
    if not rows:
        raise InputError(f"score file {str(path)!r} has no rows")
    entries = [scorers.get(name) for name in scorers.names()]
    head = str(rows[0].get("signature", "")).split("|", 1)[0]
    metrics = {entry.score_key: entry for entry in entries}
    named = [
        e for e in entries if e.signature == head and e.score_key in rows[0]
    ]  # RefCLIP-S rows hold clip_s
    entry = named[0] if named else next((metrics[k] for k in metrics if k in rows[0]), None)
    if entry is None:
        raise InputError(
            f"{path}: rows have none of the score columns {', '.join(metrics)}; give the output of qace score"
        )
    by_id: dict[str, dict[str, Any]] = {}
    for row in rows:
        row_id = str(row["id"])
        if row_id in by_id:
            raise InputError(f"{path}: id {row_id!r} appears twice")
        by_id[row_id] = row
    errors_file = errors_path(path)
    errors = []
    if errors_file.is_file():
        errors = [json.loads(line) for line in errors_file.open(encoding="utf-8") if line.strip()]
    signatures = list(dict.fromkeys(str(r.get("signature", "")) for r in rows if r.get("signature")))
    judged = entry.reads == "image"
    return System(name or path.name, entry.score_key, entry.parts, by_id, signatures, errors, judged)


def read_inputs(path: Path) -> dict[str, dict[str, Any]]:
    """Caption, references and image file of each record of a scored input file, by id."""
    from qace.data.records import Record, read_records

    out: dict[str, dict[str, Any]] = {}
    for record in read_records(path):
        if isinstance(record, Record):
            given = {"caption": record.caption, "references": list(record.references or [])}
            out[record.id] = {**given, "image": record.image}
    return out


def number(value: Any) -> float | None:
    """A JSON-safe float: None for missing and non-finite values."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def shown_row(
    system: System, row: dict[str, Any], inputs: dict[str, Any], images: dict[str, str]
) -> dict[str, Any]:
    """What the page shows of one row: scores, flags, caption, and the row's evidence."""
    explanation = row.get("explanation") or {}
    given = inputs.get(str(row["id"]), {})
    out: dict[str, Any] = {
        "score": number(row.get(system.score_key)),
        "parts": [number(row.get(c)) for c in system.components],
        "caption": explanation.get("caption") or given.get("caption") or "",
        "flags": list(row.get("flags") or []),
        "n_questions": row.get("n_questions"),
    }
    if explanation.get("questions") is not None:
        out["candidates"] = explanation.get("candidates", [])
        out["questions"] = [
            {
                "candidate": q.get("candidate"),
                "question": q.get("question"),
                "own": q.get("answer_on_caption"),
                "answers": q.get("answers_on_context", []),
                "f1": [number(v) for v in q.get("f1", [])],
                "bs": [number(v) for v in q.get("bs", [])],
                "an": [number(v) for v in q.get("an", [])],
            }
            for q in explanation["questions"]
        ]
        out["contexts"] = ["image"] if row.get("metric") == "QACE-Img" else given.get("references") or []
    for text in ("context", "visce2_raw"):
        if isinstance(row.get(text), str):
            out[text] = row[text]
    if "regen_samples" in row:
        out["samples"] = [number(v) for v in row["regen_samples"]]
    image = row.get("image") or given.get("image")
    if image and system.judges_image:
        out["original"] = thumbnail(image, images)
    if row.get("generated_images"):
        out["generated"] = [thumbnail(p, images) for p in row["generated_images"] if p]
    return out


def thumbnail(path: str, images: dict[str, str]) -> str:
    """The key of ``path``'s thumbnail in ``images`` (a data URI, made once per file; empty if unreadable)."""
    if path not in images:
        images[path] = _data_uri(Path(path))
    return path


def _data_uri(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    try:
        from PIL import Image
    except ImportError:  # without Pillow the file goes in whole
        kind = "png" if data[:4] == b"\x89PNG" else "jpeg"
        return f"data:image/{kind};base64," + base64.b64encode(data).decode()
    try:
        with Image.open(io.BytesIO(data)) as image:
            small = image.convert("RGB")
    except OSError:  # not an image Pillow reads
        return ""
    small.thumbnail((THUMBNAIL_PIXELS, THUMBNAIL_PIXELS))
    buffer = io.BytesIO()
    small.save(buffer, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
