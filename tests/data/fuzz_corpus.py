"""A seeded fuzz corpus: many malformed records of every kind, mixed with a few good ones.

`make_corpus(folder, fmt, seed=...)` writes one input file (``jsonl``, ``csv``, ``coco`` with its
references file, ``parquet``; or JSONL for QACE-Img over a feature store of each kind: ``img`` a
directory of ``.npz``, ``img-h5`` qace's HDF5 store with a damaged chunk, ``img-vlt5`` VL-T5's HDF5,
``img-tsv`` a bottom-up-attention TSV, each with typed garbage of its format, odd image ids and
out-of-range boxes) and returns a
`Corpus` that knows, for every input record, its line (JSONL/CSV: the physical line it
starts on; COCO/Parquet: its 1-based number), the id under which it may be scored, and what it must
become (``scored``, ``error``, or ``either`` for odd but valid records). `check_invariant` then
asserts the contract of a file run: every input record is scored exactly once or listed as an error
with its line and a reason.

Few records need model work (the good ones and the ``either`` ones), so a run over a corpus is
fast on the CPU with the tiny test models; the malformed ones are rejected before any model runs.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import random
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BAD_PER_CORPUS = 1000
HUGE_CAPTION = "a dog " * 200_000  # 1.2 MB: over spaCy's max_length (E088) and qace's max_caption_chars
CAPTIONS = (
    "a girl in a red dress runs on the beach",
    "two dogs play with a ball in the park",
    "a man rides a bicycle down the street",
    "a child eats an ice cream near the sea",
)
REFERENCES = ["a girl runs along the sand", "a young girl on the beach"]
ODD_IDS = ("²", "①", "9" * 5000, "000000184613")
"""Record ids that are valid but odd: digits that are no ASCII number, a number ``int()`` refuses, a
zero-padded number."""


def _lone(rng: random.Random) -> str:
    """A lone surrogate (high or low), which JSON writes as an unpaired escape such as ``\\ud800``."""
    return chr(rng.choice([0xD800, 0xDBFF, 0xDC00, 0xDFFF]))


@dataclass(frozen=True)
class Expected:
    """One input record: where it is, the id it is scored under (None: never scored), its outcome."""

    line: int
    id: str | None
    outcome: str  # "scored", "error" or "either"
    kind: str


@dataclass
class Corpus:
    input: Path
    args: list[str] = field(default_factory=list)  # extra `qace score` arguments (references, features)
    records: list[Expected] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.records if r.outcome == outcome)


def check_invariant(corpus: Corpus, scored_ids: list[str], errors: list[dict[str, Any]]) -> None:
    """Every record of ``corpus`` is scored exactly once (``scored_ids``) or listed in ``errors``
    (``{"id", "line", "reason"}`` dicts) with its line and a reason; nothing else appears."""
    line_of = {r.id: r.line for r in corpus.records if r.id is not None}
    assert len(line_of) == sum(1 for r in corpus.records if r.id is not None), "corpus ids must be unique"
    covered: Counter[int] = Counter()
    scored_lines = set()
    for record_id in scored_ids:
        assert record_id in line_of, f"scored id {record_id!r} is no scorable input record"
        covered[line_of[record_id]] += 1
        scored_lines.add(line_of[record_id])
    for error in errors:
        assert isinstance(error.get("line"), int), f"error without its line: {error}"
        assert isinstance(error.get("reason"), str) and error["reason"].strip(), (
            f"error without reason: {error}"
        )
        covered[error["line"]] += 1
    twice = sorted(line for line, n in covered.items() if n > 1)
    assert not twice, f"input lines scored or listed more than once: {twice[:10]}"
    by_line = {r.line: r for r in corpus.records}
    assert len(by_line) == len(corpus.records)
    lost = sorted(set(by_line) - set(covered))
    assert not lost, f"records neither scored nor listed: {[by_line[n] for n in lost[:10]]}"
    extra = sorted(set(covered) - set(by_line))
    assert not extra, f"results for lines that hold no record: {extra[:10]}"
    for record in corpus.records:
        if record.outcome == "scored":
            assert record.line in scored_lines, f"good record not scored: {record}"
        elif record.outcome == "error":
            assert record.line not in scored_lines, f"malformed record scored: {record}"


def make_corpus(folder: Path, fmt: str, *, seed: int = 0, corrupt_files: bool = False) -> Corpus:
    """Write the corpus of ``fmt`` into ``folder`` (see the module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}-{fmt}")
    if fmt == "jsonl":
        return _jsonl(folder, rng)
    if fmt == "csv":
        return _csv(folder, rng)
    if fmt == "coco":
        return _coco(folder, rng)
    if fmt == "parquet":
        return _parquet(folder, rng)
    if fmt == "img":
        return _img(folder, rng, corrupt_files=corrupt_files)
    if fmt == "img-h5":
        return _img_h5(folder, rng)
    if fmt == "img-vlt5":
        return _img_vlt5(folder, rng)
    if fmt == "img-tsv":
        return _img_tsv(folder, rng)
    raise ValueError(f"unknown corpus format {fmt!r}")


