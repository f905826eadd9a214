"""Input readers: JSONL, CSV and COCO-style results -> a stream of `Record` or `RecordError`.

Why a stream of values instead of exceptions: one bad line in a 100k-caption file must not stop
the run. The reader yields a `RecordError` naming the record (or its line) and the problem, and
goes on; the scorer writes those errors next to the scores. Only problems that make the whole file
unreadable (missing file, a COCO results file that is not JSON) raise `InputError`.

Files are read in binary and decoded one line at a time, so a stray non-UTF-8 byte costs one
record, not the file, and a JSONL file is never held in memory as a whole.

A lone surrogate (an unpaired JSON escape such as ``\\ud800``) in a caption, a reference, an id, an
image id or an image path makes its record an error, like bytes that are not UTF-8: it is no text, no
tokenizer takes it and no UTF-8 output can hold it.

Every record and error carries its ``line``: the physical line it starts on (JSONL, CSV), or its
1-based number in a COCO array or a Parquet table. An error of a record whose id cannot be read has
``id=None``; positions never go into the id namespace, so they cannot clash with real ids.

Whether references or an image id are required depends on the metric variant (QACE-Ref needs
references, QACE-Img an image id), so the reader accepts records without them and `require()`
says what is missing for a given variant.
"""

from __future__ import annotations

import csv
import json
import logging
import re
import sys
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat
from pathlib import Path
from typing import Any

from qace.data.bad_rows import SURROGATE, Bad, has_surrogate
from qace.data.parquet_rows import parquet_rows
from qace.data.sniff import first_line, json_layout, read_json_lines
from qace.errors import InputError

log = logging.getLogger(__name__)

FORMATS = ("auto", "jsonl", "csv", "coco", "parquet")
_REF_COLUMN = re.compile(r"^ref(erence)?s?[_ -]?\d+$", re.IGNORECASE)
_CSV_FIELD_LIMIT = 2**31 - 1  # very long captions are the metric's business (it flags truncation)


@dataclass(frozen=True)
class Record:
    """One caption to score; `references`/`image_id`/`image` are None when the input has none.

    `image` is the path of the image file (judges that look at pixels need it; QACE-Img reads
    region features by `image_id` instead). Readers resolve a relative path against the input
    file's directory, so a data set moves as one folder.
    """

    id: str
    caption: str
    image_id: str | None = None
    references: tuple[str, ...] | None = None
    image: str | None = None
    line: int | None = field(default=None, compare=False)
    """Where the record is in its input file (see the module docstring); None outside files."""
    image_id_int: bool = field(default=False, compare=False)
    """The input gave ``image_id`` as an integer (COCO does); rows give it back as one (`image_id_value`)."""

    @property
    def image_id_value(self) -> str | int | None:
        """``image_id`` as the input gave it: an integer when it was one, else the string (or None)."""
        return int(self.image_id) if self.image_id_int and self.image_id is not None else self.image_id


@dataclass(frozen=True)
class RecordError:
    """A record that cannot be scored: `id` is its id, or None when it could not be read; `line` is
    where it is in its input file (None outside files)."""

    id: str | None
    reason: str
    line: int | None = None


def caption_problem(caption: Any, max_chars: int | None = None) -> str | None:
    """Why ``caption`` cannot be scored (``None`` when it can); ``max_chars`` bounds its length.

    Not a string, empty, nothing but whitespace, zero-width, format or control characters (a caption
    nobody can see), over ``max_chars``, or not valid Unicode (a lone surrogate, which no tokenizer can
    encode) are each a problem.
    """
    if not isinstance(caption, str):
        return f"caption must be a string, got {type(caption).__name__}"
    if not caption.strip():
        return "empty or whitespace-only caption"
    if all(ch.isspace() or unicodedata.category(ch) in INVISIBLE for ch in caption):
        return "caption has only invisible characters (zero-width, format or control characters)"
    if max_chars is not None and len(caption) > max_chars:
        return f"caption has {len(caption)} characters; the limit is {max_chars}"
    return surrogate_problem("caption", caption)


def surrogate_problem(name: str, text: str) -> str | None:
    """Why ``text`` (the record's ``name``) is no text, where it holds a lone surrogate; else None."""
    if text.isascii():  # the common case, without a search
        return None
    found = SURROGATE.search(text)
    if found is None:
        return None
    code = ord(found.group())
    return (
        f"{name} holds a lone surrogate (\\u{code:04x} at character {found.start() + 1}), which is no text "
        "and cannot be written as UTF-8: write the character it stands for, or pair the surrogate"
    )


