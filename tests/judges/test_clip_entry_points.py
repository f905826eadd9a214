"""CLIP-S and friends through the entry points that take ``--metric``, on the tiny random CLIP: ``qace
score`` (images by path and by id), ``qace demo``, ``qace serve`` (CLIP-S as a reward) and ``qace
report``. ``--gpus`` and several metrics in one pass: tests/test_combined.py; ``score-ray``:
tests/scale/test_scale_ray.py; ``meta report --with-scorers``: tests/meta/test_meta_scorers.py; the
pycocoevalcap, torchmetrics and evaluate doors: tests/integrations/test_metric_doors.py."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytest.importorskip("PIL")

from qace import scorers  # noqa: E402
from qace.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "qace" / "examples" / "captions.jsonl"
TOKEN = "test-token-0123456789"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


@pytest.mark.parametrize("metric", ["clip-s", "refclip-s", "pac-s", "refpac-s"])
def test_qace_score_metric_scores_the_bundled_example(metric, clip_dir, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    argv = ["score", str(EXAMPLE), "-o", str(out), "--metric", metric, "--clip-model", str(clip_dir)]
    assert main([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr()
    entry = scorers.get(metric)
    rows, errors = _lines(out), _lines(tmp_path / "out.errors.jsonl")
    assert len(rows) == 11 and [e["id"] for e in errors] == ["ex04"]
    assert all(set(entry.columns) <= set(row) and row[entry.score_key] >= 0 for row in rows)
    assert rows[0]["signature"].startswith(entry.signature + "|clip:sha256-")
    assert "MEAN NOTHING" in printed.err and "--clip-model" in printed.err
    assert f"signature: {rows[0]['signature']}" in printed.out


def test_qace_score_finds_images_by_id_with_images(clip_dir, tmp_path):
    records = tmp_path / "by_id.jsonl"
    lines = [{k: v for k, v in json.loads(line).items() if k != "image"} for line in EXAMPLE.open()]
    records.write_text("".join(json.dumps(line) + "\n" for line in lines))
    base = ["--metric", "clip-s", "--clip-model", str(clip_dir), "--no-progress"]
    assert main(["score", str(EXAMPLE), "-o", str(tmp_path / "path.jsonl"), *base]) == 0
    images = str(EXAMPLE.parent / "images")
    assert main(["score", str(records), "-o", str(tmp_path / "id.jsonl"), *base, "--images", images]) == 0
    by_path = {r["id"]: r["clip_s"] for r in _lines(tmp_path / "path.jsonl")}
    assert {r["id"]: r["clip_s"] for r in _lines(tmp_path / "id.jsonl")} == by_path
    assert main(["score", str(records), "-o", str(tmp_path / "none.jsonl"), *base]) == 0
    reasons = [e["reason"] for e in _lines(tmp_path / "none.errors.jsonl")]
    assert sum("needs the image" in r and "--images" in r for r in reasons) == 11


def test_pac_s_without_its_checkpoint_is_refused_before_loading(tmp_path, capsys):
    assert main(["score", str(EXAMPLE), "-o", str(tmp_path / "p.jsonl"), "--metric", "pac-s"]) == 2
    assert "PAC-S checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("metric", ["clip-s", "refpac-s"])
def test_qace_demo_metric_runs_on_the_test_clip(metric, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QACE_TEST_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["demo", "--metric", metric, "--output-dir", str(tmp_path)]) == 0
    key = scorers.get(metric).score_key
    rows = _lines(tmp_path / f"example.{metric}.jsonl")
    assert len(rows) == 11 and all(row[key] >= 0 for row in rows)
    assert "MEAN NOTHING" in capsys.readouterr().err
    assert (tmp_path / f"example.{metric}.html").is_file()


def test_clip_s_serves_as_a_reward(clip_dir, monkeypatch):
    from fastapi.testclient import TestClient

    from qace.serve.app import create_app
    from qace.serve.cli import register

    seen: dict = {}
    monkeypatch.setattr("qace.serve.app.create_app", lambda reward, **k: seen.update(reward=reward, **k))
    monkeypatch.setattr("qace.serve.cli.serve", lambda *a, **k: None)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--metric", "clip-s", "--clip-model", str(clip_dir), "--token", TOKEN])
    assert args.func(args) == 0
    reward = seen["reward"]
    assert reward.reads == "image" and reward.signature.startswith("CLIP-S|")
    image = str(EXAMPLE.parent / "images" / "dog.png")
    items = [
        {"id": "a", "caption": "a dog jumps", "image": image},
        {"id": "b", "caption": "", "image": image},
    ]
    monkeypatch.undo()
    with TestClient(create_app(reward, token=TOKEN)) as client:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        got = client.post("/v1/reward", json={"request_id": "r", "items": items}, headers=auth).json()
    (want,) = reward.scorer.score(["a dog jumps"], images=[image])
    assert (
        got["results"][0]["reward"] == pytest.approx(want["clip_s"], abs=1e-7) and got["results"][0]["valid"]
    )
    assert not got["results"][1]["valid"]


def test_qace_report_shows_refclip_s_with_its_parts(clip_dir, tmp_path):
    from qace.report.load import load_system

    out = tmp_path / "refclip.jsonl"
    argv = ["score", str(EXAMPLE), "-o", str(out), "--metric", "refclip-s", "--clip-model", str(clip_dir)]
    assert main([*argv, "--no-progress"]) == 0
    system = load_system(out)
    assert system.score_key == "refclip_s" and system.components == ("clip_s", "clip_ref")
    assert main(["report", str(out), "--input", str(EXAMPLE)]) == 0
    assert "RefCLIP-S" in out.with_suffix(".html").read_text()
