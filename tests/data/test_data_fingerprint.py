"""Input marks: the digest a resumed run compares stays what earlier versions committed."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from qace.data.fingerprint import InputMark, input_mark
from qace.data.records import Record, RecordError


def committed_mark(item: Record | RecordError) -> InputMark:
    """The mark as qace computed it when partial outputs already on disk were written."""
    if isinstance(item, RecordError):
        content: list[object] = ["error", item.reason]
    else:
        content = [item.caption, item.image_id, item.references, item.image]
    digest = hashlib.blake2b(json.dumps(content).encode("ascii"), digest_size=8).hexdigest()
    return InputMark(item.line, item.id, digest)


RECORDS = [
    Record("1", "a dog runs on the grass", "2008_000123", ("a dog", "the dog plays"), None, 1),
    Record(
        "2",
        "un café près de la tour — 東京 🐕",
        "img 7",
        ("réf «un»", "東京タワー", "🐕🐕"),
        "/data/ä b.jpg",
        2,
    ),
    Record("3", 'quotes " and \\ backslash\tand\ncontrol \x00\x1f chars', None, None, None, 3),
    Record("4", "only an image", None, None, "/d/x.png"),
    Record("5", "empty references tuple", "i", ()),
    Record("6", "references as a list", "i", ["a", "b"], None, 6),  # type: ignore[arg-type]
    Record("7", "lone surrogate \udc80 from surrogateescape", "i\udcff", ("r\ud800",), None, 7),
    Record("8", 17, 42, ("a", 3), None, 8),  # type: ignore[arg-type]  # not what readers give: json.dumps
    Record("9", "references as one string", None, "abc", None, 9),  # type: ignore[arg-type]
    Record("10", "nested", None, (["a"], "b"), None, 10),  # type: ignore[arg-type]
    Record("11", "x" * 10_000, "\u2028\u2029", ("\x7f",), None, None),
    RecordError(None, "line 3: malformed JSON (Expecting value at column 1)", 3),
    RecordError("k", "line 4: caption must be a string, got int — «é»", 4),
]


@pytest.mark.parametrize("item", RECORDS, ids=lambda item: repr(item)[:40])
def test_input_mark_matches_the_committed_format(item: Record | RecordError) -> None:
    assert input_mark(item) == committed_mark(item)


def test_input_mark_matches_on_random_text() -> None:
    rng = random.Random(7)

    def text() -> str:
        return "".join(
            chr(rng.choice((rng.randrange(128), rng.randrange(0x110000)))) for _ in range(rng.randrange(12))
        )

    for line in range(2000):
        refs = None if rng.random() < 0.3 else tuple(text() for _ in range(rng.randrange(4)))
        image_id = None if rng.random() < 0.3 else text()
        image = None if rng.random() < 0.7 else text()
        record = Record(str(line), text(), image_id, refs, image, line)
        assert input_mark(record) == committed_mark(record)
