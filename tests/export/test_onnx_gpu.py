"""ONNX Runtime's CUDA provider (``pytest -m gpu``): fp32 asks and answers what the PyTorch runner does.

Skipped without ``onnxruntime-gpu`` (``pip install 'qace[onnx-gpu]'``). The PyTorch side runs on CUDA
when torch has it, else on the CPU (both are the exact fp32 reference).
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import torch

from qace.api import QACE
from qace.data.features import RandomFeatureStore
from qace.engine.onnx_runner import OnnxRunner
from qace.export.exporter import export_model
from qace.export.validate import sample_batch
from qace.families import torch_runner
from qace.metric.prompts import MAX_NEW_TOKENS
from qace.models import loading
from tests.helpers import flickr_records

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        "CUDAExecutionProvider" not in onnxruntime.get_available_providers(),
        reason="needs onnxruntime-gpu (pip install 'qace[onnx-gpu]') and a CUDA device",
    ),
]

TORCH_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROLES = ("qg", "tqa", "vqa")


def _load(models_dir, role):
    if role == "vqa":
        return loading.load_visual_t5(models_dir / role)[0]
    return loading.load_seq2seq(str(models_dir / role), role=role)[0]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_cuda_export_validates_and_decodes_like_pytorch(test_models_dir, tmp_path, role, variant):
    """The export validation itself on CUDA sessions (fp16: T5's overflow clamps in the graph), and
    fp32 greedy outputs and answerability equal PyTorch's, with rows dropped on the device."""
    model = _load(test_models_dir, role)
    result = export_model(model, tmp_path / variant, variant=variant, validation_device="cuda")
    assert np.isfinite(result.validation.max_abs_diff)
    if variant == "fp16":
        return
    batch = sample_batch(model, rows=11, seed=5)
    got = OnnxRunner(result.out_dir, device="cuda").generate(
        batch, max_new_tokens=MAX_NEW_TOKENS, unanswerable_id=7
    )
    expected = torch_runner(model.to(TORCH_DEVICE), device=TORCH_DEVICE).generate(
        batch, max_new_tokens=MAX_NEW_TOKENS, unanswerable_id=7
    )
    assert got.tokens == expected.tokens
    np.testing.assert_allclose(got.answerability, expected.answerability, atol=1e-5)


def _evidence(rows):
    return [
        [
            (q["question"], q["answer_on_caption"], q["answers_on_context"])
            for q in r["explanation"]["questions"]
        ]
        for r in rows
    ]


@pytest.mark.parametrize(("variant", "refs"), [("ref", 5), ("img", 1)])
def test_cuda_metric_asks_and_answers_like_pytorch(test_models_dir, variant, refs):
    records = flickr_records(100, refs=refs)
    extra = {"features": RandomFeatureStore(seed=0)} if variant == "img" else {}
    rows = {}
    for backend, device in (("torch", TORCH_DEVICE), ("onnx", "cuda")):
        scorer = QACE(
            models=test_models_dir,
            variant=variant,
            backend=backend,
            device=device,
            explain=True,
            progress=False,
            **extra,
        )
        rows[backend] = list(scorer.score_records(records))
    assert _evidence(rows["onnx"]) == _evidence(rows["torch"])
    np.testing.assert_allclose(
        [r["qace"] for r in rows["onnx"]], [r["qace"] for r in rows["torch"]], atol=1e-5
    )
    assert sum(r["n_questions"] for r in rows["onnx"]) > len(records)