INVISIBLE = frozenset({"Cc", "Cf"})
"""Unicode categories of characters that show nothing: control (``Cc``) and format (``Cf``: zero-width
spaces and joiners, the byte-order mark, bidirectional marks, the soft hyphen)."""


def list_record(
    record_id: str, caption: Any, references: Sequence[str] | None, image_id: str | int | None
) -> Record | RecordError:
    """Validate list-API inputs (`qace.api.QACE.score`) into a ``Record`` (or an error naming it); an id
    or image id holding a lone surrogate is an error as in file input, with ``id=None`` for the id's."""
    if problem := surrogate_problem("id", record_id):
        return RecordError(None, problem)
    if isinstance(image_id, str) and (problem := surrogate_problem("image_id", image_id)):
        return RecordError(record_id, problem)
    if not isinstance(caption, str):
        return RecordError(record_id, f"caption must be a string, got {type(caption).__name__}")
    if references is not None and (
        isinstance(references, str) or not all(isinstance(r, str) and r.strip() for r in references)
    ):
        return RecordError(record_id, "references must be a list of non-empty strings")
    refs = tuple(references) if references is not None else None
    as_int = isinstance(image_id, int) and not isinstance(image_id, bool)  # given back as an integer
    return Record(record_id, caption, None if image_id is None else str(image_id), refs, image_id_int=as_int)


def require(record: Record, *, references: bool, image: bool) -> str | None:
    """Return why `record` cannot be scored by a variant needing references and/or an image (one missing,
    or holding a lone surrogate), else None."""
    if references:
        if not record.references:
            return "missing references (QACE-Ref needs at least one reference caption)"
        problem = next(filter(None, (surrogate_problem("a reference", r) for r in record.references)), None)
        if problem is not None:
            return problem
    if image:
        if not record.image_id:
            return "missing image_id (QACE-Img needs the image's region features)"
        return surrogate_problem("image_id", record.image_id)
    return None


References = str | Path | Mapping[str, tuple[str, ...]]
"""A references file, or its contents already read (`load_references`)."""


