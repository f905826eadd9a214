"""Readers: every format, every bad-input case yields a RecordError and the rest still come through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from qace.data.records import (
    Record,
    RecordError,
    _parse_line,
    detect_format,
    load_references,
    read_records,
    require,
)
from qace.errors import InputError

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _write_lines(path: Path, lines: list[bytes | str]) -> Path:
    path.write_bytes(b"".join((x.encode() if isinstance(x, str) else x) + b"\n" for x in lines))
    return path


def _by_id(items: list[Record | RecordError]) -> dict[str, Record | RecordError]:
    return {item.id: item for item in items}


def test_jsonl_good_records_in_order(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "in.jsonl",
        [
            json.dumps({"id": "a", "caption": "A dog.", "image_id": "1.jpg", "references": ["A dog runs."]}),
            "",
            json.dumps({"id": "b", "caption": "A cat."}),
            json.dumps({"id": 7, "caption": "Integer ids are accepted.", "image_id": 42}),
        ],
    )
    items = list(read_records(path))
    assert items == [
        Record("a", "A dog.", "1.jpg", ("A dog runs.",)),
        Record("b", "A cat."),
        Record("7", "Integer ids are accepted.", "42"),
    ]


BAD_JSONL: list[tuple[bytes | str, str | None, str]] = [  # (line, id of its error, reason)
    ('{"id": "m1", "caption": ', None, "malformed JSON"),
    (b'{"id": "u1", "caption": "caf\xe9 au lait"}', "u1", "non-UTF-8"),
    (b'{"caption": "caf\xe9", "id"', None, "non-UTF-8"),
    ('["not", "an", "object"]', None, "expected a JSON object"),
    ('{"id": "c1"}', "c1", "missing caption"),
    ('{"id": "c2", "caption": 5}', "c2", "caption must be a string"),
    ('{"id": "c3", "caption": ""}', "c3", "empty"),
    ('{"id": "c4", "caption": " \\t "}', "c4", "whitespace-only"),
    ('{"id": "r1", "caption": "x", "references": "one ref"}', "r1", "references must be a list of strings"),
    ('{"id": "r2", "caption": "x", "references": ["ok", 3]}', "r2", "references must be a list of strings"),
    ('{"id": "r3", "caption": "x", "references": ["ok", "  "]}', "r3", "empty string"),
    ('{"id": "r4", "caption": "x", "references": []}', "r4", "empty list"),
    ('{"caption": "no id"}', None, "line 14: missing id"),
    ('{"id": "good", "caption": "duplicate of this id follows"}', "", ""),
    ('{"id": "i1", "caption": "x", "image_id": [1]}', "i1", "image_id must be"),
    ("[" * 100_000, None, "too deeply nested"),
    ('{"id": ' + "7" * 5000 + ', "caption": "x"}', None, "a number of more than 4300 digits; write such"),
    ('{"id": "t1", "caption": "a\x01b"}', None, "(Invalid control character at column 27)"),
]


def test_jsonl_bad_inputs_each_named_and_reading_continues(tmp_path: Path) -> None:
    lines: list[bytes | str] = ['{"id": "first", "caption": "A first caption."}']
    lines += [line for line, _, _ in BAD_JSONL]
    lines += [
        '{"id": "good", "caption": "second one is the error"}',
        json.dumps({"id": "long", "caption": "word " * 50_000}),
        '{"id": "last", "caption": "A last caption."}',
    ]
    items = list(read_records(_write_lines(tmp_path / "in.jsonl", lines)))
    errors = [item for item in items if isinstance(item, RecordError)]
    records = [item for item in items if isinstance(item, Record)]
    assert [r.id for r in records] == ["first", "good", "long", "last"]  # long caption is not an error
    expected = [(rid, n, reason) for n, (_, rid, reason) in enumerate(BAD_JSONL, start=2) if rid != ""]
    expected.append(("good", len(lines) - 2, "duplicate id 'good'"))
    assert len(errors) == len(expected)
    for error, (rid, line, reason) in zip(errors, expected, strict=True):
        assert (error.id, error.line) == (rid, line)  # an unreadable id stays None: lines are no ids
        assert reason in error.reason
    # errors name their physical line
    assert errors[0].reason.startswith("line 2:")
    assert errors[-1].reason.startswith("line 20:") and "first on line 15" in errors[-1].reason


def test_csv_references_json_column(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text(
        "id,image_id,caption,references\n"
        'a,1.jpg,"A dog, running.","[""A dog runs."", ""A brown dog.""]"\n'
        "b,,A cat.,\n"
        'c,2.jpg,A bird.,"not json"\n'
        'd,2.jpg,,"[]"\n'
        'e,3.jpg,"multi\nline caption","[""r""]"\n'
        ",3.jpg,no id,\n"
        "a,4.jpg,duplicate,\n",
        encoding="utf-8",
    )
    items = list(read_records(path))
    assert items[0] == Record("a", "A dog, running.", "1.jpg", ("A dog runs.", "A brown dog."))
    assert items[1] == Record("b", "A cat.")
    assert isinstance(items[2], RecordError) and items[2].id == "c" and "JSON list" in items[2].reason
    assert isinstance(items[3], RecordError) and items[3].id == "d" and "empty" in items[3].reason
    assert items[4] == Record("e", "multi\nline caption", "3.jpg", ("r",))
    assert items[5] == RecordError(None, "line 8: missing id", 8)
    assert items[6] == RecordError("a", "line 9: duplicate id 'a' (first on line 2)", 9)


def test_csv_numbered_reference_columns_and_bad_bytes(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "in.csv",
        [
            "\ufeffid,caption,image_id,reference_1,reference_2,ref3",
            "a,A dog.,1.jpg,r1,,r3",
            b"b,caf\xe9,1.jpg,r1,r2,r3",
            "c,x,1.jpg,r1,r2,r3,extra",
            "d,   ,1.jpg,r1,,",
            "e,A cat.,2.jpg,,,",
        ],
    )
    items = _by_id(list(read_records(path)))
    assert items["a"] == Record("a", "A dog.", "1.jpg", ("r1", "r3"))
    assert isinstance(items["b"], RecordError) and "non-UTF-8" in items["b"].reason
    assert isinstance(items["c"], RecordError) and "7 cells but 6 columns" in items["c"].reason
    assert isinstance(items["d"], RecordError) and "whitespace-only" in items["d"].reason
    assert items["e"] == Record("e", "A cat.", "2.jpg", None)


def test_csv_long_caption_is_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text("id,caption\nlong," + "w" * 300_000 + "\nnext,ok\n", encoding="utf-8")
    items = list(read_records(path))
    assert [type(i) for i in items] == [Record, Record]
    assert isinstance(items[0], Record) and len(items[0].caption) == 300_000


def test_coco_results_with_annotation_references(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(
        json.dumps(
            [
                {"image_id": 1, "caption": "A dog."},
                {"image_id": 2, "caption": ""},
                "junk",
                {"image_id": 9, "caption": "No refs for this image."},
                {"image_id": 2, "caption": "A cat."},
            ]
        )
    )
    annotations = tmp_path / "captions_val.json"
    anns = [
        {"image_id": 1, "caption": "r1"},
        {"image_id": 2, "caption": "s1"},
        {"image_id": 1, "caption": "r2"},
        {"image_id": 1, "caption": "r1"},
    ]
    annotations.write_text(json.dumps({"images": [], "annotations": anns}))
    items = list(read_records(results, references=annotations))
    assert items[0] == Record("0", "A dog.", "1", ("r1", "r2"))
    assert isinstance(items[1], RecordError) and items[1].id == "1" and "empty" in items[1].reason
    assert isinstance(items[2], RecordError) and items[2].id == "2" and "JSON object" in items[2].reason
    assert items[3] == Record("3", "No refs for this image.", "9", None)
    assert items[4] == Record("4", "A cat.", "2", ("s1",))


def test_jsonl_gets_references_from_file_by_image_id(tmp_path: Path) -> None:
    refs = tmp_path / "refs.json"
    refs.write_text(
        json.dumps([{"image_id": "1.jpg", "caption": "r"}, {"image_id": "1.jpg", "caption": "r"}])
    )
    path = _write_lines(
        tmp_path / "in.jsonl",
        [
            '{"id": "a", "caption": "x", "image_id": "1.jpg"}',
            '{"id": "b", "caption": "y", "references": ["own"]}',
        ],
    )
    assert list(read_records(path, references=refs)) == [
        Record("a", "x", "1.jpg", ("r",)),
        Record("b", "y", None, ("own",)),
    ]


def test_unreadable_files_raise_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        list(read_records(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.json"
    bad.write_text("[{")
    with pytest.raises(InputError, match="cannot read COCO results"):
        list(read_records(bad))
    with pytest.raises(InputError, match="unknown input format"):
        list(read_records(bad, fmt="xml"))


def test_require() -> None:
    bare = Record("a", "x")
    assert require(bare, references=False, image=False) is None
    assert "references" in (require(bare, references=True, image=False) or "")
    assert "image_id" in (require(bare, references=False, image=True) or "")
    assert require(Record("a", "x", "1", ("r",)), references=True, image=True) is None


def test_flickr8k_expert_release_files() -> None:
    if not SHARED.is_dir():
        pytest.skip(f"shared data folder {SHARED} is absent")
    base = SHARED / "flickr8k_expert"
    items = list(read_records(base / "candidates.json", references=base / "refs.json"))
    assert len(items) == 5822 and all(isinstance(i, Record) for i in items)
    counts = sorted(len(i.references or ()) for i in items if isinstance(i, Record))
    assert counts[0] == 4 and counts[-1] == 5


def test_image_paths_resolve_against_the_input_folder(tmp_path: Path) -> None:
    data = tmp_path / "set"
    data.mkdir()
    elsewhere = tmp_path / "abs.png"
    (data / "in.jsonl").write_text(
        json.dumps({"id": "a", "caption": "a dog", "image": "imgs/1.jpg"})
        + "\n"
        + json.dumps({"id": "b", "caption": "a cat", "image": str(elsewhere)})
        + "\n"
        + json.dumps({"id": "c", "caption": "a cow", "image": 7})
        + "\n"
    )
    (data / "in.csv").write_text("id,caption,image\nd,a bird,2.png\n")
    a, b, c = read_records(data / "in.jsonl")
    assert isinstance(a, Record) and a.image == str(data / "imgs" / "1.jpg")
    assert isinstance(b, Record) and b.image == str(elsewhere)
    assert isinstance(c, RecordError) and c.id == "c" and "image must be a file path" in c.reason
    (d,) = read_records(data / "in.csv")
    assert isinstance(d, Record) and d.image == str(data / "2.png") and d.image_id is None


def test_csv_unclosed_quote_lists_every_swallowed_row(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text(
        "id,caption\n"
        'a,"an unclosed caption\n'  # line 2: the quote swallows lines 3-5
        "b,second\n"
        "c,third\n"
        'd,"fourth"\n'
        "e,fifth\n"
        'f,"He said ""hi"" twice"\n'  # doubled quotes inside quotes are fine
        'g,"a caption\nover two lines"\n'  # a quoted line break is fine
        'h,"open to the end\n'
        "i,last\n",
        encoding="utf-8",
    )
    items = list(read_records(path))
    errors = {item.line: item for item in items if isinstance(item, RecordError)}
    records = [item for item in items if isinstance(item, Record)]
    assert [(r.id, r.line) for r in records] == [("e", 6), ("f", 7), ("g", 8)]
    assert records[1].caption == 'He said "hi" twice'
    assert sorted(errors) == [2, 3, 4, 5, 10, 11]  # every physical row is scored or listed
    assert errors[2].id == "a" and "runs to line 5" in errors[2].reason and "(3, 4, 5)" in errors[2].reason
    assert all(errors[n].id is None and "quote left open on line 2" in errors[n].reason for n in (3, 4, 5))
    assert errors[10].id == "h" and "never closed" in errors[10].reason
    assert "quote left open on line 10" in errors[11].reason


def test_csv_stray_quotes_are_errors_naming_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "in.csv"
    path.write_text(
        'id,caption\na,The "big dog runs\nb,"quoted" then text\nc,fine caption\n', encoding="utf-8"
    )
    a, b, c = read_records(path)
    assert isinstance(a, RecordError) and a.id == "a" and "quote inside an unquoted field" in a.reason
    assert isinstance(b, RecordError) and b.id == "b" and "text after a closing quote" in b.reason
    assert c == Record("c", "fine caption")


def test_ids_like_line_labels_never_clash_with_unreadable_lines(tmp_path: Path) -> None:
    """A real id "line 3" and the unreadable line 3 are two records: neither is a duplicate."""
    path = _write_lines(
        tmp_path / "in.jsonl",
        [
            json.dumps({"id": "line 3", "caption": "a real record named like a line"}),
            json.dumps({"id": "x", "caption": "ok"}),
            '{"id": broken',
            json.dumps({"id": "line 5", "caption": "comes after the bad line 5"}),
            "{not json either",
        ],
    )
    items = list(read_records(path))
    assert [(type(i).__name__, i.id, i.line) for i in items] == [
        ("Record", "line 3", 1),
        ("Record", "x", 2),
        ("RecordError", None, 3),
        ("Record", "line 5", 4),
        ("RecordError", None, 5),
    ]


def test_parquet_input_rows_are_records_or_errors(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    table = pa.table(
        {
            "id": ["a", None, "c", "a", "e"],
            "caption": ["A dog.", "no id", "", "dup", "A cat."],
            "references": ['["r1", "r2"]', None, None, None, "not json"],
        }
    )
    pq.write_table(table, path)
    items = list(read_records(path))
    assert items[0] == Record("a", "A dog.", None, ("r1", "r2"))
    assert [(type(i).__name__, i.id, i.line) for i in items[1:]] == [
        ("RecordError", None, 2),
        ("RecordError", "c", 3),
        ("RecordError", "a", 4),
        ("RecordError", "e", 5),
    ]
    assert isinstance(items[3], RecordError) and "duplicate id 'a'" in items[3].reason
    with pytest.raises(InputError, match="no 'caption' column"):
        pq.write_table(pa.table({"id": ["a"]}), tmp_path / "bare.parquet")
        list(read_records(tmp_path / "bare.parquet"))


@pytest.mark.parametrize(
    "text",
    [
        '{"id": "a"}',
        '{"id": "a"}\r\n',
        '{"id": "a"} \t\n',
        '{"id": "a"}\x0c',  # not JSON whitespace: extra data
        '{"id": "a"}\xa0',
        '{"id": "a"} x',
        '{"id": "a"}{"id": "b"}',
        '{"id": ',
        "{}",
        ' {"id": "a"}',
        '{"id": NaN, "x": [1, {"y": null}], "id": "b"}',
        '{"id": "\\ud800"}',
        "[1]",
        "{" * 100_000,
    ],
)
def test_jsonl_lines_parse_as_json_loads(text: str) -> None:
    def outcome(parse: Any) -> tuple[str, str]:
        try:
            return "ok", repr(parse(text))
        except ValueError as exc:  # JSONDecodeError included
            return type(exc).__name__, str(exc)
        except RecursionError:
            return "RecursionError", ""

    assert outcome(_parse_line) == outcome(json.loads)


LONE = "\ud800"  # an unpaired surrogate: valid JSON as the escape "\\ud800", no text


def _surrogate_errors(items: list[Record | RecordError]) -> dict[int | None, RecordError]:
    return {i.line: i for i in items if isinstance(i, RecordError) and "lone surrogate" in i.reason}


def test_lone_surrogates_are_errors_of_their_record_in_every_reader(tmp_path: Path) -> None:
    """#37.1: a lone surrogate in a caption, reference, id, image id or image path costs its record only,
    in JSONL, CSV (its JSON references column), COCO (and its references file) and Parquet."""
    good = {"id": "ok", "caption": "A dog runs.", "references": ["A dog."], "image_id": 5}
    bad = [
        {"id": "c", "caption": f"A dog {LONE} runs", "references": ["A dog."]},
        {"id": "r", "caption": "A dog.", "references": ["fine", f"a {LONE}"]},
        {"id": f"i{LONE}", "caption": "A dog.", "references": ["A dog."]},
        {"id": "m", "caption": "A dog.", "references": ["A dog."], "image_id": f"x{LONE}"},
        {"id": "p", "caption": "A dog.", "references": ["A dog."], "image": f"{LONE}.jpg"},
    ]
    path = _write_lines(tmp_path / "in.jsonl", [json.dumps(r) for r in [good, *bad]])
    items = list(read_records(path))
    assert items[0] == Record("ok", "A dog runs.", "5", ("A dog.",))
    errors = _surrogate_errors(items)
    assert sorted(errors) == [2, 3, 4, 5, 6]
    assert (
        errors[4].id is None
        and "line 4: id holds a lone surrogate (\\ud800 at character 2)" in errors[4].reason
    )
    assert [errors[n].reason.split(" holds")[0] for n in (2, 3, 5, 6)] == [
        "line 2: caption", "line 3: a reference", "line 5: image_id", "line 6: image"
    ]  # fmt: skip
    for error in errors.values():  # what the errors file holds must encode as UTF-8
        json.dumps({"id": error.id, "reason": error.reason}, ensure_ascii=False).encode("utf-8")

    csv_path = tmp_path / "in.csv"
    csv_path.write_text('id,caption,references\nok,A dog.,"[""a""]"\nr,A dog.,"[""\\ud800""]"\n')
    items = list(read_records(csv_path))
    assert isinstance(items[0], Record) and set(_surrogate_errors(items)) == {3}

    coco = tmp_path / "results.json"
    coco.write_text(json.dumps([{"image_id": 1, "caption": "A dog."}, {"image_id": 2, "caption": LONE}]))
    refs = tmp_path / "refs.json"
    refs.write_text(json.dumps([{"image_id": 1, "caption": "a"}, {"image_id": 2, "caption": "b"},
                                {"image_id": 1, "caption": f"c{LONE}"}]))  # fmt: skip
    items = list(read_records(coco, references=refs))
    assert set(_surrogate_errors(items)) == {1, 2}  # image 1's references hold one, result 2's caption
    assert "a reference holds" in items[0].reason  # type: ignore[union-attr]


def test_parquet_strings_that_are_not_utf8_cost_their_row_only(tmp_path: Path) -> None:
    """#37.1: a Parquet string column holding bytes that are not UTF-8 (a surrogate encoded as CESU-8,
    ``ed a0 80``) was the whole file's error; now it is its row's, and a JSON references string with an
    unpaired escape is its row's too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = pa.array([b"A dog.", b"A \xed\xa0\x80 dog.", b"A cat.", b"A cow."], type=pa.binary())
    captions = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # unchecked, as foreign writers do
    refs = ['["a"]', '["a"]', '["\\ud800"]', '["a"]']
    pq.write_table(
        pa.table({"id": ["a", "b", "c", "d"], "caption": captions, "references": refs}),
        tmp_path / "in.parquet",
    )
    items = list(read_records(tmp_path / "in.parquet"))
    assert [type(i).__name__ for i in items] == ["Record", "RecordError", "RecordError", "Record"]
    assert items[1] == RecordError("b", "row 2: non-UTF-8 bytes in caption", 2)
    assert "a reference holds a lone surrogate" in items[2].reason  # type: ignore[union-attr]
    assert items[3] == Record("d", "A cow.", None, ("a",))