def _good(i: int, rng: random.Random) -> dict[str, Any]:
    return {"id": f"good-{i}", "caption": rng.choice(CAPTIONS), "references": REFERENCES}


def _mixed(rng: random.Random, good: int, bad: list[Any]) -> list[Any]:
    """``bad`` in a seeded order with ``good`` good-record slots (None) spread among them."""
    bad = list(bad)
    rng.shuffle(bad)
    for _ in range(good):
        bad.insert(rng.randrange(len(bad) + 1), None)
    return bad


def _cycle(kinds: list[Callable[[int], Any]], n: int) -> list[Any]:
    """``n`` malformed records: every kind at least once, then the kinds again in turn."""
    return [kinds[i % len(kinds)](i) for i in range(n)]


# -- JSONL ------------------------------------------------------------------------------------


def _jsonl(folder: Path, rng: random.Random) -> Corpus:
    def obj(i: int, **fields: Any) -> dict[str, Any]:
        return {**{"id": f"bad-{i}", "caption": "a dog", "references": REFERENCES}, **fields}

    def line(value: Any) -> bytes:
        return json.dumps(value).encode()

    # each kind: (kind name, record id if it may be scored, outcome, bytes of the line)
    def cut(i: int) -> tuple:
        text = line(obj(i, caption=f"a dog number {i}"))
        return ("broken JSON", None, "error", text[: rng.randrange(1, len(text) - 1)])

    kinds: list[Callable[[int], tuple]] = [
        cut,
        lambda i: (
            "not an object",
            None,
            "error",
            rng.choice([b"[1, 2]", b'"text"', b"42", b"null", b"true"]),
        ),
        lambda i: ("too deep", None, "error", b"[" * 50_000),
        lambda i: (
            "raw control character",
            None,
            "error",
            f'{{"id": "bad-{i}", "caption": "a\x01b"}}'.encode(),
        ),
        lambda i: ("id type", None, "error", line(obj(i, id=rng.choice([[1], 1.5, True, None, {}, ""])))),
        lambda i: ("missing id", None, "error", line({"caption": "a dog", "references": REFERENCES})),
        lambda i: ("caption type", None, "error", line(obj(i, caption=rng.choice([5, [1], None, {}, True])))),
        lambda i: ("NaN caption", None, "error", f'{{"id": "bad-{i}", "caption": NaN}}'.encode()),
        lambda i: ("empty caption", None, "error", line(obj(i, caption=rng.choice(["", "   ", "\t\n "])))),
        lambda i: (
            "bad UTF-8 caption",
            None,
            "error",
            line(obj(i, caption="caf@")).replace(b"@", b"\xff\xfe"),
        ),
        lambda i: ("bad UTF-8 id", None, "error", line(obj(i, id="bad@")).replace(b"@", b"\xc3\x28")),
        lambda i: ("duplicate id", None, "error", line(obj(i, id="good-0"))),
        lambda i: ("missing references", None, "error", line({"id": f"bad-{i}", "caption": "a dog"})),
        lambda i: (
            "references type",
            None,
            "error",
            line(obj(i, references=rng.choice(["one", [1], [], [""], [None], {"a": 1}]))),
        ),
        lambda i: ("image_id type", None, "error", line(obj(i, image_id=rng.choice([[1], {}, 1.5])))),
        lambda i: ("image type", None, "error", line(obj(i, image=rng.choice([5, [], ""])))),
        lambda i: (  # an unpaired escape such as "\ud800": valid JSON, no text (#37.1)
            "lone surrogate",
            None,
            "error",
            line(obj(i, **{rng.choice(["caption", "id", "image_id", "image"]): f"a {_lone(rng)} b"})),
        ),
        lambda i: ("lone surrogate reference", None, "error", line(obj(i, references=["ok", _lone(rng)]))),
    ]
    bad = _cycle(kinds, BAD_PER_CORPUS)
    bad += [
        ("huge caption", None, "error", line(obj(BAD_PER_CORPUS + k, caption=HUGE_CAPTION))) for k in range(2)
    ]
    # odd but valid: control characters, an id that looks like a line label, a missing image file
    odd = [
        (
            "control characters",
            "odd-0",
            "either",
            line(obj(0, id="odd-0", caption="a dog\x00\x07\x1b[31m runs\x7f")),
        ),
        ("line-like id", "line 5", "either", line(obj(0, id="line 5", caption="a dog on grass"))),
        ("missing image file", "odd-2", "either", line(obj(0, id="odd-2", image="no/such/image.png"))),
        *(("odd id", odd_id, "either", line(obj(0, id=odd_id))) for odd_id in ODD_IDS),
        ("integer image_id", "odd-3", "either", line(obj(0, id="odd-3", image_id=184613))),
    ]
    rows = _mixed(rng, 5, bad + odd)
    records, lines = [], []
    good = 0
    for number, item in enumerate(rows, start=1):
        if item is None:
            item = ("good", f"good-{good}", "scored", line(_good(good, rng)))
            good += 1
        kind, record_id, outcome, text = item
        lines.append(text)
        records.append(Expected(number, record_id, outcome, kind))
    _move_first_good_up(records, lines)
    path = folder / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return Corpus(path, [], records)