def read_records(
    path: str | Path, *, references: References | None = None, fmt: str = "auto"
) -> Iterator[Record | RecordError]:
    """Yield the records of `path` in input order, with a `RecordError` for each bad one.

    Formats (`fmt`, or detected from the extension, then from the first byte):

    - ``jsonl`` (``.jsonl``/``.ndjson``, or a file starting with ``{``): one object a line with
      ``id``, ``caption`` and optional ``image_id``, ``image`` (an image file path) and
      ``references`` (a list of strings). Blank lines are skipped.
    - ``csv`` (``.csv``): a header row; columns ``id``, ``caption``, optional ``image_id``, ``image``, and
      references either as one ``references`` column holding a JSON list string, or as several
      numbered columns (``reference_1``, ``ref2``, ``refs_3``, ...) read in header order with empty
      cells skipped, so images with fewer references fit the same table. A non-empty
      ``references`` column wins over numbered columns. Errors name the physical line.
      Quoting is checked, so that a broken quote never swallows rows silently: a quote inside an
      unquoted field or text after a closing quote makes the row an error, and a quoted field left
      open over lines that look like rows makes the row and each of those lines an error.
    - ``coco`` (a ``.json`` file starting with ``[``): COCO-style results ``[{image_id, caption}]``;
      record ids are the positions in the array (``"0"``, ``"1"``, ...). This one is a single JSON
      document and is loaded whole.
    - ``parquet`` (``.parquet``): a table with the JSONL fields as columns (``references`` a list of
      strings or a JSON list string), read a batch of rows at a time.

    `references`, if given, is a COCO annotations file ``{"annotations": [{image_id, caption}]}``
    or a JSON list of ``{image_id, caption}``; an image's references are its unique captions in
    first-seen order. Records that carry no references of their own get them by ``image_id``.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    if path.is_dir():
        raise InputError(f"input {str(path)!r} is a folder; give the file of records in it")
    if not path.is_file():
        raise InputError(f"input file {str(path)!r} does not exist")
    if fmt == "auto":
        fmt = detect_format(path)
    refs = references if isinstance(references, Mapping) else None
    if references is not None and refs is None:
        refs = load_references(references)  # type: ignore[arg-type]
    if fmt == "jsonl":
        rows: Iterable[tuple[int, str, Any]] = _jsonl_rows(path)
    elif fmt == "csv":
        rows = _csv_rows(path)
    elif fmt == "parquet":
        rows = parquet_rows(path)
    else:
        rows = _coco_rows(path)
    yield from _records(rows, refs, base_dir=path.parent)


def check_readable(path: str | Path, *, references: References | None = None, fmt: str = "auto") -> None:
    """Raise the `InputError` that reading ``path`` would (a missing file or a folder, a references file
    that cannot be read, a CSV without a caption column, a COCO file that is not JSON, ...), reading
    no further than its first record: what a run checks before any model loads or any output exists."""
    next(iter(read_records(path, references=references, fmt=fmt)), None)


def detect_format(path: Path) -> str:
    """The format by the name (CSV, Parquet), else by the content: a JSON array is COCO results, one
    object a line JSONL (``.json``, ``.jsonl`` or any other name)."""
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return "csv"
    if suffix == ".parquet":
        return "parquet"
    head = first_line(path)
    if head.startswith(b"["):
        return "coco"
    if head.startswith(b"{") or suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix == ".json":
        raise InputError(f"{str(path)!r}: a .json input must be a results array or JSON lines")
    return "csv"


def load_references(path: str | Path, fmt: str = "auto") -> dict[str, tuple[str, ...]]:
    """Map image id -> its unique reference captions in first-seen order (bad entries are logged).

    The file is one JSON document or JSON lines of ``{image_id, caption}``, told by its content
    (`qace.data.sniff.json_layout`) unless ``fmt`` (``json`` or ``jsonl``) says."""
    path = Path(path)
    if fmt not in ("auto", "json", "jsonl"):
        raise InputError(f"unknown references format {fmt!r}; use auto, json or jsonl")
    try:
        if (fmt if fmt != "auto" else json_layout(path)) == "jsonl":
            data: Any = read_json_lines(path)
            if len(data) == 1 and isinstance(data[0], dict) and "annotations" in data[0]:
                data = data[0]  # a COCO annotations file on one line
        else:
            with path.open("rb") as f:
                data = json.load(f)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read references file {str(path)!r}: {exc}") from exc
    if isinstance(data, dict):
        data = data.get("annotations")
    if not isinstance(data, list):
        raise InputError(
            f"references file {str(path)!r} must be a JSON list of {{image_id, caption}} "
            "or a COCO annotations file with an 'annotations' list"
        )
    seen: dict[str, dict[str, None]] = {}
    skipped = 0
    for entry in data:
        image_id = entry.get("image_id") if isinstance(entry, dict) else None
        caption = entry.get("caption") if isinstance(entry, dict) else None
        key = _as_id(image_id)
        if key is None or not isinstance(caption, str) or not caption.strip():
            skipped += 1
            continue
        seen.setdefault(key, {})[caption] = None
    if skipped:
        log.warning("references file %s: skipped %d entries without image_id or caption", path, skipped)
    return {key: tuple(caps) for key, caps in seen.items()}


def _jsonl_rows(path: Path) -> Iterator[tuple[int, str, Any]]:
    """Yield (line, label, parsed object or error) per non-blank line, decoding line by line."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            if not raw.strip():
                continue
            where = f"line {number}"
            bad_bytes = False
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text, bad_bytes = raw.decode("utf-8", errors="surrogateescape"), True
            try:
                obj = _parse_line(text)
            except json.JSONDecodeError as exc:  # some messages end in "at": "Invalid control character at"
                reason = f"malformed JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})"
                yield number, where, Bad("non-UTF-8 bytes" if bad_bytes else reason)
                continue
            except RecursionError:
                yield number, where, Bad("malformed JSON (too deeply nested)")
                continue
            except ValueError:  # the one other error the parser raises: an integer too long to convert
                reason = (
                    f"a number of more than {sys.get_int_max_str_digits()} digits; "
                    "write such an id or value as a string"
                )
                yield number, where, Bad(reason)
                continue
            if bad_bytes:
                obj = Bad("non-UTF-8 bytes", obj.get("id") if isinstance(obj, dict) else None)
            yield number, where, obj


_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # what json.loads parses with


def _parse_line(text: str) -> Any:
    """``json.loads(text)``, with its errors; a line that is one JSON object with nothing after it but
    whitespace (nearly every JSONL line) is parsed by the decoder's scanner alone, without the
    layers ``json.loads`` goes through to find where the value starts and ends."""
    if text.startswith("{"):
        try:
            obj, end = _SCAN(text, 0)
        except (StopIteration, ValueError, RecursionError):
            obj, end = None, -1  # json.loads raises its own error below
        if end > 0 and not text[end:].strip(" \t\n\r"):  # JSON's whitespace, as json.loads allows
            return obj
    return json.loads(text)


