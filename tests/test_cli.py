"""The command line as a user runs it: bad lines go to the errors file, the rest is scored."""

from __future__ import annotations

import json

import pytest

from qace.cli import main


def test_score_command_reports_bad_lines_and_scores_the_rest(test_models_dir, tmp_path, capsys):
    good = {
        "id": "a",
        "image_id": "i",
        "caption": "a girl runs on the beach",
        "references": ["a girl on sand"],
    }
    lines = [
        json.dumps(good).encode(),
        b'{"id": "broken", "caption": ',
        json.dumps({**good, "id": "b"}).encode()[:-2] + b'\xff"}',
        json.dumps({**good, "id": "c", "references": []}).encode(),
        json.dumps({**good, "id": "a"}).encode(),
        json.dumps({**good, "id": "d"}).encode(),
    ]
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out.jsonl"
    code = main(["score", str(source), "--models", str(test_models_dir), "-o", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr()
    assert "scored 2 captions (4 errors" in printed.out
    assert "MEAN NOTHING" in printed.err
    assert [json.loads(line)["id"] for line in out.open()] == ["a", "d"]
    errors = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").open()]
    assert len(errors) == 4
    assert all(e["reason"] for e in errors)


def test_missing_models_exit_with_a_clear_message(tmp_path, capsys):
    code = main(
        [
            "score",
            str(tmp_path / "x.jsonl"),
            "--models",
            str(tmp_path / "none"),
            "-o",
            str(tmp_path / "o.jsonl"),
        ]
    )
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--version"]])
def test_version(args, capsys):
    with pytest.raises(SystemExit):
        main(args)
    assert "qace" in capsys.readouterr().out


def test_cli_works_without_an_optional_extra(monkeypatch, capsys):
    """Without Ray (an extra), `qace score-ray` is absent and every other command still parses."""
    import sys

    from qace.cli import build_parser

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert "score-ray" not in commands and {"score", "serve"} <= set(commands)
    assert parser.parse_args(["score", "in.jsonl", "-o", "out.jsonl"]).command == "score"
