"""Crash-safe, resumable result output: the final file never exists half-written.

Layout while a run is going: a sibling directory ``<path>.partial/`` holds

- ``manifest.json``: format version, score signature, output format, the committed chunk list
  (name, rows, errors) and total counts;
- per committed chunk its scored rows: for JSONL output ``NNNNNN.rows.jsonl`` (one JSON line per row,
  exactly the bytes the final JSONL will hold), for Parquet output ``NNNNNN.rows.arrow`` when it has any
  (an Arrow part, `qace.data.parquet_parts`); when it has any, ``NNNNNN.errors.jsonl``
  (``{"id","line","reason"}`` lines; ``id`` is null for a record whose id could not be read, ``line``
  is absent outside input files) and, when the caller logs its input (``input_log=True``),
  ``NNNNNN.input.jsonl``: the `qace.data.fingerprint.InputMark` of every input record of the chunk,
  which a resumed run compares with its input.

Commit protocol (`flush`): each chunk file is written as ``*.tmp``, fsynced and ``os.replace``d into
place; only then is the chunk added to the manifest, which is itself written tmp + fsync +
replace, and the directory is fsynced. A run killed at any moment therefore leaves whole,
manifest-listed chunks plus maybe a stray ``.tmp`` or an unlisted chunk file; on resume those
are deleted and their rows are simply produced again.

`close()` concatenates the chunks in order into ``<path>.tmp`` and replaces ``<path>`` with it;
errors go to `errors_path` (``out.jsonl`` -> ``out.errors.jsonl``, ``out.parquet`` ->
``out.parquet.errors.jsonl``: two outputs never share one) the same way, written only when there are
errors; then the partial directory is removed. JSONL output is the concatenated lines. Parquet output
is the parts joined into one table whose schema is unified over all rows (`qace.data.parquet_parts`:
typed columns, lists, dicts and mixed kinds as JSON strings named in ``qace.json_columns``,
``qace.signature`` in the metadata, fixed-size row groups), so a resumed run writes the same bytes as
an uninterrupted one; joining parses no JSON, so closing a long run takes a fraction of a second.

While it is open, a writer holds an exclusive lock (``lockf``, where the platform has it) on
``<path>.partial/writer.lock``, so a writer of the same output in another process (a rerun while a
killed run's worker still writes, two ``--resume`` runs) is refused instead of mixing chunks. A
write that fails for want of space (disk full, ``ulimit -f``, a quota) removes its temporary file and raises
`OutputError` naming the file and the bytes it needed; the chunks committed before stay, so
``--resume`` continues. A run that fails before its first commit leaves nothing behind.

Resume rules: the scorer adds rows in input order and skips what is done (scored rows by id,
`done_ids()`; errors by input line, `done_lines()`), so a resumed output is byte-identical to an
uninterrupted run. ``resume=True`` continues an existing partial directory (its signature, format
and chunk size must match, else `ResumeError` naming both: a scorer batches within a chunk, so
another chunk size moves scores by float rounding; with ``input_log=True`` it must have an input
log, unless ``force=True``); with a complete final output it reports all its ids as done and
rewrites nothing (a complete output with rows but no signature is refused unless ``force=True``:
nothing says how it was scored); adding a new row to a complete output is refused (`ResumeError`:
write to a new path or remove the old output), because reopening a finished file in place would
break the never-half-written guarantee. ``resume=False`` refuses to touch any existing output.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
from collections.abc import Iterator
from json.encoder import encode_basestring as _encode_string
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO

from qace.data import durable
from qace.errors import OutputError, QACEError, ResumeError

if TYPE_CHECKING:
    from qace.data.fingerprint import InputMark

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1
_FORMATS = {".jsonl": "jsonl", ".parquet": "parquet"}
LOCK_NAME = "writer.lock"


def partial_path(path: str | Path) -> Path:
    """The folder a run writing output ``path`` commits its chunks to: ``<path>.partial``."""
    return Path(path).with_name(Path(path).name + ".partial")


def partial_chunk_size(path: str | Path) -> int | None:
    """The chunk size the partial output of ``path`` (a killed run's `partial_path`) was written with;
    None where there is none, or its manifest cannot say (the writer then says why, on opening it)."""
    manifest = partial_path(path) / "manifest.json"
    try:
        size = json.loads(manifest.read_text("utf-8")).get("chunk_size")
    except (OSError, ValueError, AttributeError):
        return None
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def chunk_size_mismatch(partial: Path, written: int, asked: int) -> str:
    """Why a partial output written in chunks of ``written`` captions does not go on in chunks of
    ``asked``."""
    return (
        f"{partial} was written with --chunk-size {written} but this run has {asked}; scores batched in "
        f"other chunks differ by float rounding: resume with --chunk-size {written}, or "
        f"remove {partial} to start over"
    )


def errors_path(path: str | Path) -> Path:
    """Where the errors of output ``path`` go: ``out.jsonl`` -> ``out.errors.jsonl``, any other
    output ``out.parquet`` -> ``out.parquet.errors.jsonl``, so two outputs never share one."""
    path = Path(path)
    name = path.stem if path.suffix.lower() == ".jsonl" else path.name
    return path.with_name(name + ".errors.jsonl")


class ResultWriter:
    """Write scored rows and per-record errors crash-safely; see the module docstring."""

    def __init__(
        self,
        path: str | Path,
        *,
        signature: str,
        fmt: str = "auto",
        resume: bool = False,
        chunk_size: int = 256,
        input_log: bool = False,
        force: bool = False,
    ) -> None:
        self.path = Path(path)
        self.signature = signature
        self.fmt = _format_for(self.path, fmt)
        if chunk_size < 1:
            raise QACEError(f"chunk_size must be at least 1, got {chunk_size}")
        self.chunk_size = chunk_size
        self.partial = partial_path(self.path)
        self.errors_path = errors_path(self.path)
        self.input_log = input_log
        self.force = force
        self._rows: list[str] = []  # JSONL lines
        self._plain_rows: list[dict[str, Any]] = []  # Parquet rows (`parquet_parts.plain_row`)
        self._errors: list[str] = []
        self._marks: list[str] = []
        self._seen: set[str] = set()
        self._done: set[str] = set()
        self._seen_lines: set[int] = set()
        self._done_lines: set[int] = set()
        self._complete = False
        self._closed = False
        self._manifest: dict[str, Any] = {}
        self._lock: BinaryIO | None = None  # the open file holding the partial directory's lock
        created = not self.partial.exists()
        try:
            self._open(resume)
        except BaseException:  # e.g. no space for the first manifest: leave nothing behind
            self._unlock()
            if created:
                shutil.rmtree(self.partial, ignore_errors=True)
            raise

    def _open(self, resume: bool) -> None:
        """Apply the resume rules: start fresh, continue a partial run, or accept a finished one."""
        existing = [p for p in (self.path, self.partial, self.errors_path) if p.exists()]
        if existing and not resume:
            names = ", ".join(str(p) for p in existing)
            raise ResumeError(f"output already exists ({names}); pass --resume to continue it or remove it")
        if self.path.exists():
            self._open_complete()
            return
        self.partial.mkdir(parents=True, exist_ok=True)
        self._lock = durable.lock(self.partial / LOCK_NAME, self.path)
        if (self.partial / "manifest.json").exists():
            self._open_partial()
            return
        for leftover in self.partial.iterdir():  # killed before its first manifest: nothing committed
            if leftover.is_dir():
                shutil.rmtree(leftover)
            elif leftover.name != LOCK_NAME:
                leftover.unlink()
        self._manifest = {
            "version": MANIFEST_VERSION,
            "signature": self.signature,
            "format": self.fmt,
            "input_log": self.input_log,
            "chunk_size": self.chunk_size,
            "chunks": [],
            "rows": 0,
            "errors": 0,
        }
        self._write_manifest()

    def _open_complete(self) -> None:
        """A finished output: check its signature when it records one, and load its ids."""
        try:
            found = _final_signature(self.path, self.fmt)
            self._done = set(_final_ids(self.path, self.fmt))
            scored = bool(self._done)
            if self.errors_path.exists():
                self._load_errors(self.errors_path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ResumeError(
                f"cannot read existing output {self.path} ({exc}); remove it or pick another path"
            ) from exc
        if found is not None and found != self.signature:
            raise ResumeError(_mismatch(self.path, found, self.signature))
        if found is None and scored:
            if not self.force:
                raise ResumeError(
                    f"{self.path} records no signature, so nothing says it was scored like this run "
                    f"({self.signature}); remove it, write to a new path, or pass --force (force=True) "
                    "to accept its rows as they are"
                )
            log.warning("%s records no signature; accepted as %s (forced)", self.path, self.signature)
        if self.partial.exists():
            log.info("removing leftover %s of a run that finished", self.partial)
            shutil.rmtree(self.partial)
        self._complete = True
        log.info("%s is complete (%d ids); nothing to do", self.path, len(self._done))

    def _open_partial(self) -> None:
        """Continue a killed run: check the manifest, drop uncommitted files, load committed ids."""
        try:
            manifest = json.loads((self.partial / "manifest.json").read_text("utf-8"))
        except (OSError, ValueError) as exc:
            raise ResumeError(
                f"{self.partial}/manifest.json is unreadable ({exc}); remove {self.partial}"
            ) from exc
        if not isinstance(manifest, dict) or manifest.get("version") != MANIFEST_VERSION:
            raise ResumeError(f"{self.partial} was written by an unknown version; remove it to start over")
        if manifest.get("signature") != self.signature:
            raise ResumeError(_mismatch(self.partial, str(manifest.get("signature")), self.signature))
        if manifest.get("format") != self.fmt:
            raise ResumeError(
                f"{self.partial} holds {manifest.get('format')} output but {self.fmt} was requested"
            )
        if manifest.get("chunk_size", self.chunk_size) != self.chunk_size:
            raise ResumeError(chunk_size_mismatch(self.partial, manifest["chunk_size"], self.chunk_size))
        if self.input_log and not manifest.get("input_log"):
            if not self.force:
                raise ResumeError(
                    f"{self.partial} has no fingerprint of its input (an older qace wrote it), so this run "
                    "cannot check that its input is the same; pass --force (force=True) to continue it "
                    "anyway, or remove it to start over"
                )
            log.warning("continuing %s without checking its input (forced)", self.partial)
        try:
            listed = self._check_chunks(manifest)
        except (KeyError, TypeError, ValueError) as exc:
            raise ResumeError(f"{self.partial} is corrupt ({exc!r}); remove it to start over") from exc
        for stray in self.partial.iterdir():
            if stray.is_dir():
                log.warning("ignoring foreign directory %s", stray)
            elif stray.name not in listed:
                log.info("removing uncommitted %s", stray)
                stray.unlink()
        self._manifest = manifest
        self._seen = set(self._done)
        log.info("resuming %s: %d ids already done", self.path, len(self._done))

    def _check_chunks(self, manifest: dict[str, Any]) -> set[str]:
        """Load the ids of every committed chunk; return the file names the manifest owns."""
        listed = {"manifest.json", LOCK_NAME}
        for chunk in manifest["chunks"]:
            rows = _rows_file(chunk)
            errors = f"{chunk['name']}.errors.jsonl"
            names = [rows] if rows else []
            names += [errors] if chunk["errors"] else []
            if chunk.get("inputs"):
                names.append(f"{chunk['name']}.input.jsonl")
            for name in names:
                if not (self.partial / name).is_file():
                    raise ResumeError(
                        f"{self.partial} is missing committed chunk {name}; remove it to start over"
                    )
                listed.add(name)
            if rows.endswith(".arrow"):
                from qace.data.parquet_parts import part_ids

                self._done.update(part_ids(self.partial / rows))
            elif rows:
                self._done.update(_jsonl_ids(self.partial / rows))
            if chunk["errors"]:
                self._load_errors(self.partial / errors)
        return listed

    def _load_errors(self, path: Path) -> None:
        """Errors with an input line are done by line, others (no line) by id."""
        with path.open("rb") as f:
            for text in f:
                if text.strip():
                    error = json.loads(text)
                    if error.get("line") is not None:
                        self._done_lines.add(int(error["line"]))
                    else:
                        self._done.add(str(error["id"]))

    def done_ids(self) -> set[str]:
        """Ids already committed by an earlier run of this output: scored rows, and errors without a line."""
        return set(self._done)

    def done_lines(self) -> set[int]:
        """Input lines of the errors an earlier run of this output committed."""
        return set(self._done_lines)

    def committed_marks(self) -> Iterator[InputMark]:
        """The input marks an earlier run committed, in input order (none without an input log)."""
        from qace.data.fingerprint import InputMark

        if self._complete or not self._manifest.get("input_log"):
            return
        for chunk in self._manifest["chunks"]:
            if chunk.get("inputs"):
                with (self.partial / f"{chunk['name']}.input.jsonl").open("rb") as f:
                    for text in f:
                        yield InputMark(*json.loads(text))

    def add(self, row: dict[str, Any], *, mark: InputMark | None = None) -> None:
        """Queue one scored row (must have a string `id`) and the `mark` of its input record; commits
        a chunk every `chunk_size` rows."""
        record_id = row.get("id") if isinstance(row, dict) else None
        if not isinstance(record_id, str):
            raise QACEError(f"a result row needs a string 'id', got {record_id!r}")
        self._claim(record_id, None)
        try:
            if self.fmt == "parquet":
                self._plain_rows.append(_parts().plain_row(row))
            else:
                line = _ENCODE_ROW(row)
                self._rows.append(line + "\n")
        except (TypeError, ValueError) as exc:
            self._seen.discard(record_id)
            raise QACEError(f"result row {record_id!r} cannot be written as JSON: {exc}") from exc
        self._add_mark(mark)

    def add_error(
        self, id: str | None, reason: str, *, line: int | None = None, mark: InputMark | None = None
    ) -> None:
        """Queue a per-record error (``id`` None when it could not be read; ``line`` its input line) and
        the `mark` of its input record; it counts as done on resume, like a scored row: by ``line``
        when given, else by ``id``."""
        if id is None and line is None:
            raise QACEError(f"an error needs an id or an input line ({reason!r})")
        self._claim(id, line)
        entry: dict[str, Any] = {"id": id} if line is None else {"id": id, "line": line}
        self._errors.append(json.dumps({**entry, "reason": reason}, ensure_ascii=False) + "\n")
        self._add_mark(mark)

    def _add_mark(self, mark: InputMark | None) -> None:
        if self.input_log:
            if mark is None:
                raise QACEError(f"{self.path} logs its input: every row and error needs its input mark")
            self._marks.append(_mark_line(mark))
        self._maybe_flush()

    def _claim(self, record_id: str | None, line: int | None) -> None:
        """Refuse a second row for one id or input line (a caller bug) and any new row for a finished
        output."""
        if self._closed:
            raise QACEError(f"{self.path}: writer is closed")
        if line is not None:
            if line in self._seen_lines or line in self._done_lines:
                raise QACEError(f"duplicate result for input line {line} in {self.path} (caller bug)")
        elif record_id in self._seen or record_id in self._done:
            raise QACEError(f"duplicate result for id {record_id!r} in {self.path} (caller bug)")
        if self._complete:
            what = f"id {record_id!r}" if line is None else f"input line {line}"
            raise ResumeError(
                f"{self.path} is already complete; a row for new {what} cannot be appended. "
                "Write to a new output path or remove the old output."
            )
        if line is not None:
            self._seen_lines.add(line)
        else:
            self._seen.add(record_id)  # type: ignore[arg-type]  # not None: add_error checks

    def _maybe_flush(self) -> None:
        if len(self._rows) + len(self._plain_rows) + len(self._errors) >= self.chunk_size:
            self.flush()

    def flush(self) -> None:
        """Commit the pending rows and errors as one whole chunk (no-op when nothing is pending)."""
        rows = len(self._rows) + len(self._plain_rows)
        if not rows and not self._errors:
            return
        name = f"{len(self._manifest['chunks']):06d}"
        chunk: dict[str, Any] = {"name": name, "rows": rows, "errors": len(self._errors)}
        if self.fmt == "jsonl":
            durable.atomic_write(self.partial / f"{name}.rows.jsonl", self._rows)
        elif rows:
            _atomic_part(self.partial / f"{name}.rows.arrow", _parts().chunk_table(self._plain_rows))
        if self.fmt == "parquet":
            chunk["part"] = "arrow" if rows else "none"
        if self._errors:
            durable.atomic_write(self.partial / f"{name}.errors.jsonl", self._errors)
        if self._marks:
            durable.atomic_write(self.partial / f"{name}.input.jsonl", self._marks)
            chunk["inputs"] = len(self._marks)
        self._manifest["chunks"].append(chunk)
        self._manifest["rows"] += rows
        self._manifest["errors"] += len(self._errors)
        self._write_manifest()
        self._rows, self._plain_rows, self._errors, self._marks = [], [], [], []

    def close(self) -> None:
        """Commit what is pending, then assemble the final output and errors files atomically."""
        if self._closed:
            return
        self._closed = True
        if self._complete:
            return
        try:
            self._assemble()
        finally:
            self._unlock()

    def _assemble(self) -> None:
        self.flush()
        chunks = self._manifest["chunks"]
        error_files = [self.partial / f"{c['name']}.errors.jsonl" for c in chunks if c["errors"]]
        if error_files:
            durable.concatenate(error_files, self.errors_path)
        elif self.errors_path.exists():
            self.errors_path.unlink()  # stale, from an older run of this path
        if self.fmt == "jsonl":
            durable.concatenate([self.partial / f"{c['name']}.rows.jsonl" for c in chunks], self.path)
        else:
            tmp = self.path.with_name(self.path.name + ".tmp")
            parts = [self._part(c) for c in chunks if c["rows"]]
            with durable.space_for(tmp, self.path, lambda: sum(p.stat().st_size for p in parts)):
                _parts().assemble(parts, tmp, self.signature)
                durable.fsync_path(tmp)
            os.replace(tmp, self.path)
            durable.fsync_dir(self.path.parent)
        shutil.rmtree(self.partial)
        log.info("wrote %s (%d rows, %d errors)", self.path, self._manifest["rows"], self._manifest["errors"])

    def _part(self, chunk: dict[str, Any]) -> Path:
        """The Arrow part of a committed chunk; a chunk an older qace committed as JSONL is converted
        (into an unlisted file, which a killed close leaves for the next resume to delete)."""
        path = self.partial / f"{chunk['name']}.rows.arrow"
        if chunk.get("part") != "arrow":
            with (self.partial / f"{chunk['name']}.rows.jsonl").open("rb") as f:
                rows = [_parts().plain_row(json.loads(line)) for line in f if line.strip()]
            _atomic_part(path, _parts().chunk_table(rows))
        return path

    def _write_manifest(self) -> None:
        durable.atomic_write(self.partial / "manifest.json", [json.dumps(self._manifest, indent=1) + "\n"])

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Assemble on normal exit; on an exception keep the committed work (and pending rows, unless
        out of space) for resume, and remove the partial directory when nothing was committed."""
        if exc_type is None:
            self.close()
            return
        self._closed = True
        if self._complete:
            return
        try:
            if not isinstance(exc, OutputError):  # out of space: the pending rows cannot be written now
                self.flush()
        except Exception:  # the original exception matters more; the pending rows will be redone
            log.exception("could not commit pending rows of %s", self.path)
        try:
            if not self._manifest.get("chunks"):  # nothing committed: leave nothing behind
                shutil.rmtree(self.partial, ignore_errors=True)
        finally:
            self._unlock()

    def _unlock(self) -> None:
        """Release the partial directory's lock (closing its file)."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def _format_for(path: Path, fmt: str) -> str:
    if fmt == "auto":
        found = _FORMATS.get(path.suffix.lower())
        if found is None:
            raise QACEError(f"cannot tell the output format of {str(path)!r}; use .jsonl or .parquet")
        return found
    if fmt not in _FORMATS.values():
        raise QACEError(f"unknown output format {fmt!r}; use jsonl or parquet")
    return fmt


def _mismatch(where: Path, found: str, wanted: str) -> str:
    return (
        f"{where} was written with signature {found!r} but this run has {wanted!r}; "
        "scores made differently cannot be mixed: write to a new path or remove the old output"
    )


def _plain(value: Any) -> Any:
    """Let numpy scalars and arrays through json.dumps without importing numpy here."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_ENCODE_ROW = json.JSONEncoder(ensure_ascii=False, allow_nan=False, default=_plain).encode


def _mark_line(mark: InputMark) -> str:
    """``json.dumps(list(mark), ensure_ascii=False) + "\\n"``, written out (it runs for every record)."""
    line = "null" if mark.line is None else str(mark.line)
    record_id = "null" if mark.id is None else _encode_string(mark.id)
    return f"[{line}, {record_id}, {_encode_string(mark.digest)}]\n"


@functools.cache
def _parts() -> Any:
    """`qace.data.parquet_parts`, imported when Parquet output is written (it imports pyarrow)."""
    from qace.data import parquet_parts

    return parquet_parts


def _atomic_part(path: Path, table: Any) -> None:
    """Write an Arrow part via an fsynced `.tmp` sibling and os.replace, so it is whole or absent."""
    tmp = path.with_name(path.name + ".tmp")
    with durable.space_for(tmp, path, lambda: int(table.nbytes)):
        _parts().write_part(table, tmp)
        durable.fsync_path(tmp)
    os.replace(tmp, path)
    durable.fsync_dir(path.parent)


def _rows_file(chunk: dict[str, Any]) -> str:
    """The file holding a committed chunk's rows ('' for a Parquet chunk of errors only)."""
    if chunk.get("part") == "arrow":
        return f"{chunk['name']}.rows.arrow"
    return f"{chunk['name']}.rows.jsonl" if chunk.get("part") != "none" else ""


def _jsonl_ids(path: Path) -> Iterator[str]:
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                yield str(json.loads(line)["id"])


def _final_ids(path: Path, fmt: str) -> Iterator[str]:
    if fmt == "jsonl":
        yield from _jsonl_ids(path)
        return
    import pyarrow.parquet as pq

    for value in pq.read_table(path, columns=["id"]).column("id").to_pylist():
        yield str(value)


def _final_signature(path: Path, fmt: str) -> str | None:
    """The signature a finished output records: parquet metadata, else the first row's field."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        meta = pq.read_schema(path).metadata or {}
        value = meta.get(b"qace.signature")
        return value.decode("utf-8") if value is not None else None
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                found = json.loads(line).get("signature")
                return found if isinstance(found, str) else None
    return None
