"""Export round trips for the three model kinds: graphs equal PyTorch in fp32, lossy variants stay sane."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qace.engine.onnx_runner import OnnxRunner
from qace.errors import ExportValidationError
from qace.export.exporter import export_model
from qace.export.validate import measure, sample_batch, validate_export
from qace.families import torch_runner
from qace.metric.prompts import MAX_NEW_TOKENS
from qace.models.loading import load_seq2seq, load_visual_t5

ROLES = ("qg", "tqa", "vqa")


def _load(models_dir, role):
    if role == "vqa":
        return load_visual_t5(models_dir / role)[0]
    return load_seq2seq(str(models_dir / role), role=role)[0]


@pytest.fixture(scope="module")
def loaded(test_models_dir):
    return {role: _load(test_models_dir, role) for role in ROLES}


@pytest.fixture(scope="module")
def fp32_exports(loaded, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx")
    return {role: export_model(loaded[role], out / role, variant="fp32", source=role) for role in ROLES}


@pytest.mark.parametrize("role", ROLES)
def test_fp32_export_matches_pytorch(fp32_exports, role):
    result = fp32_exports[role]
    report = result.validation
    assert report.max_abs_diff < 1e-4
    assert report.token_agreement == report.static_token_agreement == 1.0
    manifest = json.loads((result.out_dir / "manifest.json").read_text())
    assert manifest["visual"] == (role == "vqa")
    assert manifest["validation"]["max_abs_diff"] == report.max_abs_diff
    assert manifest["static_steps"] == MAX_NEW_TOKENS
    assert sorted(p.name for p in result.out_dir.glob("*.onnx")) == [
        "compact.onnx",
        "decoder.onnx",
        "decoder_init.onnx",
        "decoder_static.onnx",
        "encoder.onnx",
        "static_init.onnx",
    ]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("rows", [1, 11])
def test_dynamic_batch_and_lengths(loaded, fp32_exports, role, rows):
    """Batch sizes and sequence lengths other than the traced ones give the same greedy outputs."""
    batch = sample_batch(loaded[role], rows=rows, seed=rows)
    report = measure(loaded[role], fp32_exports[role].out_dir, variant="fp32", batch=batch)
    assert report.token_agreement == 1.0 and report.max_abs_diff < 1e-4


@pytest.mark.parametrize("role", ["tqa", "vqa"])
def test_answerability_matches(loaded, fp32_exports, role):
    batch = sample_batch(loaded[role], rows=5, seed=3)
    expected = torch_runner(loaded[role]).generate(batch, max_new_tokens=MAX_NEW_TOKENS, unanswerable_id=7)
    got = OnnxRunner(fp32_exports[role].out_dir).generate(
        batch, max_new_tokens=MAX_NEW_TOKENS, unanswerable_id=7
    )
    assert got.tokens == expected.tokens
    np.testing.assert_allclose(got.answerability, expected.answerability, atol=1e-6)


def test_outputs_vary_and_end(loaded, fp32_exports):
    """The check is meaningful only if outputs differ in length and some end before the step limit."""
    batch = sample_batch(loaded["qg"], rows=8, seed=1)
    tokens = OnnxRunner(fp32_exports["qg"].out_dir).generate(batch, max_new_tokens=MAX_NEW_TOKENS).tokens
    assert len({len(t) for t in tokens}) > 1
    assert min(len(t) for t in tokens) < MAX_NEW_TOKENS


@pytest.mark.parametrize("variant", ["fp16", "int8"])
@pytest.mark.parametrize("role", ["tqa", "vqa"])
def test_lossy_variants_export_and_report(loaded, tmp_path, variant, role):
    result = export_model(loaded[role], tmp_path / variant, variant=variant)
    report = result.validation
    assert np.isfinite(report.max_abs_diff) and report.max_abs_diff > 0
    assert min(report.token_agreement, report.static_token_agreement) >= report.min_agreement
    manifest = json.loads((result.out_dir / "manifest.json").read_text())
    assert manifest["variant"] == variant and manifest["precision"] == (
        "fp16" if variant == "fp16" else "fp32"
    )


def test_disagreement_fails_with_measured_difference(loaded, fp32_exports):
    """Graphs that no longer match the model raise ExportValidationError carrying the difference."""
    import copy

    changed = copy.deepcopy(loaded["qg"])
    with torch.no_grad():
        changed.lm_head.weight.add_(0.05)
    with pytest.raises(ExportValidationError) as info:
        validate_export(changed, fp32_exports["qg"].out_dir, variant="fp32")
    assert info.value.max_abs_diff is not None and info.value.max_abs_diff > 1e-3


def test_failed_export_leaves_nothing(loaded, tmp_path, monkeypatch):
    import qace.export.exporter as exporter

    monkeypatch.setitem(exporter.validate_export.__globals__["TOLERANCES"], "fp32", (0.0, 1.0))
    with pytest.raises(ExportValidationError):
        export_model(loaded["qg"], tmp_path / "fp32", variant="fp32")
    assert not (tmp_path / "fp32").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_exports_are_validated_over_every_step_the_metric_decodes() -> None:
    from qace.export.validate import VALIDATION_STEPS
    from qace.metric.prompts import MAX_NEW_TOKENS

    assert VALIDATION_STEPS >= MAX_NEW_TOKENS
