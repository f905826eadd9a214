"""``qace score --metric`` and ``qace demo --metric`` as a user runs them, on the bundled example."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("PIL")

from qace.cli import main  # noqa: E402
from qace.config import parse_signature  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "qace" / "examples" / "captions.jsonl"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def test_score_metric_visce2_scores_the_bundled_example(test_vlm_dir, tmp_path, capsys):
    out = tmp_path / "v.jsonl"
    argv = ["score", str(EXAMPLE), "-o", str(out), "--metric", "visce2", "--vlm", str(test_vlm_dir)]
    code = main([*argv, "--visce2-context-tokens", "16", "--visce2-expected", "--explain", "--no-progress"])
    assert code == 0
    printed = capsys.readouterr()
    assert "MEAN NOTHING" in printed.err and "--vlm" in printed.err
    rows = _lines(out)
    errors = _lines(tmp_path / "v.errors.jsonl")
    assert len(rows) + len(errors) == 12
    assert any(e["id"] == "ex04" and "empty" in e["reason"] for e in errors)
    assert all(e["reason"].startswith(("line 4", "no rating")) for e in errors)
    assert rows and all(
        {"visce2", "visce2_expected", "visce2_raw", "context", "signature"} <= r.keys() for r in rows
    )
    fields = parse_signature(rows[0]["signature"])
    assert fields["metric"] == "VisCE2" and fields["ctx"] == "16" and fields["exp"] == "yes"
    assert f"signature: {rows[0]['signature']}" in printed.out


def test_score_metric_visce2_reports_missing_images_per_record(test_vlm_dir, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(EXAMPLE.parent / "images", images)
    (images / "dog.png").unlink()
    (images / "bike.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    source = tmp_path / "captions.jsonl"
    shutil.copy(EXAMPLE, source)
    out = tmp_path / "v.jsonl"
    argv = ["score", str(source), "-o", str(out), "--metric", "visce2", "--vlm", str(test_vlm_dir)]
    assert main([*argv, "--visce2-variant", "vanilla", "--no-progress"]) == 0
    errors = {e["id"]: e["reason"] for e in _lines(tmp_path / "v.errors.jsonl")}
    for record in ("ex05", "ex06", "ex07"):
        assert "dog.png" in errors[record] and "does not exist" in errors[record]
    for record in ("ex08", "ex09"):
        assert "bike.png" in errors[record]
    assert {r["id"] for r in _lines(out)} <= {"ex01", "ex02", "ex03", "ex10", "ex11", "ex12"}


def test_metric_qace_ref_is_variant_ref(test_models_dir, tmp_path):
    outputs = []
    for flags in (["--variant", "ref"], ["--metric", "qace-ref"], []):
        out = tmp_path / f"out{len(outputs)}.jsonl"
        argv = ["score", str(EXAMPLE), "-o", str(out), "--models", str(test_models_dir), "--no-progress"]
        assert main([*argv, *flags]) == 0
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    assert parse_signature(json.loads(outputs[0].splitlines()[0])["signature"])["metric"] == "QACE-Ref"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--metric", "qace-img", "--variant", "ref"], "contradicts"),
        (["--metric", "visce2", "--variant", "img"], "QACE option"),
        (["--metric", "visce2", "--precision", "int8"], "precision"),
    ],
)
def test_contradictory_metric_options_exit_with_a_clear_message(flags, message, tmp_path, capsys):
    argv = ["score", str(EXAMPLE), "-o", str(tmp_path / "o.jsonl"), "--vlm", str(tmp_path / "none"), *flags]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_a_judge_that_cannot_be_imported_is_a_clear_error(tmp_path, capsys):
    from dataclasses import replace

    from qace import scorers

    missing = "qace.judges.not_installed_here"
    entry = replace(
        scorers.get("regen"),
        name="regen-missing",
        factory=f"{missing}:RegenScore",
        settings=f"{missing}:cli_settings",
        options=f"{missing}:add_cli_arguments",
    )
    scorers.register(entry)
    try:
        argv = ["score", str(EXAMPLE), "-o", str(tmp_path / "o.jsonl"), "--metric", "regen-missing"]
        assert main(argv) == 2
    finally:
        scorers.unregister("regen-missing")
    err = capsys.readouterr().err
    assert missing in err and "pip install 'qace[judges]'" in err


def test_demo_metric_visce2_uses_the_test_vlm_offline(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("QACE_TEST_MODELS", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert main(["demo", "--metric", "visce2", "--output-dir", str(tmp_path / "demo")]) == 0
    assert "HF_HUB_OFFLINE" not in os.environ  # set only while looking for the default VLM
    printed = capsys.readouterr()
    assert "MEAN NOTHING" in printed.err
    assert "visce2_expected" in printed.out and "A girl in a red dress" in printed.out
    rows = _lines(tmp_path / "demo" / "example.visce2.jsonl")
    assert rows and all(r["context"] for r in rows)
    assert (tmp_path / "home" / "visce2-vlm" / "vlm" / "config.json").is_file()


SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.mark.skipif(not (SHARED / "flickr8k_expert").is_dir(), reason="shared/data is not here")
def test_meta_export_with_images_gives_records_their_image_paths(tmp_path):
    from qace.data.records import read_records

    images = tmp_path / "flickr8k-images"
    images.mkdir()
    out = tmp_path / "flickr8k.jsonl"
    argv = ["meta", "export", "flickr8k", str(out), "--data-dir", str(SHARED), "--images", str(images)]
    assert main(argv) == 0
    first = next(read_records(out))
    assert first.image == str(images.resolve() / first.image_id)
    assert main([*argv[:-1], str(tmp_path / "nowhere")]) == 2


@pytest.mark.parametrize("metric", ["visce2", "regen"])
def test_judge_on_several_devices_writes_what_one_process_writes(metric, test_vlm_dir, tmp_path, monkeypatch):
    """``--gpus`` for a judge: shard workers (here two CPU processes) build the judge from the same
    options; the merged output equals a single-process run, errors included: byte for byte for VisCE²,
    and for the regeneration score up to fp32 rounding, which a shard's different batches change and
    the denoising loop amplifies (about 1e-5 here)."""
    import qace.scale.shards
    from qace.testing.regen import make_regen_test_models

    monkeypatch.setattr(qace.scale.shards, "resolve_devices", lambda gpus: ["cpu", "cpu"])
    if metric == "visce2":
        options = ["--vlm", str(test_vlm_dir), "--visce2-context-tokens", "16"]
    else:
        models = make_regen_test_models(REPO_ROOT / ".qace-cache" / "regen-test-models")
        options = ["--generator", str(models / "generator"), "--image-encoder", str(models / "encoder")]
        options += ["--regen-size", "32", "--regen-steps", "2"]
    base = ["score", str(EXAMPLE), "--metric", metric, *options, "--no-progress"]
    assert main([*base, "-o", str(tmp_path / "one.jsonl")]) == 0
    assert main([*base, "-o", str(tmp_path / "two.jsonl"), "--gpus", "2"]) == 0
    assert (tmp_path / "two.errors.jsonl").read_bytes() == (tmp_path / "one.errors.jsonl").read_bytes()
    if metric == "visce2":
        assert (tmp_path / "two.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
        return
    one, two = _lines(tmp_path / "one.jsonl"), _lines(tmp_path / "two.jsonl")
    assert [r["id"] for r in two] == [r["id"] for r in one] and len(one) == 11
    for a, b in zip(one, two, strict=True):
        assert {k: v for k, v in a.items() if k != "regen"} == {k: v for k, v in b.items() if k != "regen"}
        assert b["regen"] == pytest.approx(a["regen"], abs=1e-4)
