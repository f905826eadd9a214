"""Parity: the whole metric on ONNX Runtime (fp32) asks and answers exactly what the PyTorch path does.

Engine-torch vs engine-onnx through the public API (``QACE(..., backend="onnx")``) on Flickr8k-Expert
captions with the tiny trained test models; exports are made on first use and cached next to them.
Questions and answers must be identical; answerability (and so the scores) may differ by float32
rounding between ONNX Runtime's and PyTorch's kernels (measured: under 2e-6), hence ``1e-5``.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from qace.api import QACE
from qace.cli import main as cli_main
from qace.data.features import RandomFeatureStore
from qace.export.cache import ensure_export, is_current
from qace.models.loading import checkpoint_fingerprint, load_seq2seq
from qace.onnx_format import FORMAT_VERSION
from tests.helpers import flickr_records

N_CAPTIONS = 100
SCORES = ("qace", "qace_f1", "qace_bs", "qace_an", "qace_max")


def _rows(test_models_dir, backend, variant, records):
    extra = {"features": RandomFeatureStore(seed=0)} if variant == "img" else {}
    scorer = QACE(
        models=test_models_dir,
        variant=variant,
        backend=backend,
        explain=True,
        progress=False,
        max_batch_rows=48,
        **extra,
    )
    return scorer.signature, list(scorer.score_records(records))


def _evidence(row):
    return [
        (q["question"], q["answer_on_caption"], q["answers_on_context"])
        for q in row["explanation"]["questions"]
    ]


@pytest.mark.parametrize(("variant", "refs"), [("ref", 5), ("img", 1)])
def test_onnx_engine_equals_torch_engine(test_models_dir, variant, refs):
    records = flickr_records(N_CAPTIONS, refs=refs)
    torch_sig, expected = _rows(test_models_dir, "torch", variant, records)
    onnx_sig, rows = _rows(test_models_dir, "onnx", variant, records)
    assert "be:onnx" in onnx_sig and "be:torch" in torch_sig
    for row, exp in zip(rows, expected, strict=True):
        assert _evidence(row) == _evidence(exp), row["id"]
        for key in SCORES:
            assert row[key] == pytest.approx(exp[key], abs=1e-5), (row["id"], key)
        an = [q["an"] for q in row["explanation"]["questions"]]
        np.testing.assert_allclose(an, [q["an"] for q in exp["explanation"]["questions"]], atol=1e-5)
    assert sum(row["n_questions"] for row in rows) > N_CAPTIONS  # the test models do ask questions


def test_export_is_made_once_and_redone_for_other_weights(models_copy):
    source = models_copy / "tqa"
    model = load_seq2seq(str(source), role="tqa")[0]
    out = ensure_export(source, model, "fp32")
    assert out == source / "onnx" / "fp32" and is_current(out, checkpoint_fingerprint(source))
    stamp = (out / "encoder.onnx").stat().st_mtime_ns
    assert ensure_export(source, model, "fp32") == out
    assert (out / "encoder.onnx").stat().st_mtime_ns == stamp  # reused, not re-exported
    assert not is_current(out, "sha256-other")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["fingerprint"] = "sha256-stale"
    (out / "manifest.json").write_text(json.dumps(manifest))
    ensure_export(source, model, "fp32")  # stale fingerprint: exported and validated again
    assert json.loads((out / "manifest.json").read_text())["fingerprint"] == checkpoint_fingerprint(source)


def test_an_export_of_the_previous_format_is_redone(models_copy):
    """A cached export of an older format (here 3, which had no static-cache step) is exported again, not
    half used."""
    source = models_copy / "qg"
    model = load_seq2seq(str(source), role="qg")[0]
    out = ensure_export(source, model, "fp32")
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "format_version": 3}))
    (out / "decoder_static.onnx").unlink()
    assert not is_current(out, manifest["fingerprint"])
    assert ensure_export(source, model, "fp32") == out
    assert json.loads((out / "manifest.json").read_text())["format_version"] == FORMAT_VERSION
    assert (out / "decoder_static.onnx").is_file() and is_current(out, manifest["fingerprint"])


def test_read_only_source_exports_to_cache(models_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("QACE_ONNX_CACHE", str(tmp_path / "cache"))
    source = models_copy / "qg"
    model = load_seq2seq(str(source), role="qg")[0]
    monkeypatch.setattr("qace.export.cache.os.access", lambda *_: False)  # chmod does not stop root
    out = ensure_export(source, model, "fp32")
    assert out.is_relative_to(tmp_path / "cache") and (out / "decoder.onnx").is_file()


def test_cli_export_models_dir(models_copy, tmp_path, capsys):
    shutil.rmtree(models_copy / "vqa")  # keep the CLI test short: QG + TQA
    assert cli_main(["export", str(models_copy), str(tmp_path / "out"), "--variant", "fp32", "int8"]) == 0
    for role in ("qg", "tqa"):
        for variant in ("fp32", "int8"):
            assert (tmp_path / "out" / role / variant / "decoder_init.onnx").is_file()
    assert "identical greedy outputs 100%" in capsys.readouterr().out
