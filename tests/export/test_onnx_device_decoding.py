"""Decoding on the session's device: in-graph argmax and answerability, IO binding, on-device row drops.

These run on ONNX Runtime's CPU provider, through the same IO-binding path the CUDA provider takes.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime
import pytest

from qace import onnx_format as fmt
from qace.api import QACE
from qace.cli import main as cli_main
from qace.engine.onnx_runner import OnnxRunner
from qace.errors import BackendUnavailableError
from qace.export.exporter import export_model
from qace.export.validate import _onnx_logits, sample_batch
from qace.families import torch_runner
from qace.metric.prompts import MAX_NEW_TOKENS
from qace.models import loading
from qace.onnx_format import FORMAT_VERSION, GRAPHS

ROLES = ("qg", "tqa", "vqa")
UNANSWERABLE = 7
HAS_CUDA = "CUDAExecutionProvider" in onnxruntime.get_available_providers()


@pytest.mark.parametrize(("role", "variant"), [(r, "fp32") for r in ROLES] + [("qg", "fp16")])
def test_in_graph_argmax_equals_host_argmax_of_the_logits(loaded, exports, role, variant):
    """What the loop reads back (ids, one float) is what the old host-side argmax/softmax made of the
    full logits, step by step, and (fp32) what the PyTorch runner decodes."""
    model = loaded[role]
    batch = sample_batch(model, rows=7, seed=4)
    runner = OnnxRunner(exports[role, variant])
    got = runner.generate(batch, max_new_tokens=MAX_NEW_TOKENS, unanswerable_id=UNANSWERABLE)
    start, eos = runner.info.start_id, runner.info.eos_id
    decoder_ids = np.full((len(got.tokens), max(map(len, got.tokens)) + 1), eos, dtype=np.int64)
    decoder_ids[:, 0] = start
    for row, tokens in enumerate(got.tokens):
        decoder_ids[row, 1 : 1 + len(tokens)] = tokens
    logits = _onnx_logits(runner, batch, decoder_ids)
    for row, tokens in enumerate(got.tokens):
        host = logits[row].argmax(axis=-1).tolist()
        assert host[: len(tokens)] == tokens, row
        if len(tokens) < MAX_NEW_TOKENS:
            assert host[len(tokens)] == eos, row
    first = logits[:, 0].astype(np.float64)
    probs = np.exp(first - first.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(got.answerability, 1 - probs[:, UNANSWERABLE] / probs.sum(axis=-1), atol=1e-6)
    if variant == "fp32":
        expected = torch_runner(model).generate(
            batch, max_new_tokens=MAX_NEW_TOKENS, unanswerable_id=UNANSWERABLE
        )
        assert got.tokens == expected.tokens
        np.testing.assert_allclose(got.answerability, expected.answerability, atol=1e-6)


def test_rows_dropped_on_the_device_keep_decoding_right(tmp_path):
    """Rows that end early are dropped by the ``compact`` graph and the rows still running decode what
    PyTorch decodes. The trained test models barely look at their K/V after a few steps (a gather in
    the wrong row order went unnoticed on them), so this uses a tiny random T5 with large weights whose
    every token depends on its context, and an EOS id it emits early in about half of the rows."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from qace.engine.batches import TextBatch

    torch.manual_seed(0)
    shape = dict(vocab_size=24, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    special = dict(decoder_start_token_id=0, eos_token_id=18, pad_token_id=0)
    config = T5Config(**shape, **special, initializer_factor=8.0, dropout_rate=0.0, feed_forward_proj="relu")
    model = T5ForConditionalGeneration(config).eval()
    # large weights give large logits: fp32 rounding exceeds the validation's absolute bound
    export = export_model(model, tmp_path / "fp32", variant="fp32", validate=False).out_dir
    ids = np.random.default_rng(0).integers(2, 24, size=(16, 9))
    ids[:, -1] = 1
    batch = TextBatch(ids, np.ones_like(ids))
    runner = OnnxRunner(export)
    kept: list[int] = []
    run = runner._run

    def counted(graph, feeds, *args, **kwargs):
        if graph == "compact":
            kept.append(len(feeds["index"]))
        return run(graph, feeds, *args, **kwargs)

    runner._run = counted
    got = runner.generate(batch, max_new_tokens=MAX_NEW_TOKENS)
    expected = torch_runner(model).generate(batch, max_new_tokens=MAX_NEW_TOKENS)
    assert kept and max(kept) >= 2, "the batch no longer ends rows early: pick another EOS id"
    assert max(map(len, got.tokens)) > 10  # kept rows decode on for many steps after the drop
    assert got.tokens == expected.tokens


def test_compact_graph_keeps_the_indexed_rows(exports):
    session = OnnxRunner(exports["qg", "fp32"]).sessions["compact"]
    rng = np.random.default_rng(0)
    feeds = {"index": np.array([3, 0], dtype=np.int64)}
    for arg in session.get_inputs()[1:]:
        if arg.type == "tensor(int64)":
            feeds[arg.name] = rng.integers(0, 2, size=(4, 9))
        else:
            feeds[arg.name] = rng.standard_normal((4, 2, 5, 3)).astype(np.float32)
    outputs = session.run(None, feeds)
    assert len(outputs) == len(feeds) - 1
    for (name, value), kept in zip(list(feeds.items())[1:], outputs, strict=True):
        np.testing.assert_array_equal(kept, value[[3, 0]], err_msg=name)


@pytest.mark.parametrize("key", [("vqa", "fp32"), ("qg", "fp16")])
def test_graphs_have_the_names_of_the_format(exports, key):
    """The runner binds by the format's names (`qace.onnx_format`), not by what a session lists."""
    runners = [OnnxRunner(exports[key]), OnnxRunner(exports[key], static_cache=True)]
    layers = runners[0].info.layers
    expected = {
        "encoder": ([*fmt.ENCODER_INPUTS, fmt.FEATURES], list(fmt.ENCODER_OUTPUTS)),
        "decoder_init": (fmt.init_input_names(), fmt.init_output_names(layers)),
        "decoder": (fmt.decoder_input_names(layers), fmt.decoder_output_names(layers)),
        "compact": (fmt.compact_input_names(layers), fmt.compact_output_names(layers)),
        "decoder_static": (fmt.static_input_names(layers), fmt.static_output_names(layers)),
        "static_init": (fmt.static_init_input_names(layers), fmt.static_init_output_names(layers)),
    }
    if not runners[0].info.visual:
        expected["encoder"][0].remove(fmt.FEATURES)
    sessions = {**runners[0].sessions, **runners[1].sessions}
    assert sorted(sessions) == sorted(GRAPHS)
    for graph, (inputs, outputs) in expected.items():
        session = sessions[graph]
        assert [i.name for i in session.get_inputs()] == inputs, graph
        assert [o.name for o in session.get_outputs()] == outputs, graph


def test_export_has_the_device_graphs(exports):
    out = exports["tqa", "fp32"]
    assert sorted(p.stem for p in out.glob("*.onnx")) == sorted(GRAPHS)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION


def test_graphs_carry_an_ir_version_older_runtimes_load(exports):
    """A newer onnx package stamps its own IR version on graphs built with its helpers (IR 14 with onnx
    1.23), which ONNX Runtime 1.31 refused (it loads up to 13): every graph states the version opset 17
    needs, whatever onnx built it."""
    import onnx

    from qace.export.graphs import IR_VERSION

    for out in (exports["tqa", "fp32"], exports["qg", "fp16"]):
        graphs = out.glob("*.onnx")
        versions = {p.stem: onnx.load(str(p), load_external_data=False).ir_version for p in graphs}
        assert versions["compact"] == IR_VERSION and max(versions.values()) <= 10, versions


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has the CUDA provider")
def test_cuda_without_the_gpu_build_names_the_install_line_before_loading(test_models_dir, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the device was checked")

    monkeypatch.setattr(loading, "load_seq2seq", no_loading)
    monkeypatch.setattr(loading, "load_visual_t5", no_loading)
    with pytest.raises(BackendUnavailableError, match=r"pip install 'qace\[onnx-gpu\]'"):
        QACE(models=test_models_dir, backend="onnx", device="cuda", progress=False)


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has the CUDA provider")
def test_cli_cuda_without_the_gpu_build(test_models_dir, tmp_path, capsys, monkeypatch):
    """On a GPU host (the device check passes) whose ONNX Runtime has no CUDA provider."""
    import qace.cli

    monkeypatch.setattr(qace.cli, "check_device", lambda device: None)
    source = tmp_path / "in.jsonl"
    record = {"id": "a", "image_id": "i", "caption": "a dog runs", "references": ["a dog"]}
    source.write_text(json.dumps(record) + "\n")
    args = ["score", str(source), "--models", str(test_models_dir), "-o", str(tmp_path / "out.jsonl")]
    code = cli_main([*args, "--no-progress", "--backend", "onnx", "--device", "cuda"])
    assert code == 2
    assert "pip install 'qace[onnx-gpu]'" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_fp16_graphs_keep_the_t5_overflow_guard(exports):
    """Every residual of an fp16 graph goes through T5's clamp (its "any infinity" a ReduceMax, then
    ``where``, ``max``, ``min``): two per encoder layer, three per decoder layer; fp32 graphs have none. No
    graph reduces in int64 or casts to double (slow on ONNX Runtime's CUDA provider)."""
    import onnx

    layers = json.loads((exports["qg", "fp16"] / "manifest.json").read_text())["layers"]
    per_layer = {"encoder": 2, "decoder_init": 3, "decoder": 3, "decoder_static": 3}
    for graph, count in per_layer.items():
        for variant, expected in (("fp16", count * layers), ("fp32", 0)):
            nodes = onnx.load(str(exports["qg", variant] / f"{graph}.onnx")).graph.node
            assert [n.op_type for n in nodes].count("ReduceMax") == expected, (graph, variant)
            assert "ReduceSum" not in [n.op_type for n in nodes], (graph, variant)
            double = onnx.TensorProto.DOUBLE
            assert not [n for n in nodes if n.op_type == "Cast" and n.attribute[0].i == double], (
                graph,
                variant,
            )