def _csv_rows(path: Path) -> Iterator[tuple[int, str, Any]]:
    """Yield (line, label, row dict or error) per CSV row; references gathered as described above."""
    if csv.field_size_limit() < _CSV_FIELD_LIMIT:
        csv.field_size_limit(_CSV_FIELD_LIMIT)
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with path.open("rb") as f:
        lines = (raw.decode("utf-8", errors="surrogateescape") for raw in f)
        first = next(lines, "").removeprefix("\ufeff")
        consumed: list[str] = []  # the physical lines of the row being parsed
        reader = csv.reader(_recorded(_chain(first, lines), consumed), delimiter=delimiter)
        header = next(reader, None)
        if not header:
            return
        header = [name.strip() for name in header]
        if "caption" not in header:
            raise InputError(f"CSV {str(path)!r} has no 'caption' column (columns: {header})")
        ref_cols = [i for i, name in enumerate(header) if _REF_COLUMN.match(name)]
        while True:
            start = reader.line_num + 1
            consumed.clear()
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield start, f"line {start}", Bad(f"malformed CSV ({exc})")
                continue
            if not any(cell.strip() for cell in cells):
                continue
            where = f"line {start}"
            row: dict[str, Any] = {
                name: cell
                for name, cell in zip(header, cells, strict=False)
                if cell != "" or name == "caption"
            }
            problem, swallowed = _csv_quoting(consumed, delimiter, len(header), start)
            if problem is not None:
                yield start, where, Bad(problem, row.get("id"))
                for number in swallowed:
                    reason = (
                        f"looks like a row swallowed by the quote left open on line {start}; close that quote"
                    )
                    yield number, f"line {number}", Bad(reason)
                continue
            if any(has_surrogate(cell) for cell in cells):
                yield start, where, Bad("non-UTF-8 bytes", row.get("id"))
                continue
            if len(cells) > len(header):
                yield start, where, Bad(f"{len(cells)} cells but {len(header)} columns", row.get("id"))
                continue
            yield start, where, _csv_references(row, [cells[i] for i in ref_cols if i < len(cells)])


def _csv_quoting(lines: list[str], delimiter: str, columns: int, start: int) -> tuple[str | None, list[int]]:
    """Check the quoting of one CSV row's physical ``lines`` (RFC 4180): the problem, else None, and
    the numbers of the lines after the first that look like rows of their own (``columns`` cells)."""
    text = "".join(lines)
    if len(lines) == 1 and ('"' not in text or _csv_row_pattern(delimiter).fullmatch(text)):
        return None, []  # the common case, without a character loop
    problem = None
    state = "start"  # start of a field, "plain" field, "quoted" field, "closed" quote
    pos, end = 0, len(text)
    while pos < end and problem is None:
        ch = text[pos]
        if state == "quoted":
            if ch == '"':
                if text.startswith('"', pos + 1):
                    pos += 1  # a doubled quote inside quotes
                else:
                    state = "closed"
        elif ch == delimiter or ch in "\r\n":
            state = "start"
        elif state == "start":
            state = "quoted" if ch == '"' else "plain"
        elif state == "closed":
            problem = f"text after a closing quote at column {pos + 1} (quote the whole field)"
        elif ch == '"':
            problem = (
                f"a quote inside an unquoted field at column {pos + 1}; "
                'put the field in quotes and double the quote ("")'
            )
        pos += 1
    if problem is None and state == "quoted":
        problem = "a quote is never closed"
    swallowed = [
        start + i
        for i, line in enumerate(lines[1:], start=1)
        if len(next(csv.reader([line], delimiter=delimiter), [])) == columns
    ]
    if swallowed:
        listed = ", ".join(str(n) for n in swallowed)
        problem = (
            f"a quoted field opened on line {start} runs to line {start + len(lines) - 1}, over "
            f"{len(swallowed)} line(s) that look like rows ({listed}): an unclosed quote? "
            + (problem or "if that text is one field, remove its line breaks")
        )
    return problem, swallowed if problem is not None else []


@lru_cache(maxsize=4)
def _csv_row_pattern(delimiter: str) -> re.Pattern[str]:
    """A row of well-quoted fields (RFC 4180): quoted fields double their quotes, others hold none."""
    d = re.escape(delimiter)
    cell = rf'(?:"[^"]*(?:""[^"]*)*"|[^"{d}\r\n]*)'
    return re.compile(rf"{cell}(?:{d}{cell})*(?:\r?\n)?")


