"""The scorer registry: light to import, every built-in entry resolves, and a metric added with one module
and one entry (`tests.toy_scorer`) works through ``qace score``, ``--gpus`` shards and ``qace demo``
(Ray: tests/scale/test_scale_ray.py; the service: tests/serve/test_serve_scorers.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from qace import scorers
from qace.cli import main
from qace.data.records import Record, read_records
from qace.errors import ConfigError
from tests.toy_scorer import ENTRY, registered

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "qace" / "examples" / "captions.jsonl"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def _example_lengths() -> dict[str, float]:
    """The toy metric's score of every scorable example caption, counted here."""
    records = [r for r in read_records(EXAMPLE) if isinstance(r, Record) and r.caption.strip()]
    return {r.id: float(len(r.caption.split())) for r in records}


def test_importing_the_registry_imports_no_torch_and_no_judge() -> None:
    probe = (
        "import sys, qace.scorers\n"
        "print(sorted(m for m in sys.modules if m in ('torch', 'transformers', 'spacy', 'PIL')"
        " or m.startswith(('qace.judges', 'qace.api', 'qace.testing'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_every_built_in_entry_resolves_its_code() -> None:
    assert scorers.names()[:4] == ["qace-ref", "qace-img", "visce2", "regen"]
    for name in scorers.names():
        entry = scorers.get(name)
        paths = (entry.factory, entry.settings, entry.options, entry.demo, entry.reward)
        for path in filter(None, paths):
            assert callable(entry.load(path)), path
        assert entry.columns[0] == entry.score_key


def test_the_judges_entries_agree_with_their_modules() -> None:
    """The hints name the defaults the judges load, and the signature names are the judges' own."""
    from qace.config import VARIANT_NAMES
    from qace.judges import regen, visce2

    assert visce2.DEFAULT_VLM in (scorers.get("visce2").hint or "")
    assert regen.DEFAULT_GENERATOR in (scorers.get("regen").hint or "")
    assert regen.DEFAULT_IMAGE_ENCODER in (scorers.get("regen").hint or "")
    assert scorers.get("visce2").signature == visce2.METRIC_NAMES["visce2"]
    assert scorers.get("regen").signature == regen.METRIC_NAME
    for variant, name in VARIANT_NAMES.items():
        assert scorers.get(f"qace-{variant}").signature == name


def test_unknown_and_duplicate_names_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown metric 'bleu'; choose from qace-ref"):
        scorers.get("bleu")
    with pytest.raises(ConfigError, match="already registered"):
        scorers.register(scorers.get("visce2"))
    with registered(), pytest.raises(ConfigError, match="columns must start with the score key"):
        scorers.register(replace(ENTRY, name="other", columns=("x",)))
    assert "length" not in scorers.names()


def test_a_registered_metric_scores_through_qace_score(tmp_path, capsys) -> None:
    out = tmp_path / "length.jsonl"
    with registered():
        code = main(["score", str(EXAMPLE), "-o", str(out), "--metric", "length", "--no-progress"])
        assert code == 0
        assert main(["score", str(EXAMPLE), "-o", str(tmp_path / "v.jsonl"), "--metric", "length",
                     "--variant", "img"]) == 2  # fmt: skip
    printed = capsys.readouterr()
    want = _example_lengths()
    rows = _lines(out)
    assert {r["id"]: r["length"] for r in rows} == want
    assert rows[0]["signature"].startswith("Length|unit:words|version:")
    errors = _lines(tmp_path / "length.errors.jsonl")
    assert len(rows) + len(errors) == 12
    assert f"mean length {sum(want.values()) / len(want):.4f}" in printed.out
    assert "--variant is a QACE option" in printed.err


def test_a_registered_metric_scores_on_several_devices(tmp_path, monkeypatch) -> None:
    """``--gpus`` (here two CPU workers, fresh processes) builds the toy metric from its entry's strings;
    the merged output is byte for byte the single process's, its own option included."""
    import qace.scale.shards

    monkeypatch.setattr(qace.scale.shards, "resolve_devices", lambda gpus: ["cpu", "cpu"])
    base = ["score", str(EXAMPLE), "--metric", "length", "--length-unit", "chars", "--no-progress"]
    with registered():
        assert main([*base, "-o", str(tmp_path / "one.jsonl")]) == 0
        assert main([*base, "-o", str(tmp_path / "two.jsonl"), "--gpus", "2"]) == 0
    assert (tmp_path / "two.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    assert (tmp_path / "two.errors.jsonl").read_bytes() == (tmp_path / "one.errors.jsonl").read_bytes()
    assert "unit:chars" in _lines(tmp_path / "two.jsonl")[0]["signature"]


def test_a_registered_metric_runs_the_demo(tmp_path, capsys) -> None:
    with registered():
        assert main(["demo", "--metric", "length", "--output-dir", str(tmp_path)]) == 0
    assert "MEAN NOTHING" not in capsys.readouterr().err
    assert {r["id"]: r["length"] for r in _lines(tmp_path / "example.length.jsonl")} == _example_lengths()


def test_a_record_error_is_logged_with_its_line_once(tmp_path, caplog) -> None:
    """The warning for a record that cannot be scored names its line once, whether or not the reason
    (from the reader) already starts with it."""
    import logging

    from qace.scoring import score_file
    from tests.toy_scorer import CaptionLength

    data = tmp_path / "in.jsonl"
    data.write_text('{"id": "a", "caption": "two words"}\n{"id": "b", "caption": " "}\n')
    with caplog.at_level(logging.WARNING, logger="qace.scoring"):
        score_file(CaptionLength(progress=False), data, tmp_path / "out.jsonl")
    (message,) = [r.getMessage() for r in caplog.records if r.name == "qace.scoring"]
    assert message.startswith("record b: line 2: ") and message.count("line 2") == 1, message