def _move_first_good_up(records: list[Expected], lines: list[bytes]) -> None:
    """Put ``good-0`` first, so that every "duplicate id" record comes after it."""
    at = next(i for i, r in enumerate(records) if r.id == "good-0")
    records.insert(0, records.pop(at))
    lines.insert(0, lines.pop(at))
    for i, r in enumerate(records):
        records[i] = Expected(i + 1, r.id, r.outcome, r.kind)


# -- CSV --------------------------------------------------------------------------------------


def _csv_line(*cells: str) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(cells)
    return out.getvalue()


def _csv(folder: Path, rng: random.Random) -> Corpus:
    refs = json.dumps(REFERENCES)

    def row(i: int, caption: str = "a dog", refs_cell: str = refs, rid: str | None = None) -> str:
        return _csv_line(rid if rid is not None else f"bad-{i}", "img", caption, refs_cell)

    # each kind: list of (kind, id, outcome, text) for the physical records it writes
    kinds: list[Callable[[int], list[tuple]]] = [
        lambda i: [
            ("unclosed quote", None, "error", f'bad-{i},img,"an unclosed caption,[]\n'),
            ("swallowed row", None, "error", f"bad-{i}a,img,swallowed one,\n"),
            ("swallowed row", None, "error", f"bad-{i}b,img,swallowed two,\n"),
            ("swallowed row", None, "error", f'bad-{i}c,img,"closes the quote",""\n'),
        ],
        lambda i: [("stray quote", None, "error", f'bad-{i},img,The "big dog runs,\n')],
        lambda i: [("text after quote", None, "error", f'bad-{i},img,"quoted" tail,\n')],
        lambda i: [("too many cells", None, "error", f"bad-{i},img,a dog,[],extra\n")],
        lambda i: [("too few cells", None, "error", f"bad-{i},img\n")],
        lambda i: [("bad UTF-8", None, "error", row(i, caption="caf\udcff"))],
        lambda i: [("empty caption", None, "error", row(i, caption=rng.choice(["", "   "])))],
        lambda i: [("missing id", None, "error", row(i, rid=""))],
        lambda i: [("duplicate id", None, "error", row(i, rid="good-0"))],
        lambda i: [("missing references", None, "error", row(i, refs_cell=""))],
        lambda i: [
            (
                "references type",
                None,
                "error",
                row(i, refs_cell=rng.choice(["not json", "5", '["a", 3]', "[]"])),
            )
        ],
        lambda i: [("lone surrogate reference", None, "error", row(i, refs_cell=json.dumps([_lone(rng)])))],
    ]
    bad = [kinds[i % len(kinds)](i) for i in range(BAD_PER_CORPUS)]
    bad += [
        [("huge caption", None, "error", row(BAD_PER_CORPUS + k, caption=HUGE_CAPTION))] for k in range(2)
    ]
    odd = [
        [("control characters", "odd-0", "either", row(0, caption="a dog\x00\x07\x1b runs", rid="odd-0"))],
        [("quoted line break", "odd-1", "either", row(0, caption="a dog\non grass", rid="odd-1"))],
        [("line-like id", "line 5", "either", row(0, caption="a dog on grass", rid="line 5"))],
        *([("odd id", odd_id, "either", row(0, rid=odd_id))] for odd_id in ODD_IDS),
    ]
    groups = _mixed(rng, 5, bad + odd)
    # the first good record first (duplicates follow it); a quote left open to the end of the file last
    groups.remove(None)
    groups.insert(0, None)
    groups.append(
        [
            ("unclosed at the end", None, "error", 'bad-end,img,"open to the end of the file,[]\n'),
            ("swallowed row", None, "error", "bad-end-a,img,swallowed at the end,\n"),
        ]
    )
    text = [_csv_line("id", "image_id", "caption", "references")]
    records, number, good = [], 2, 0
    for group in groups:
        if group is None:
            good_row = _good(good, rng)
            group = [
                ("good", good_row["id"], "scored", row(0, caption=good_row["caption"], rid=good_row["id"]))
            ]
            good += 1
        for kind, record_id, outcome, line in group:
            text.append(line)
            records.append(Expected(number, record_id, outcome, kind))
            number += line.count("\n")
    path = folder / "fuzz.csv"
    path.write_bytes("".join(text).encode("utf-8", errors="surrogateescape"))
    return Corpus(path, [], records)


