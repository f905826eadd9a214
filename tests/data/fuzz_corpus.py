"""A seeded fuzz corpus: many malformed records of every kind, mixed with a few good ones.

`make_corpus(folder, fmt, seed=...)` writes one input file (``jsonl``, ``csv``, ``coco`` with its
references file, ``parquet``, ``img``: JSONL for QACE-Img with a directory of region features, or
``img-h5``: the same with an HDF5 feature store holding one damaged chunk) and returns a
`Corpus` that knows, for every input record, its line (JSONL/CSV: the physical line it
starts on; COCO/Parquet: its 1-based number), the id under which it may be scored, and what it must
become (``scored``, ``error``, or ``either`` for odd but valid records). `check_invariant` then
asserts the contract of a file run: every input record is scored exactly once or listed as an error
with its line and a reason.

Few records need model work (the good ones and the ``either`` ones), so a run over a corpus is
fast on the CPU with the tiny test models; the malformed ones are rejected before any model runs.
"""

from __future__ import annotations

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
    ]
    bad = [kinds[i % len(kinds)](i) for i in range(BAD_PER_CORPUS)]
    bad += [
        [("huge caption", None, "error", row(BAD_PER_CORPUS + k, caption=HUGE_CAPTION))] for k in range(2)
    ]
    odd = [
        [("control characters", "odd-0", "either", row(0, caption="a dog\x00\x07\x1b runs", rid="odd-0"))],
        [("quoted line break", "odd-1", "either", row(0, caption="a dog\non grass", rid="odd-1"))],
        [("line-like id", "line 5", "either", row(0, caption="a dog on grass", rid="line 5"))],
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
    import pyarrow as pa
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
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=300)
    return Corpus(path, [], records)


# -- QACE-Img: region features ----------------------------------------------------------------


def _img(folder: Path, rng: random.Random, *, corrupt_files: bool) -> Corpus:
    features = folder / "features"
    features.mkdir(exist_ok=True)
    gen = np.random.default_rng(0)
    good_f = gen.standard_normal((36, 2048)).astype(np.float16)
    good_b = gen.random((36, 6)).astype(np.float16)
    np.savez(features / "good.npz", features=good_f, norm_bb=good_b)
    nan_f = good_f.copy()
    nan_f[3, 5] = np.nan
    np.savez(features / "nan.npz", features=nan_f, norm_bb=good_b)
    inf_b = good_b.copy()
    inf_b[0, 0] = np.inf
    np.savez(features / "inf.npz", features=good_f, norm_bb=inf_b)
    np.savez(features / "misshaped.npz", features=good_f[:20], norm_bb=good_b[:20])
    np.savez(features / "nokey.npz", features=good_f)
    (features / "not-npz.npz").write_text("this is not a zip archive")
    bad_images = ["nan", "inf", "misshaped", "nokey", "not-npz", "absent"]
    if corrupt_files:
        bad_images += _corrupt_npz(features, good_f, good_b)
    kinds: list[Callable[[int], tuple]] = [
        lambda i: (f"features: {bad_images[i % len(bad_images)]}", bad_images[i % len(bad_images)]),
        lambda i: ("missing image_id", None),
    ]
    bad = _cycle(kinds, BAD_PER_CORPUS)
    entries = _mixed(rng, 3, bad)
    lines, records, good = [], [], 0
    for number, entry in enumerate(entries, start=1):
        if entry is None:
            record = {"id": f"good-{good}", "image_id": "good", "caption": rng.choice(CAPTIONS)}
            records.append(Expected(number, record["id"], "scored", "good"))
            good += 1
        else:
            kind, image = entry
            record = {"id": f"bad-{number}", "caption": "a dog"}
            if image is not None:
                record["image_id"] = image
            records.append(Expected(number, None, "error", kind))
        lines.append(json.dumps(record))
    path = folder / "fuzz-img.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return Corpus(path, ["--variant", "img", "--features", str(features)], records)


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


def _img_h5(folder: Path, rng: random.Random) -> Corpus:
    """QACE-Img records over an HDF5 store whose ``damaged`` image has a corrupt compressed chunk."""
    import h5py

    from qace.data.features import pack_features

    gen = np.random.default_rng(1)
    arrays = [(name, gen.random((36, 2054)).astype(np.float32)) for name in ("good", "damaged", "good-too")]
    store = folder / "features.h5"
    pack_features(arrays, store, progress=False)
    with h5py.File(store, "r") as f:
        chunk = f["features"].id.get_chunk_info(1)  # the chunk of row 1, "damaged"
    data = bytearray(store.read_bytes())
    for k in range(chunk.size // 3, chunk.size // 3 + 64):
        data[chunk.byte_offset + k] ^= 0x5A
    store.write_bytes(bytes(data))
    # image ids: "damaged" (corrupt chunk), "absent" (not in the store), "" (no image_id); None: good
    entries = _mixed(rng, 3, ["damaged", "absent", ""] * (BAD_PER_CORPUS // 3 + 1))
    lines, records = [], []
    for number, image in enumerate(entries, start=1):
        record = {"id": f"r-{number}", "caption": "a dog on the grass", "image_id": image or "good"}
        if image == "":
            del record["image_id"]
        lines.append(json.dumps(record))
        good = image is None
        records.append(
            Expected(number, record["id"] if good else None, "scored" if good else "error", str(image))
        )
    path = folder / "fuzz-img-h5.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return Corpus(path, ["--variant", "img", "--features", str(store)], records)