def test_require_names_a_lone_surrogate_in_what_the_variant_reads() -> None:
    """#37.1 through the list API (`QACE.score` checks every record with `require` and `caption_problem`)."""
    from qace.data.records import caption_problem

    assert "caption holds a lone surrogate" in str(caption_problem(f"a {LONE} b"))
    refs = Record("x", "A dog.", None, ("a", f"b{LONE}"))
    assert "a reference holds" in str(require(refs, references=True, image=False))
    image = Record("x", "A dog.", f"7{LONE}")
    assert "image_id holds" in str(require(image, references=False, image=True))


def test_an_integer_image_id_comes_back_as_an_integer(tmp_path: Path) -> None:
    """#37.8: records keep ``image_id`` as a string for lookups and give an integer back as one."""
    lines = [
        '{"id": "a", "caption": "x", "image_id": 184613}',
        '{"id": "b", "caption": "x", "image_id": "184613"}',
    ]
    path = _write_lines(tmp_path / "in.jsonl", list(lines))
    first, second = read_records(path)
    assert isinstance(first, Record) and isinstance(second, Record)
    assert (first.image_id, first.image_id_value) == ("184613", 184613)
    assert (second.image_id, second.image_id_value) == ("184613", "184613")


def test_json_and_json_lines_are_told_by_content(tmp_path: Path) -> None:
    entries = [{"image_id": 1, "caption": "a dog"}, {"image_id": 1, "caption": "a brown dog"}]
    lines = tmp_path / "refs.json"  # JSON lines under a .json name
    lines.write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert load_references(lines) == {"1": ("a dog", "a brown dog")}
    one_line = tmp_path / "annotations.jsonl"  # a COCO annotations file on one line
    one_line.write_text(json.dumps({"annotations": entries}))
    assert load_references(one_line) == {"1": ("a dog", "a brown dog")}
    with pytest.raises(InputError, match="cannot read references file"):
        load_references(lines, fmt="json")  # the override rules
    results = tmp_path / "results.jsonl"  # a COCO results array under a .jsonl name
    results.write_text(json.dumps([{"image_id": 1, "caption": "a dog"}], indent=1))
    assert detect_format(results) == "coco"
    assert [r.id for r in read_records(results, references=lines)] == ["0"]