# -- COCO -------------------------------------------------------------------------------------


def _coco(folder: Path, rng: random.Random) -> Corpus:
    kinds: list[Callable[[int], tuple]] = [
        lambda i: ("not an object", "error", rng.choice(["junk", 5, None, [1], True])),
        lambda i: ("missing caption", "error", {"image_id": "img-good"}),
        lambda i: (
            "caption type",
            "error",
            {"image_id": "img-good", "caption": rng.choice([5, [1], {}, None])},
        ),
        lambda i: ("empty caption", "error", {"image_id": "img-good", "caption": rng.choice(["", "  "])}),
        lambda i: (
            "image_id type",
            "error",
            {"image_id": rng.choice([[1], {}, 1.5, True]), "caption": "a dog"},
        ),
        lambda i: (
            "no references for the image",
            "error",
            {"image_id": f"img-unknown-{i}", "caption": "a dog"},
        ),
        lambda i: ("missing image_id", "error", {"caption": "a dog"}),
        lambda i: ("lone surrogate caption", "error", {"image_id": "img-good", "caption": f"a {_lone(rng)}"}),
        lambda i: ("lone surrogate image_id", "error", {"image_id": f"7{_lone(rng)}", "caption": "a dog"}),
    ]
    bad = _cycle(kinds, BAD_PER_CORPUS)
    bad += [("huge caption", "error", {"image_id": "img-good", "caption": HUGE_CAPTION})] * 2
    bad += [
        ("control characters", "either", {"image_id": "img-good", "caption": "a dog\x00\x07\x1b runs"}),
        ("integer image_id", "either", {"image_id": 7, "caption": "a dog on grass"}),
    ]
    entries = _mixed(rng, 5, bad)
    results, records = [], []
    for index, entry in enumerate(entries):
        if entry is None:
            entry = ("good", "scored", {"image_id": "img-good", "caption": rng.choice(CAPTIONS)})
        kind, outcome, value = entry
        results.append(value)
        records.append(Expected(index + 1, str(index) if outcome != "error" else None, outcome, kind))
    path = folder / "fuzz-results.json"
    path.write_text(json.dumps(results))
    refs = folder / "fuzz-refs.json"
    annotations = [{"image_id": image, "caption": c} for image in ("img-good", 7) for c in REFERENCES]
    refs.write_text(json.dumps({"annotations": annotations}))
    return Corpus(path, ["--references", str(refs)], records)


