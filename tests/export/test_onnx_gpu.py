"""ONNX Runtime's CUDA provider (``pytest -m gpu``): fp32 asks and answers what the PyTorch runner does.

Skipped without ``onnxruntime-gpu`` (``pip install 'qace[onnx-gpu]'``). The PyTorch side runs on CUDA
when torch has it, else on the CPU (both are the exact fp32 reference). On CUDA the ONNX runner decodes
over the static-cache step replayed from CUDA graphs (`qace.engine.onnx_static`) unless told otherwise.
"""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import torch

from qace.api import QACE
from qace.data.features import RandomFeatureStore
from qace.engine import instrument
from qace.engine.batches import TextBatch
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


@pytest.fixture(scope="module")
def exported(test_models_dir, tmp_path_factory):
    """A test model and its export validated on CUDA, per role and variant, made once per module."""
    made = {}

    def get(role, variant):
        if (role, variant) not in made:
            model = _load(test_models_dir, role)
            out = tmp_path_factory.mktemp(f"{role}-{variant}") / variant
            made[role, variant] = model, export_model(model, out, variant=variant, validation_device="cuda")
        return made[role, variant]

    return get


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_cuda_export_validates_and_decodes_like_pytorch(exported, role, variant):
    """The export validation itself on CUDA sessions (fp16: T5's overflow clamps in the graph; both the
    growing-past loop and the CUDA-graph static decoding), and fp32 greedy outputs and answerability
    equal PyTorch's both ways (the loop dropping rows on the device)."""
    model, result = exported(role, variant)
    assert np.isfinite(result.validation.max_abs_diff)
    assert result.validation.static_token_agreement >= result.validation.min_agreement
    if variant == "fp16":
        return
    batch = sample_batch(model, rows=11, seed=5)
    expected = torch_runner(model.to(TORCH_DEVICE), device=TORCH_DEVICE).generate(
        batch, max_new_tokens=MAX_NEW_TOKENS, unanswerable_id=7
    )
    for static in (True, False):
        runner = OnnxRunner(result.out_dir, device="cuda", static_cache=static)
        got = runner.generate(batch, max_new_tokens=MAX_NEW_TOKENS, unanswerable_id=7)
        assert got.tokens == expected.tokens, static
        np.testing.assert_allclose(got.answerability, expected.answerability, atol=1e-5)


@pytest.fixture(scope="module")
def chatty(tmp_path_factory):
    """A tiny random T5 whose rows end at many different steps (see tests/export/test_onnx_static.py),
    and its fp32 export; made once per module."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(2)
    shape = dict(vocab_size=24, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    special = dict(decoder_start_token_id=0, eos_token_id=12, pad_token_id=0)
    config = T5Config(**shape, **special, initializer_factor=2.0, dropout_rate=0.0, feed_forward_proj="relu")
    model = T5ForConditionalGeneration(config).eval()
    out = tmp_path_factory.mktemp("chatty") / "fp32"
    return model, export_model(model, out, variant="fp32", validate=False).out_dir


def test_cuda_graphs_replay_several_shapes_like_pytorch(chatty):
    """One runner, two batch shapes, each decoded three times (uncaptured, captured, replayed):
    every pass equals PyTorch, rows ending anywhere from the first step to the limit; the step session
    really has CUDA graphs on."""
    model, export = chatty
    rng = np.random.default_rng(0)
    first = rng.integers(2, 24, size=(16, 9))
    first[:, -1] = 1
    batches = [TextBatch(ids, np.ones_like(ids)) for ids in (first, rng.integers(2, 24, size=(5, 13)))]
    runner = OnnxRunner(export, device="cuda", max_batch=(16, 208))  # one slab: the shapes are kept
    assert runner.static is not None
    options = runner.sessions["decoder_static"].get_provider_options()["CUDAExecutionProvider"]
    assert options["enable_cuda_graph"] == "1"
    reference = torch_runner(model.to(TORCH_DEVICE), device=TORCH_DEVICE)
    expected = [reference.generate(b, max_new_tokens=MAX_NEW_TOKENS).tokens for b in batches]
    assert len({len(t) for t in expected[0]}) > 5
    for k, i in enumerate((0, 1, 0, 1, 0, 1)):
        assert runner.generate(batches[i], max_new_tokens=MAX_NEW_TOKENS).tokens == expected[i], i
        assert runner.static.captured_shapes == min(2, max(0, k - 1))


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_every_node_of_the_static_step_runs_on_cuda(exported, capfd, variant):
    """ONNX Runtime's verbose session log lists where it placed each node: a node on the CPU would need
    a copy, which a CUDA graph cannot hold (the session would refuse ``enable_cuda_graph``)."""
    export = exported("qg", variant)[1].out_dir
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 0
    cuda = {"enable_cuda_graph": "1", "use_tf32": "0"}
    providers = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    capfd.readouterr()
    onnxruntime.InferenceSession(str(export / "decoder_static.onnx"), options, providers=providers)
    log = capfd.readouterr().err
    assert "All nodes placed on [CUDAExecutionProvider]" in log, [
        line for line in log.splitlines() if "placed on" in line or "CPUExecutionProvider" in line
    ]


def test_cuda_graphs_take_forced_tokens(chatty):
    """The benchmarks' forced outputs go through the captured step's own rules."""
    model, export = chatty
    ids = np.random.default_rng(1).integers(2, 24, size=(6, 7))
    batch = TextBatch(ids, np.ones_like(ids))
    forced = np.random.default_rng(2).integers(2, 12, size=(6, MAX_NEW_TOKENS))
    forced[[0, 1, 2, 3], [0, 1, 3, 30]] = 12
    got = []
    for runner in (
        OnnxRunner(export, device="cuda"),
        torch_runner(model.to(TORCH_DEVICE), device=TORCH_DEVICE),
    ):
        with instrument.attached(runner, force_tokens=lambda batch, steps: forced[:, :steps]):
            got.append(runner.generate(batch, max_new_tokens=MAX_NEW_TOKENS).tokens)
    assert got[0] == got[1]
    assert [len(t) for t in got[0]] == [0, 1, 3, 30, MAX_NEW_TOKENS, MAX_NEW_TOKENS]


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
            host_workers=0,  # one process: what is compared is the backends' questions and answers
            spacy_workers=0,
            **extra,
        )
        rows[backend] = list(scorer.score_records(records))
    assert _evidence(rows["onnx"]) == _evidence(rows["torch"])
    np.testing.assert_allclose(
        [r["qace"] for r in rows["onnx"]], [r["qace"] for r in rows["torch"]], atol=1e-5
    )
    assert sum(r["n_questions"] for r in rows["onnx"]) > len(records)
