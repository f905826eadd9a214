"""The fuzz corpus through `qace score`: every input record is scored exactly once or listed in the
errors file with its line and reason, and the run exits 0 with a summary (JSONL, CSV, COCO, Parquet
with lone surrogates and odd ids among them, and QACE-Img over every kind of feature store with
broken files, typed garbage, odd image ids and out-of-range boxes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qace.cli import main
from qace.data.output import errors_path
from tests.data.fuzz_corpus import BAD_PER_CORPUS, check_invariant, make_corpus


def score_corpus(corpus, models: Path, out: Path, capsys) -> tuple[list[str], list[dict]]:
    """Run `qace score` on ``corpus``; returns the scored ids and the errors file's entries."""
    argv = ["score", str(corpus.input), "-o", str(out), "--models", str(models), "--no-progress"]
    code = main([*argv, *corpus.args])
    printed = capsys.readouterr().out
    assert code == 0, printed
    if out.suffix == ".parquet":
        import pyarrow.parquet as pq

        ids = [str(i) for i in pq.read_table(out, columns=["id"]).column("id").to_pylist()]
    else:
        ids = [json.loads(line)["id"] for line in out.open(encoding="utf-8")]
    errors = [json.loads(line) for line in errors_path(out).open(encoding="utf-8")]
    assert f"scored {len(ids)} captions ({len(errors)} errors, 0 already done)" in printed
    return ids, errors


@pytest.mark.parametrize(
    ("fmt", "output"),
    [
        ("jsonl", "out.jsonl"),
        ("csv", "out.jsonl"),
        ("coco", "out.jsonl"),
        ("parquet", "out.parquet"),
        ("img", "out.jsonl"),
        ("img-vlt5", "out.jsonl"),
        ("img-tsv", "out.jsonl"),
    ],
)
def test_every_record_is_scored_once_or_listed(fmt, output, test_models_dir, tmp_path, capsys) -> None:
    corpus = make_corpus(tmp_path / "in", fmt, seed=18)
    assert corpus.count("error") >= BAD_PER_CORPUS and corpus.count("scored") >= 3
    ids, errors = score_corpus(corpus, test_models_dir, tmp_path / output, capsys)
    check_invariant(corpus, ids, errors)


@pytest.mark.parametrize("fmt", ["img", "img-h5"])
def test_corrupt_feature_files_are_per_record_errors(fmt, test_models_dir, tmp_path, capsys) -> None:
    """Truncated, bad-CRC and damaged-zlib .npz files, and an HDF5 store with a damaged chunk, cost
    their records, not the run."""
    corpus = make_corpus(tmp_path / "in", fmt, seed=18, corrupt_files=True)
    ids, errors = score_corpus(corpus, test_models_dir, tmp_path / "out.jsonl", capsys)
    check_invariant(corpus, ids, errors)
    kinds = {r.kind.split(": ")[-1] for r in corpus.records}
    assert {"truncated", "bad-crc", "bad-zlib"} <= kinds if fmt == "img" else "damaged" in kinds


def test_corpus_is_seeded_and_holds_every_kind(tmp_path) -> None:
    for fmt in ("jsonl", "csv", "coco", "parquet", "img", "img-h5", "img-vlt5", "img-tsv"):
        first = make_corpus(tmp_path / "a", fmt, seed=3)
        again = make_corpus(tmp_path / "b", fmt, seed=3)
        assert first.input.read_bytes() == again.input.read_bytes() and first.records == again.records
    kinds = {r.kind for r in make_corpus(tmp_path / "c", "jsonl", seed=3).records}
    assert {"broken JSON", "bad UTF-8 caption", "duplicate id", "missing references", "huge caption"} <= kinds
    kinds = {r.kind for r in make_corpus(tmp_path / "d", "csv", seed=3).records}
    assert {"unclosed quote", "swallowed row", "stray quote", "unclosed at the end"} <= kinds
    kinds = {r.kind for r in make_corpus(tmp_path / "e", "jsonl", seed=3).records}
    assert {"lone surrogate", "lone surrogate reference", "odd id", "integer image_id"} <= kinds
    kinds = {r.kind for r in make_corpus(tmp_path / "f", "parquet", seed=3).records}
    assert {"lone surrogate reference", "non-UTF-8 caption"} <= kinds
    for fmt, garbage in [("img", "text-features"), ("img-vlt5", "array-h"), ("img-tsv", "text-width")]:
        kinds = {r.kind for r in make_corpus(tmp_path / fmt, fmt, seed=3).records}
        assert {f"features: {k}" for k in ("box-left", "box-upside-down", "edge", "²", garbage)} <= kinds


def test_the_list_api_gives_a_lone_surrogate_its_own_error_row(test_models_dir) -> None:
    """#37.1: `QACE.score` on lists: a lone surrogate in a caption or a reference is that row's error."""
    from qace.api import QACE

    scorer = QACE(models=test_models_dir, progress=False)
    refs = [["a dog runs"], ["a dog runs", "a \ud800 dog"], ["a dog runs"]]
    rows = scorer.score(["a dog \udfff runs", "a dog runs", "a dog runs on grass"], references=refs)
    assert "caption holds a lone surrogate (\\udfff" in rows[0]["error"]
    assert "a reference holds a lone surrogate (\\ud800" in rows[1]["error"]
    assert "error" not in rows[2] and isinstance(rows[2]["qace"], float)