# -- Parquet ----------------------------------------------------------------------------------


def _parquet(folder: Path, rng: random.Random) -> Corpus:
    import pyarrow.parquet as pq

    refs = json.dumps(REFERENCES)
    kinds: list[Callable[[int], tuple]] = [
        lambda i: (
            "missing id",
            "error",
            {"id": rng.choice([None, "", "  "]), "caption": "a dog", "references": refs},
        ),
        lambda i: ("missing caption", "error", {"id": f"bad-{i}", "caption": None, "references": refs}),
        lambda i: (
            "empty caption",
            "error",
            {"id": f"bad-{i}", "caption": rng.choice(["", " \t"]), "references": refs},
        ),
        lambda i: ("duplicate id", "error", {"id": "good-0", "caption": "a dog", "references": refs}),
        lambda i: ("missing references", "error", {"id": f"bad-{i}", "caption": "a dog", "references": None}),
        lambda i: (
            "references type",
            "error",
            {
                "id": f"bad-{i}",
                "caption": "a dog",
                "references": rng.choice(["not json", "5", '["a", 3]', "[]"]),
            },
        ),
        lambda i: (
            "lone surrogate reference",
            "error",
            {"id": f"bad-{i}", "caption": "a dog", "references": json.dumps([_lone(rng)])},
        ),
        lambda i: (  # a surrogate encoded as bytes (CESU-8): a string column that is not UTF-8 (#37.1)
            "non-UTF-8 caption",
            "error",
            {"id": f"bad-{i}", "caption": b"a \xed\xa0\x80 dog", "references": refs},
        ),
    ]
    bad = _cycle(kinds, BAD_PER_CORPUS)
    bad += [
        ("huge caption", "error", {"id": f"huge-{k}", "caption": HUGE_CAPTION, "references": refs})
        for k in range(2)
    ]
    bad += [
        (
            "control characters",
            "either",
            {"id": "odd-0", "caption": "a dog\x00\x07 runs", "references": refs},
        ),
        ("line-like id", "either", {"id": "line 5", "caption": "a dog on grass", "references": refs}),
    ]
    entries = _mixed(rng, 5, bad)
    entries.remove(None)
    entries.insert(0, None)  # the first good record first: duplicates follow it
    rows, records, good = [], [], 0
    for number, entry in enumerate(entries, start=1):
        if entry is None:
            value = _good(good, rng)
            entry = ("good", "scored", {**value, "references": refs})
            good += 1
        kind, outcome, value = entry
        rows.append(value)
        records.append(Expected(number, value["id"] if outcome != "error" else None, outcome, kind))
    path = folder / "fuzz.parquet"
    pq.write_table(_parquet_table(rows), path, row_group_size=300)
    return Corpus(path, [], records)


