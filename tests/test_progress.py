"""Progress and logs of long work: a bar on a terminal, structured lines otherwise, --quiet, json logs."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from qace import progress
from qace.cli import main
from qace.progress import configure, track

EXAMPLES = Path(__file__).resolve().parents[1] / "qace" / "examples" / "captions.jsonl"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    """Put the library default (bars, text) and the root logger back after each test."""
    root = logging.getLogger()

    def own(handlers: list[logging.Handler]) -> list[logging.Handler]:  # pytest swaps its capture per phase
        return [h for h in handlers if not type(h).__module__.startswith("_pytest")]

    settings = progress._settings
    if settings.handler is not None:  # left by an earlier test's CLI run
        root.removeHandler(settings.handler)
        settings.handler = None
    level, handlers = root.level, own(root.handlers)
    yield
    settings.mode, settings.log_format, settings.interval_s = "bar", "text", 10.0
    if settings.handler is not None:
        root.removeHandler(settings.handler)
        settings.handler = None
    root.setLevel(level)
    assert own(root.handlers) == handlers


def test_the_mode_follows_the_stream() -> None:
    configure(stream=Terminal())
    assert progress.mode() == "bar" and progress.bars_shown()
    configure(stream=io.StringIO())
    assert progress.mode() == "lines" and not progress.bars_shown()
    configure(quiet=True, stream=Terminal())
    assert progress.mode() == "off"


def test_without_a_terminal_progress_is_structured_text_lines() -> None:
    out = io.StringIO()
    configure(stream=out, interval_s=0)
    with track("scoring", total=4) as bar:
        for _ in range(4):
            bar.update(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and all(line.startswith("INFO qace.progress: ") for line in lines)
    assert lines[0].split(": ", 1)[1].startswith("progress scoring: 1/4 captions (25%), ")
    assert "captions/s, ETA " in lines[0]
    assert lines[-1].split(": ", 1)[1].startswith("done scoring: 4/4 captions (100%), ")


def test_json_log_format_parses_with_the_progress_numbers() -> None:
    out = io.StringIO()
    configure(stream=out, log_format="json", interval_s=0)
    logging.getLogger("qace.test").warning("careful")
    with track("packing", total=3, unit="image") as bar:
        bar.update(2)
        bar.update(1)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert records[0]["level"] == "WARNING" and records[0]["message"] == "careful"
    events = [(r["event"], r["task"], r["done"], r["total"], r["unit"]) for r in records[1:]]
    assert events == [("progress", "packing", 2, 3, "image"), ("progress", "packing", 3, 3, "image"),
                      ("done", "packing", 3, 3, "image")]  # fmt: skip
    assert records[1]["rate"] > 0 and records[1]["eta_s"] is not None and records[-1]["time"].endswith("Z")


def test_quiet_prints_nothing(capsys) -> None:
    out = io.StringIO()
    configure(quiet=True, stream=out, interval_s=0)
    with track("scoring", total=2) as bar:
        bar.update(2)
    logging.getLogger("qace.test").info("chatter")
    progress.summary("scored 2 captions", scored=2)
    assert out.getvalue() == "" and capsys.readouterr().out == ""


def test_lines_are_throttled() -> None:
    out = io.StringIO()
    configure(stream=out, interval_s=3600)
    with track("scoring") as bar:
        bar.update(5)
        bar.update(5)
    assert out.getvalue().splitlines() == [out.getvalue().splitlines()[0]]  # only the closing line
    assert "done scoring: 10 captions, " in out.getvalue()


def _score(test_models_dir: Path, tmp_path: Path, *flags: str) -> int:
    out = tmp_path / "out.jsonl"
    return main(["score", str(EXAMPLES), "--models", str(test_models_dir), "-o", str(out), *flags])


def test_score_command_json_logs_progress_and_summary(test_models_dir: Path, tmp_path: Path, capsys) -> None:
    assert _score(test_models_dir, tmp_path, "--log-format", "json") == 0
    printed = capsys.readouterr()
    records = [json.loads(line) for line in printed.err.splitlines()]  # every line is a JSON object
    done = [r for r in records if r.get("event") == "done" and r["task"] == "scoring"]
    n = sum(1 for line in EXAMPLES.read_text().splitlines() if line.strip())
    assert len(done) == 1 and done[0]["done"] == done[0]["total"] == n
    assert any("MEAN NOTHING" in r["message"] for r in records if r["level"] == "WARNING")
    (summary,) = [json.loads(line) for line in printed.out.splitlines()]
    assert summary["event"] == "summary" and summary["scored"] + summary["errors"] == n
    assert summary["signature"].startswith("QACE-Ref")


def test_score_command_quiet_prints_no_progress_or_summary(
    test_models_dir: Path, tmp_path: Path, capsys
) -> None:
    assert _score(test_models_dir, tmp_path, "--quiet") == 0
    printed = capsys.readouterr()
    assert printed.out == ""
    no_progress = "progress scoring" not in printed.err and "done scoring" not in printed.err
    assert no_progress and "INFO" not in printed.err and "\r" not in printed.err  # warnings only
    assert (tmp_path / "out.jsonl").stat().st_size > 0


def test_options_work_before_the_command_name_too(test_models_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out.jsonl"
    assert main(["--quiet", "score", str(EXAMPLES), "--models", str(test_models_dir), "-o", str(out)]) == 0
    assert capsys.readouterr().out == ""


def test_shard_workers_report_progress_to_the_parent(
    test_models_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    from qace.scale import shards

    monkeypatch.setattr(shards, "PROGRESS_EVERY_S", 0.0)
    lines = EXAMPLES.read_text().splitlines()[:3]
    shard_input = tmp_path / "input-0.jsonl"
    shard_input.write_text("\n".join(json.dumps({"references": None, "image_id": None, **json.loads(x)})
                                     for x in lines) + "\n")  # fmt: skip
    job = shards.ShardJob(0, "cpu", str(shard_input), str(tmp_path / "shard-0.jsonl"),
                          {"models": str(test_models_dir), "progress": False}, False)  # fmt: skip
    messages: list = []

    class Control:  # the worker's end of its connection to the parent, which says go at once
        send = staticmethod(messages.append)
        recv = staticmethod(lambda: shards.GO)

    shards._worker(job, Control())
    assert messages[:-1] == [1, 1, 1] and messages[-1]["scored"] + messages[-1]["errors"] == 3


def test_features_extract_reports_progress_like_score(tmp_path: Path, capsys) -> None:
    """`qace features extract` goes through the same progress display: JSON lines with --log-format json."""
    import numpy as np
    from PIL import Image

    from qace.testing.detector import make_test_detector

    images = tmp_path / "images"
    images.mkdir()
    for i in range(3):
        pixels = np.random.default_rng(i).integers(0, 255, (48, 64, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"{i}.png")
    detector = make_test_detector(tmp_path / "detector")
    args = ["features", "extract", str(images), "-o", str(tmp_path / "f.h5"), "--detector", str(detector)]
    assert main(["--log-format", "json", *args, "--detector-workers", "0"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    done = [r for r in records if r.get("event") == "done" and r["task"] == "extracting features"]
    assert len(done) == 1 and done[0]["done"] == done[0]["total"] == 3
