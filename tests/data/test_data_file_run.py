"""File runs with inputs that used to stop or corrupt them: huge captions, ids that look like line
labels, and a resumed run over an input that changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qace.api import QACE
from qace.cli import main
from qace.data.output import ResultWriter

REFS = ["a girl runs along the sand", "a young girl on the beach"]


def _write(path: Path, records: list[dict | str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _score(models: Path, source: Path, out: Path, *extra: str) -> int:
    return main(["score", str(source), "-o", str(out), "--models", str(models), "--no-progress", *extra])


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open(encoding="utf-8")]


def test_caption_over_spacy_max_length_is_a_record_error(test_models_dir, tmp_path, capsys) -> None:
    """A 1.2 MB caption (spaCy's E088 used to end the run) is an error of its record only."""
    source = _write(
        tmp_path / "in.jsonl",
        [
            {"id": "huge", "caption": "a dog " * 200_000, "references": REFS},
            {"id": "ok", "caption": "a girl on the beach", "references": REFS},
        ],
    )
    assert _score(test_models_dir, source, tmp_path / "out.jsonl") == 0
    assert "scored 1 captions (1 errors" in capsys.readouterr().out
    assert [row["id"] for row in _lines(tmp_path / "out.jsonl")] == ["ok"]
    (error,) = _lines(tmp_path / "out.errors.jsonl")
    assert error == {"id": "huge", "line": 1, "reason": "caption has 1200000 characters; the limit is 100000"}


def test_ids_that_look_like_line_labels_are_scored_beside_unreadable_lines(
    test_models_dir, tmp_path, capsys
) -> None:
    """A real id "line 2" before the unreadable line 2, and a real "line 3" after the unreadable line 3:
    both are scored, both bad lines are listed by their line, and the run does not stop."""
    source = _write(
        tmp_path / "in.jsonl",
        [
            {"id": "line 2", "caption": "a girl on the beach", "references": REFS},
            '{"id": "broken',
            "{also broken",
            {"id": "line 3", "caption": "a dog in the park", "references": REFS},
        ],
    )
    assert _score(test_models_dir, source, tmp_path / "out.jsonl") == 0
    assert "scored 2 captions (2 errors" in capsys.readouterr().out
    assert [row["id"] for row in _lines(tmp_path / "out.jsonl")] == ["line 2", "line 3"]
    errors = _lines(tmp_path / "out.errors.jsonl")
    assert [(e["id"], e["line"]) for e in errors] == [(None, 2), (None, 3)]


RECORDS = [
    {"id": k, "caption": f"a girl with {n} dogs on the beach", "references": REFS}
    for n, k in enumerate("abcdefg")
]


def _killed_run(models: Path, source: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed after its first two committed chunks (records on lines 1-4)."""
    real = QACE.score_committed

    def dies_after_four(self, records):  # noqa: ANN001, ANN202
        for n, result in enumerate(real(self, records)):
            if n == 4:
                raise KeyboardInterrupt("killed")
            yield result

    monkeypatch.setattr(QACE, "score_committed", dies_after_four)
    with pytest.raises(KeyboardInterrupt):
        main(
            [
                "score",
                str(source),
                "-o",
                str(out),
                "--models",
                str(models),
                "--no-progress",
                "--chunk-size",
                "2",
            ]
        )
    monkeypatch.undo()


def test_resume_refuses_a_changed_input_naming_what_changed(test_models_dir, tmp_path, monkeypatch, capsys):
    source = _write(tmp_path / "in.jsonl", RECORDS)
    uninterrupted = tmp_path / "whole.jsonl"
    assert _score(test_models_dir, source, uninterrupted, "--chunk-size", "2") == 0
    out = tmp_path / "out.jsonl"
    _killed_run(test_models_dir, source, out, monkeypatch)
    capsys.readouterr()
    resume = ["--resume", "--chunk-size", "2"]

    changed = [dict(r) for r in RECORDS]
    changed[1]["caption"] = "every caption was changed"
    for records, message in [
        (changed, "line 2 (id 'b') changed since the partial output was written"),
        (["", *RECORDS], "input record 1 (id 'a') is on line 2 now but was on line 1"),
        ([{"id": "new", "caption": "x", "references": REFS}, *RECORDS], "line 1 held id 'a'"),
        ([RECORDS[0], {**RECORDS[2], "id": "z"}, *RECORDS[2:]], "line 2 held id 'b'"),
        (RECORDS[:3], "the input ends after 3 record(s)"),
    ]:
        _write(source, records)
        assert _score(test_models_dir, source, out, *resume) == 2
        assert message in capsys.readouterr().err
        assert not out.exists() and (tmp_path / "out.jsonl.partial").is_dir()  # nothing was mixed in

    _write(source, RECORDS)  # the same input again: the run completes as if never killed
    assert _score(test_models_dir, source, out, *resume) == 0
    assert "4 already done" in capsys.readouterr().out
    assert out.read_bytes() == uninterrupted.read_bytes()


def test_resume_of_an_output_without_fingerprint_needs_force(test_models_dir, tmp_path, capsys) -> None:
    source = _write(tmp_path / "in.jsonl", RECORDS[:3])
    out = tmp_path / "out.jsonl"
    scorer = QACE(models=test_models_dir, progress=False)
    older = ResultWriter(out, signature=scorer.signature, chunk_size=scorer.chunk_size)
    older.add_error("a", "written by an older qace")  # committed without an input fingerprint
    older.flush()
    assert _score(test_models_dir, source, out, "--resume") == 2
    assert "no fingerprint of its input" in capsys.readouterr().err
    assert _score(test_models_dir, source, out, "--resume", "--force") == 0
    assert "scored 2 captions (0 errors, 1 already done)" in capsys.readouterr().out