def _parquet_table(rows: list[dict[str, Any]]) -> Any:
    """``rows`` as an Arrow table whose ``caption`` column holds bytes captions as they are, UTF-8 or not
    (as a foreign writer may leave them: Arrow checks nothing when given the buffers)."""
    import pyarrow as pa

    raw = [
        c if isinstance(c, bytes) or c is None else c.encode("utf-8") for c in (r["caption"] for r in rows)
    ]
    binary = pa.array(raw, pa.binary())
    captions = pa.Array.from_buffers(pa.string(), len(binary), binary.buffers(), null_count=binary.null_count)
    table = pa.Table.from_pylist([{**r, "caption": None} for r in rows])
    return table.set_column(table.schema.get_field_index("caption"), "caption", captions)


# -- QACE-Img: region features ----------------------------------------------------------------

LONG_ID = "9" * 5000
"""A 5,000-digit image id: ``int()`` refuses it (Python's digit limit), so no id rule may use it."""
W, H = 640.0, 480.0


def _regions() -> tuple[np.ndarray, np.ndarray]:
    """Good fp16 ``features`` (36, 2048) and normalised corners ``x1, y1, x2, y2`` (36, 4) of one image."""
    gen = np.random.default_rng(0)
    features = gen.standard_normal((36, 2048)).astype(np.float16)
    corners = np.sort(gen.uniform(0.0, 1.0, size=(36, 2, 2)), axis=1)  # [x1, x2], [y1, y2]
    return features, np.stack([corners[:, 0, 0], corners[:, 0, 1], corners[:, 1, 0], corners[:, 1, 1]], 1)


def _six(corners: np.ndarray) -> np.ndarray:
    return np.concatenate([corners, corners[:, 2:] - corners[:, :2]], axis=1)


def _box_cases(corners: np.ndarray) -> dict[str, tuple[np.ndarray, str]]:
    """Stored image id -> (corners, outcome): well-formed ones under odd ids, and boxes out of range."""

    def changed(**values: float) -> np.ndarray:
        out = corners.astype(np.float64).copy()
        for name, value in values.items():
            out[2, "x1 y1 x2 y2".split().index(name)] = value
        return out

    edge = changed(x1=0.0, y1=0.0, x2=1.0, y2=1.0)
    edge[2] += [-4e-6, -4e-6, 4e-6, 4e-6]  # float rounding at the edges: clamped, scored
    return {
        "good": (corners, "scored"),
        "COCO_val2014_000000184613": (corners, "scored"),
        "²": (corners, "scored"),
        "①": (corners, "scored"),
        LONG_ID: (corners, "scored"),
        "edge": (edge, "scored"),
        "box-left": (changed(x1=-0.5), "error"),
        "box-right": (changed(x2=3.0), "error"),
        "box-upside-down": (changed(y1=0.7, y2=0.2), "error"),
    }


ODD_REFERENCES = {  # how records name a stored image: the one id rule of every store
    "COCO_val2014_000000184613": ["184613", "000000184613", "val2014/COCO_val2014_000000184613.jpg"],
    LONG_ID: [LONG_ID, "000" + LONG_ID],
}


def _img_records(
    folder: Path, rng: random.Random, name: str, store: Path, images: dict[str, str], extra_good: int = 3
) -> Corpus:
    """QACE-Img records over ``store``: ``images`` maps a stored (or absent) image id to its outcome;
    each scored image is named by each of its `ODD_REFERENCES` forms, the bad ones fill
    `BAD_PER_CORPUS` records, with records lacking an ``image_id`` among them."""
    good = [(ref, "scored", image) for image, outcome in images.items() if outcome == "scored"
            for ref in ODD_REFERENCES.get(image, [image])]  # fmt: skip
    bad = [image for image, outcome in images.items() if outcome == "error"]
    kinds: list[Callable[[int], tuple]] = [lambda i, image=image: (image, "error", image) for image in bad]
    kinds.append(lambda i: (None, "error", "missing image_id"))
    entries = _mixed(rng, extra_good, _cycle(kinds, BAD_PER_CORPUS) + good)
    lines, records = [], []
    for number, entry in enumerate(entries, start=1):
        ref, outcome, kind = entry if entry is not None else ("good", "scored", "good")
        record: dict[str, Any] = {"id": f"r-{number}", "caption": rng.choice(CAPTIONS)}
        if ref is not None:
            record["image_id"] = ref
        lines.append(json.dumps(record))
        records.append(
            Expected(number, record["id"] if outcome == "scored" else None, outcome, f"features: {kind}")
        )
    path = folder / f"fuzz-{name}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return Corpus(path, ["--variant", "img", "--features", str(store)], records)


