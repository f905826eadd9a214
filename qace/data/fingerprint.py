"""Input fingerprints: a resumed run never mixes the scores of two different inputs.

A run that writes resumable output logs, next to each committed chunk, the *mark* of every input
record it covers: ``(line, id, digest)``, the digest hashing the record's content (caption,
references, image id and path; an unreadable record's reason). A resumed run reads its input again
and compares, record by record in input order, the marks committed then with the marks of the input
now (`InputCheck`); the first difference is refused with a message naming its line and what changed.
Marks are streamed from the chunk files, so the check holds no more than one chunk in memory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from json.encoder import encode_basestring_ascii as _encode_ascii
from typing import NamedTuple

from qace.data.records import Record, RecordError
from qace.errors import ResumeError


class InputMark(NamedTuple):
    """One input record as a resumed run recognises it."""

    line: int | None
    id: str | None
    digest: str


def input_mark(item: Record | RecordError) -> InputMark:
    """The mark of ``item``: its line, id and a digest of its content."""
    text = json.dumps(["error", item.reason]) if isinstance(item, RecordError) else _record_json(item)
    digest = hashlib.blake2b(text.encode("ascii"), digest_size=8).hexdigest()
    return InputMark(item.line, item.id, digest)


def _record_json(record: Record) -> str:
    """``json.dumps([caption, image_id, references, image])``, written out for strings, None and a list or
    tuple of strings (what the readers give), since it runs for every record; other values go through
    ``json.dumps``. Strings go through the C encoder ``json.dumps`` itself uses, which raises TypeError for
    anything but a string."""
    caption, image_id, references, image = record.caption, record.image_id, record.references, record.image
    if references is None or isinstance(references, (list, tuple)):
        try:
            refs = "null" if references is None else f"[{', '.join(map(_encode_ascii, references))}]"
            image_id_json = "null" if image_id is None else _encode_ascii(image_id)
            image_json = "null" if image is None else _encode_ascii(image)
            return f"[{_encode_ascii(caption)}, {image_id_json}, {refs}, {image_json}]"
        except TypeError:  # a value that is not a string
            pass
    return json.dumps([caption, image_id, references, image])


class InputCheck:
    """Compare the input now with the marks an earlier run committed (``committed``, in input order).

    Call `matches` for every input record in order: True while the record is one the earlier run
    committed (and unchanged), False once past them; a difference raises `ResumeError`. `finish`
    raises when the input ended before the committed records did.
    """

    def __init__(self, committed: Iterable[InputMark], output: str) -> None:
        self._committed: Iterator[InputMark] = iter(committed)
        self._output = output
        self._count = 0
        self._exhausted = False

    def matches(self, now: InputMark) -> bool:
        if self._exhausted:
            return False
        then = next(self._committed, None)
        if then is None:
            self._exhausted = True
            return False
        self._count += 1
        if then != now:
            raise ResumeError(f"{self._changed(then, now)}; {self._advice()}")
        return True

    def finish(self) -> None:
        if self._exhausted:
            return
        then = next(self._committed, None)
        if then is not None:
            raise ResumeError(
                f"the input ends after {self._count} record(s), but {self._output} already holds "
                f"more (next: line {then.line}, id {then.id!r}); {self._advice()}"
            )

    def _changed(self, then: InputMark, now: InputMark) -> str:
        number = f"input record {self._count}"
        if then.line != now.line:
            return (
                f"{number} (id {now.id!r}) is on line {now.line} now but was on line {then.line} "
                "when the partial output was written (lines were added or removed above it)"
            )
        if then.id != now.id:
            return (
                f"line {now.line} held id {then.id!r} when the partial output was written "
                f"and holds {now.id!r} now"
            )
        return (
            f"line {now.line} (id {now.id!r}) changed since the partial output was written "
            "(its caption, references, image or error differ)"
        )

    def _advice(self) -> str:
        return (
            f"--resume continues {self._output} only with the same input; "
            "restore that input, or write to a new output path"
        )