def _csv_references(row: dict[str, Any], numbered: list[str]) -> Any:
    """Turn the `references` JSON cell, or the numbered reference cells, into a list."""
    cell = row.get("references")
    if isinstance(cell, str) and cell.strip():
        try:
            row["references"] = json.loads(cell)
        except ValueError:
            return Bad("references column is not a JSON list of strings", row.get("id"))
    else:
        row.pop("references", None)
        kept = [c for c in numbered if c.strip()]
        if kept:
            row["references"] = kept
    return row


def _coco_rows(path: Path) -> Iterator[tuple[int, str, Any]]:
    """Yield (number, label, object) for a COCO-style results array (ids are the array positions)."""
    try:
        with path.open("rb") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read COCO results {str(path)!r}: {exc}") from exc
    if not isinstance(data, list):
        raise InputError(f"COCO results {str(path)!r} must be a JSON array of {{image_id, caption}}")
    for index, obj in enumerate(data):
        yield (
            index + 1,
            f"result {index}",
            {**obj, "id": str(index)}
            if isinstance(obj, dict)
            else Bad(f"expected a JSON object, got {type(obj).__name__}", index),
        )


def _records(
    rows: Iterable[tuple[int, str, Any]], refs: Mapping[str, tuple[str, ...]] | None, *, base_dir: Path
) -> Iterator[Record | RecordError]:
    """Validate parsed rows into records; the second occurrence of an id is an error."""
    seen: dict[str, str] = {}
    for line, where, obj in rows:
        if isinstance(obj, Bad):
            record_id = _as_id(obj.record_id)
            if record_id is not None:
                seen.setdefault(record_id, where)
            yield RecordError(record_id, f"{where}: {obj.reason}", line)
            continue
        if not isinstance(obj, dict):
            yield RecordError(None, f"{where}: expected a JSON object, got {type(obj).__name__}", line)
            continue
        raw_id = obj.get("id")
        record_id = _as_id(raw_id)
        if record_id is None:
            reason = (isinstance(raw_id, str) and surrogate_problem("id", raw_id)) or "missing id"
            yield RecordError(None, f"{where}: {reason}", line)
            continue
        if record_id in seen:
            yield RecordError(
                record_id, f"{where}: duplicate id {record_id!r} (first on {seen[record_id]})", line
            )
            continue
        seen[record_id] = where
        result = _record(record_id, obj, refs, base_dir, line)
        if isinstance(result, str):
            yield RecordError(record_id, f"{where}: {result}", line)
        else:
            yield result


def _record(
    record_id: str, obj: dict[str, Any], refs: Mapping[str, tuple[str, ...]] | None, base_dir: Path, line: int
) -> Record | str:
    """Build a Record from a parsed row, or return the reason it is invalid."""
    caption = obj.get("caption")
    if caption is None:
        return "missing caption"
    problem = caption_problem(caption)
    if problem is not None:
        return problem
    raw_image = obj.get("image_id")
    if isinstance(raw_image, str) and (problem := surrogate_problem("image_id", raw_image)):
        return problem
    image_id = _as_id(raw_image)
    if raw_image not in (None, "") and image_id is None:
        return f"image_id must be a string or integer, got {type(raw_image).__name__}"
    image = obj.get("image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        return f"image must be a file path string, got {image!r}"
    if image is not None and (problem := surrogate_problem("image", image)):
        return problem
    references = obj.get("references")
    if references is not None:
        if not isinstance(references, list) or not all(map(isinstance, references, repeat(str))):
            return "references must be a list of strings"
        if not references:
            return "references is an empty list"
        if not all(map(str.strip, references)):
            return "references contain an empty string"
        ref_tuple: tuple[str, ...] | None = tuple(references)
    else:
        ref_tuple = refs.get(image_id) if refs is not None and image_id is not None else None
    for reference in ref_tuple or ():
        if problem := surrogate_problem("a reference", reference):
            return problem
    image_path = None if image is None else str(base_dir / Path(image).expanduser())
    is_int = isinstance(raw_image, int) and image_id is not None
    return Record(record_id, caption, image_id, ref_tuple, image_path, line, image_id_int=is_int)


def _as_id(value: Any) -> str | None:
    """Accept string or integer ids (COCO uses integers); anything else or empty is None."""
    if isinstance(value, str):  # the common case first
        return value if value.strip() and not has_surrogate(value) else None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _recorded(lines: Iterable[str], into: list[str]) -> Iterator[str]:
    """Pass ``lines`` through, appending each to ``into`` (the csv reader pulls exactly a row's lines)."""
    for line in lines:
        into.append(line)
        yield line


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    """Put the BOM-stripped first line back in front of the remaining lines."""
    if first:
        yield first
    yield from rest