def _img(folder: Path, rng: random.Random, *, corrupt_files: bool) -> Corpus:
    """An ``.npz`` folder: broken files, typed garbage, odd ids and out-of-range boxes."""
    features = folder / "features"
    features.mkdir(exist_ok=True)
    good_f, corners = _regions()
    images = {LONG_ID: "error"}  # no file name holds 5,000 characters: looked up, not found
    for image, (boxes, outcome) in _box_cases(corners).items():
        if image != LONG_ID:
            np.savez(features / f"{image}.npz", features=good_f, norm_bb=_six(boxes).astype(np.float16))
            images[image] = outcome
    good_b = _six(corners).astype(np.float16)
    nan_f = good_f.copy()
    nan_f[3, 5] = np.nan
    np.savez(features / "nan.npz", features=nan_f, norm_bb=good_b)
    inf_b = good_b.copy()
    inf_b[0, 0] = np.inf
    np.savez(features / "inf.npz", features=good_f, norm_bb=inf_b)
    np.savez(features / "misshaped.npz", features=good_f[:20], norm_bb=good_b[:20])
    np.savez(features / "nokey.npz", features=good_f)
    np.savez(features / "text-features.npz", features=np.full((36, 2048), "x"), norm_bb=good_b)
    np.savez(features / "bool-boxes.npz", features=good_f, norm_bb=good_b > 0.5)
    (features / "not-npz.npz").write_text("this is not a zip archive")
    bad = ["nan", "inf", "misshaped", "nokey", "text-features", "bool-boxes", "not-npz", "absent"]
    if corrupt_files:
        bad += _corrupt_npz(features, good_f, good_b)
    return _img_records(folder, rng, "img", features, {**images, **dict.fromkeys(bad, "error")})


