"""`benchmarks.precision`: its comparison counts what differs, and a CPU run writes the record."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import precision


def _row(qace: float, questions: list[tuple[str, str, list[str]]]) -> dict:
    return {
        "qace": qace,
        "explanation": {
            "questions": [
                {"question": q, "answer_on_caption": a, "answers_on_context": ctx} for q, a, ctx in questions
            ]
        },
    }


def test_compare_counts_questions_answers_and_dqace() -> None:
    base = [_row(0.5, [("what?", "dog", ["dog", "cat"]), ("who?", "man", ["man"])])]
    half = [_row(0.75, [("what?", "dog", ["dog", "cow"]), ("who is?", "man", ["men"])])]
    result = precision.compare(half, base)
    assert result["questions_identical"] == 0.5
    assert result["answers_identical"] == 3 / 5
    assert result["max_abs_dqace"] == result["mean_abs_dqace"] == 0.25
    fewer = [_row(0.5, [("what?", "dog", ["dog", "cat"])])]  # a missing question counts as different
    assert precision.compare(fewer, base)["questions_identical"] == 0.5


def test_cpu_run_writes_the_record(test_models_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "precision.json"
    argv = ["--device", "cpu", "--captions", "4", "--variants", "ref", "--precisions", "bf16"]
    assert precision.main([*argv, "--models", str(test_models_dir), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python -m benchmarks.precision") and record["commit"]
    cell = record["results"]["ref"]
    assert cell["questions"] > 0 and cell["answers"] >= cell["questions"]
    assert 0 < cell["bf16"]["answers_identical"] <= 1 and cell["bf16"]["max_abs_dqace"] >= 0