def _corrupt_npz(features: Path, good_f: np.ndarray, good_b: np.ndarray) -> list[str]:
    """Damaged .npz files: truncated, a flipped byte under the CRC, a damaged compressed stream."""
    whole = io.BytesIO()
    np.savez(whole, features=good_f, norm_bb=good_b)
    data = whole.getvalue()
    (features / "truncated.npz").write_bytes(data[: len(data) // 2])
    flipped = bytearray(data)
    flipped[len(data) // 3] ^= 0xFF  # inside the stored 'features' array: the CRC no longer matches
    (features / "bad-crc.npz").write_bytes(bytes(flipped))
    packed = io.BytesIO()
    np.savez_compressed(packed, features=good_f, norm_bb=good_b)
    with zipfile.ZipFile(packed) as z:
        offset = z.getinfo("features.npy").header_offset
    damaged = bytearray(packed.getvalue())
    for k in range(200, 260):
        damaged[offset + k] ^= 0x5A  # inside the deflate stream
    (features / "bad-zlib.npz").write_bytes(bytes(damaged))
    return ["truncated", "bad-crc", "bad-zlib"]


def _damage_chunk(path: Path, dataset: str, index: tuple[int, ...]) -> None:
    """Flip 64 bytes inside the compressed chunk of ``dataset`` at ``index``."""
    import h5py

    with h5py.File(path, "r") as f:
        chunk = f[dataset].id.get_chunk_info_by_coord(index)
    data = bytearray(path.read_bytes())
    for k in range(chunk.size // 3, chunk.size // 3 + 64):
        data[chunk.byte_offset + k] ^= 0x5A
    path.write_bytes(bytes(data))


def _img_h5(folder: Path, rng: random.Random) -> Corpus:
    """qace's HDF5 store (its layout written directly: packing refuses bad boxes) with a damaged chunk,
    odd ids and out-of-range boxes."""
    import h5py

    from qace.data.features import HDF5_LAYOUT

    good_f, corners = _regions()
    cases = {**_box_cases(corners), "damaged": (corners, "error")}
    store = folder / "features.h5"
    with h5py.File(store, "w") as f:
        rows = [np.concatenate([good_f, _six(boxes)], axis=1) for boxes, _ in cases.values()]
        f.create_dataset("features", data=np.stack(rows).astype(np.float16), chunks=(1, 36, 2054),
                         compression="gzip", compression_opts=1, shuffle=True)  # fmt: skip
        f.create_dataset("ids", data=list(cases), dtype=h5py.string_dtype("utf-8"))
        f.attrs["layout"] = HDF5_LAYOUT
    _damage_chunk(store, "features", (list(cases).index("damaged"), 0, 0))
    images = {image: outcome for image, (_, outcome) in cases.items()}
    return _img_records(folder, rng, "img-h5", store, {**images, "absent": "error"})


def _img_vlt5(folder: Path, rng: random.Random) -> Corpus:
    """VL-T5's HDF5 layout with every fault that stopped a run (#37.2), odd ids and out-of-range boxes."""
    import h5py

    good_f, corners = _regions()
    cases = _box_cases(corners)
    store = folder / "vlt5.h5"
    pixels = np.array([W, H, W, H])
    with h5py.File(store, "w") as f:
        for image, (boxes, _) in cases.items():
            group = f.create_group(image)
            group["features"], group["boxes"], group["img_h"], group["img_w"] = good_f, boxes * pixels, H, W
        faults = {
            "damaged": {"features": None},
            "array-h": {"img_h": np.array([H, H])},
            "text-w": {"img_w": np.bytes_(b"wide")},
            "text-features": {"features": np.full((36, 2048), b"x")},
            "no-w": {"img_w": "drop"},
        }
        for image, change in faults.items():
            group = f.create_group(image)
            members = {"features": good_f, "boxes": corners * pixels, "img_h": H, "img_w": W, **change}
            for member, value in members.items():
                if member == "features" and value is None:
                    group.create_dataset(member, data=good_f, chunks=(36, 2048), compression="gzip")
                elif not (isinstance(value, str) and value == "drop"):
                    group[member] = value
        f["a-dataset"] = np.zeros(3)
    _damage_chunk(store, "damaged/features", (0, 0))
    images = {image: outcome for image, (_, outcome) in cases.items()}
    bad = dict.fromkeys([*faults, "a-dataset", "absent"], "error")
    return _img_records(folder, rng, "img-vlt5", store, {**images, **bad})


def _img_tsv(folder: Path, rng: random.Random) -> Corpus:
    """A bottom-up-attention TSV with odd ids, typed garbage and out-of-range boxes."""
    good_f, corners = _regions()
    cases = _box_cases(corners)
    pixels = np.array([W, H, W, H])

    def line(image: str, boxes: np.ndarray, width: str = str(W)) -> str:
        arrays = [(boxes * pixels).astype("<f4"), good_f.astype("<f4")]
        encoded = [base64.b64encode(array.tobytes()).decode() for array in arrays]
        return "\t".join([image, width, str(H), "36", *encoded])

    lines = [line(image, boxes) for image, (boxes, _) in cases.items()]
    lines += [line("inf-width", corners, width="inf"), line("text-width", corners, width="wide")]
    lines.append("\t".join(["garbage", str(W), str(H), "36", "not base64!", "AAAA"]))
    lines.append("\t".join(["short-row", "1", "2"]))
    store = folder / "features.tsv"
    store.write_text("\n".join(lines) + "\n")
    images = {image: outcome for image, (_, outcome) in cases.items()}
    bad = dict.fromkeys(["inf-width", "text-width", "garbage", "short-row", "absent"], "error")
    return _img_records(folder, rng, "img-tsv", store, {**images, **bad})
