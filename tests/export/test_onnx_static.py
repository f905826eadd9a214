"""Decoding over the static-cache step (``decoder_static``) on ONNX Runtime's CPU provider.

The same code path as on CUDA, where each step is replayed from a CUDA graph (`qace.engine.onnx_static`),
only without capture: tokens and answerability must equal the growing-past loop's and the PyTorch
runner's exactly, including rows that end at different steps, the step limit, forced tokens, a batch of
one, and several batch shapes through one runner.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from qace.engine import instrument
from qace.engine.batches import TextBatch
from qace.engine.onnx_runner import OnnxRunner
from qace.errors import ConfigError
from qace.export.exporter import export_model
from qace.export.validate import sample_batch
from qace.families import torch_runner
from qace.metric.prompts import MAX_NEW_TOKENS

ROLES = ("qg", "tqa", "vqa")
UNANSWERABLE = 7
EOS = 12
"""The EOS id of the random model below."""


@pytest.fixture(scope="module")
def chatty(tmp_path_factory):
    """A tiny random T5 with large weights, so every token depends on its context (the trained test
    models barely read their caches after a few steps), and an EOS id that ends rows at many different
    steps (1 to 27 of 31 on the batch below) while half of them run to the limit."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(2)
    shape = dict(vocab_size=24, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4)
    special = dict(decoder_start_token_id=0, eos_token_id=EOS, pad_token_id=0)
    config = T5Config(**shape, **special, initializer_factor=2.0, dropout_rate=0.0, feed_forward_proj="relu")
    model = T5ForConditionalGeneration(config).eval()
    # large weights give large logits: fp32 rounding exceeds the validation's absolute bound
    out = export_model(model, tmp_path_factory.mktemp("chatty") / "fp32", variant="fp32", validate=False)
    return model, out.out_dir


def _all_three(model, export, batch, max_new_tokens, unanswerable_id=None):
    kwargs = dict(max_new_tokens=max_new_tokens, unanswerable_id=unanswerable_id)
    static = OnnxRunner(export, static_cache=True).generate(batch, **kwargs)
    loop = OnnxRunner(export).generate(batch, **kwargs)
    expected = torch_runner(model).generate(batch, **kwargs)
    return static, loop, expected


@pytest.mark.parametrize("role", ROLES)
def test_static_decoding_equals_the_loop_and_pytorch(loaded, exports, role):
    model = loaded[role]
    batch = sample_batch(model, rows=9, seed=3)
    static, loop, expected = _all_three(model, exports[role, "fp32"], batch, MAX_NEW_TOKENS, UNANSWERABLE)
    assert static.tokens == loop.tokens == expected.tokens
    np.testing.assert_allclose(static.answerability, loop.answerability, atol=1e-6)
    np.testing.assert_allclose(static.answerability, expected.answerability, atol=1e-6)


def test_rows_ending_at_different_steps_and_at_the_limit(chatty):
    model, export = chatty
    ids = np.random.default_rng(0).integers(2, 24, size=(16, 9))
    ids[:, -1] = 1
    batch = TextBatch(ids, np.ones_like(ids))
    static, loop, expected = _all_three(model, export, batch, MAX_NEW_TOKENS)
    lengths = sorted(len(t) for t in static.tokens)
    assert len(set(lengths)) > 5 and lengths[0] < 3 and lengths[-2] == MAX_NEW_TOKENS, lengths
    assert static.tokens == loop.tokens == expected.tokens
    static, loop, expected = _all_three(model, export, batch, 5)  # most rows stop at the limit
    assert sum(len(t) == 5 for t in static.tokens) > 8
    assert static.tokens == loop.tokens == expected.tokens


def test_ended_rows_emit_minus_one_and_decoding_stops_when_all_have(chatty):
    """The loop's contract on the raw output: each row's tokens, its EOS, then -1; no step runs once
    every row has ended."""
    model, export = chatty
    pool = np.random.default_rng(4).integers(2, 24, size=(64, 9))
    ended = torch_runner(model).generate(TextBatch(pool, np.ones_like(pool)), max_new_tokens=MAX_NEW_TOKENS)
    ids = pool[[len(t) < MAX_NEW_TOKENS - 1 for t in ended.tokens]]
    runner = OnnxRunner(export, static_cache=True)
    assert runner.static is not None
    raw = []
    decode = runner.static.decode
    runner.static.decode = lambda *args, **kwargs: raw.append(decode(*args, **kwargs)) or raw[-1]
    tokens = runner.generate(TextBatch(ids, np.ones_like(ids)), max_new_tokens=MAX_NEW_TOKENS).tokens
    assert len(ids) > 4 and len(set(map(len, tokens))) > 2
    steps = max(map(len, tokens)) + 1
    expected = np.full((len(ids), MAX_NEW_TOKENS), -1)
    for row, got in enumerate(tokens):
        expected[row, : len(got) + 1] = [*got, EOS]
    np.testing.assert_array_equal(raw[0][0], expected)
    assert runner.static.row_steps == len(ids) * steps


def test_a_batch_of_one(chatty, loaded, exports):
    model, export = chatty
    ids = np.array([[5, 7, 9, 11, 1]])
    static, loop, expected = _all_three(model, export, TextBatch(ids, np.ones_like(ids)), MAX_NEW_TOKENS)
    assert static.tokens == loop.tokens == expected.tokens and len(static.tokens[0]) > 1
    batch = sample_batch(loaded["tqa"], rows=1, seed=2)
    static, loop, expected = _all_three(loaded["tqa"], exports["tqa", "fp32"], batch, 4, UNANSWERABLE)
    assert static.tokens == expected.tokens
    np.testing.assert_allclose(static.answerability, expected.answerability, atol=1e-6)


def test_forced_tokens_replace_the_greedy_choice(chatty):
    """The benchmarks' forced outputs (``instrument.force_tokens``) go through the graph's own rules:
    each row emits its forced tokens up to its first EOS, then -1."""
    model, export = chatty
    ids = np.random.default_rng(1).integers(2, 24, size=(6, 7))
    batch = TextBatch(ids, np.ones_like(ids))
    forced = np.random.default_rng(2).integers(2, EOS, size=(6, MAX_NEW_TOKENS))
    for row, end in enumerate((0, 1, 3, 7, 30, MAX_NEW_TOKENS)):
        if end < MAX_NEW_TOKENS:
            forced[row, end] = EOS
    runners = [OnnxRunner(export, static_cache=True), OnnxRunner(export), torch_runner(model)]
    got = []
    for runner in runners:
        with instrument.attached(runner, force_tokens=lambda batch, steps: forced[:, :steps]):
            got.append(runner.generate(batch, max_new_tokens=MAX_NEW_TOKENS).tokens)
    assert got[0] == got[1] == got[2]
    assert [len(t) for t in got[0]] == [0, 1, 3, 7, 30, MAX_NEW_TOKENS]
    assert got[0][3] == forced[3, :7].tolist()


def test_one_runner_serves_several_shapes(chatty):
    """Each (rows, length) gets its buffers' places and bindings once; a larger shape grows the shared
    buffers and re-lays out, and every shape still decodes what a fresh runner decodes."""
    model, export = chatty
    rng = np.random.default_rng(3)
    shapes = [(4, 6), (9, 11)]
    batches = [TextBatch(ids, np.ones_like(ids)) for ids in (rng.integers(2, 24, size=s) for s in shapes)]
    runner = OnnxRunner(export, static_cache=True)
    assert runner.static is not None
    order = [0, 0, 1, 0, 1]
    got = [runner.generate(batches[i], max_new_tokens=MAX_NEW_TOKENS).tokens for i in order]
    expected = [torch_runner(model).generate(b, max_new_tokens=MAX_NEW_TOKENS).tokens for b in batches]
    assert got == [expected[i] for i in order]
    assert sorted(runner.static._shapes) == shapes
    assert runner.static.captured_shapes == 0  # the CPU captures nothing


def test_a_shape_is_captured_from_its_second_batch_on(chatty):
    """With capture on, each shape's first batch runs its steps with graph id -1 (no capture), later
    batches with the shape's own id per direction; the outputs are the same either way. (The CPU provider
    ignores graph ids, so this checks the options the runner passes; the GPU suite checks capture.)"""
    model, export = chatty
    rng = np.random.default_rng(6)
    batches = [
        TextBatch(ids, np.ones_like(ids)) for ids in (rng.integers(2, 24, size=s) for s in [(4, 6), (5, 8)])
    ]
    runner = OnnxRunner(export, static_cache=True, max_batch=(9, 99))  # one slab: shapes are kept
    static = runner.static
    assert static is not None
    static.capture = True
    used: list[str] = []
    session = static.sessions["decoder_static"]
    run = session.run_with_iobinding

    class Recording:
        def __getattr__(self, name):
            return getattr(session, name)

        def run_with_iobinding(self, binding, options):
            used.append(options.get_run_config_entry("gpu_graph_id"))
            return run(binding, options)

    static.sessions = {**static.sessions, "decoder_static": Recording()}
    expected = [torch_runner(model).generate(b, max_new_tokens=MAX_NEW_TOKENS).tokens for b in batches]
    runs = []
    for i in (0, 1, 0, 0, 1):
        used.clear()
        assert runner.generate(batches[i], max_new_tokens=MAX_NEW_TOKENS).tokens == expected[i]
        runs.append(sorted(set(used)))
    ids = {shape: (s.graph_ids[0], s.graph_ids[1]) for shape, s in static._shapes.items()}
    first, second = (str(g) for g in ids[4, 6]), (str(g) for g in ids[5, 8])
    assert runs[0] == runs[1] == ["-1"]
    assert runs[2] == runs[3] == sorted(first) and runs[4] == sorted(second)
    assert static.captured_shapes == 2


def test_the_caches_are_written_in_place(chatty, exports):
    """The step writes each self cache with one ScatterElements and no Where copies it; the runner keeps
    one buffer per cache, bound as both the step's input and its output, while the rest of the carried
    state ping-pongs between two sets."""
    model, export = chatty
    layers = json.loads((exports["qg", "fp32"] / "manifest.json").read_text())["layers"]
    ops = [n.op_type for n in onnx.load(str(exports["qg", "fp32"] / "decoder_static.onnx")).graph.node]
    assert ops.count("ScatterElements") == 2 * layers
    runner = OnnxRunner(export, static_cache=True)
    ids = np.random.default_rng(5).integers(2, 24, size=(3, 7))
    runner.generate(TextBatch(ids, np.ones_like(ids)), max_new_tokens=MAX_NEW_TOKENS)
    (shape,) = runner.static._shapes.values()
    caches = [name for name in runner.static.carried if name.endswith(("self_key", "self_value"))]
    assert caches and all((None, n) in shape.places and (0, n) not in shape.places for n in caches)
    assert (0, "step") in shape.places and (1, "step") in shape.places
    base = runner.static._slab.data_ptr()
    for direction, binding in enumerate(shape.bindings):  # outputs in the order bound: carried, emitted
        written = dict(zip(runner.static.carried, binding.get_outputs(), strict=False))
        for name in caches:  # where the step read it
            assert written[name].data_ptr() == base + shape.places[None, name].offset
        assert written["step"].data_ptr() == base + shape.places[1 - direction, "step"].offset


def test_batch_limits_size_the_buffers_once(chatty):
    """With the scheduler's limits (rows, tokens) the first batch allocates buffers for every shape within
    them, so later shapes decode in the same allocation; without limits the first shape gets only its own."""
    model, export = chatty
    rng = np.random.default_rng(4)
    shapes = [(4, 6), (9, 11), (3, 30)]  # within 9 rows and 99 tokens
    batches = [TextBatch(ids, np.ones_like(ids)) for ids in (rng.integers(2, 24, size=s) for s in shapes)]
    expected = [torch_runner(model).generate(b, max_new_tokens=MAX_NEW_TOKENS).tokens for b in batches]
    limited = OnnxRunner(export, static_cache=True, max_batch=(9, 99))
    unlimited = OnnxRunner(export, static_cache=True)
    assert limited.static is not None and unlimited.static is not None
    assert [limited.generate(b, max_new_tokens=MAX_NEW_TOKENS).tokens for b in batches[:1]] == expected[:1]
    slab = limited.static._slab
    unlimited.generate(batches[0], max_new_tokens=MAX_NEW_TOKENS)
    assert unlimited.static._slab.shape()[0] < slab.shape()[0]
    got = [limited.generate(b, max_new_tokens=MAX_NEW_TOKENS).tokens for b in batches[1:]]
    assert got == expected[1:]
    assert limited.static._slab is slab  # never reallocated
    beyond = TextBatch(*(np.ones((9, 40), dtype=np.int64),) * 2)  # 360 tokens: past the limits, so it grows
    limited.generate(beyond, max_new_tokens=MAX_NEW_TOKENS)
    assert limited.static._slab.shape()[0] > slab.shape()[0]


def test_fp16_static_decoding_agrees_with_fp32(loaded, exports):
    batch = sample_batch(loaded["qg"], rows=7, seed=4)
    half = OnnxRunner(exports["qg", "fp16"], static_cache=True).generate(batch, max_new_tokens=MAX_NEW_TOKENS)
    loop = OnnxRunner(exports["qg", "fp16"]).generate(batch, max_new_tokens=MAX_NEW_TOKENS)
    assert half.tokens == loop.tokens


def test_more_steps_than_the_cache_holds_are_refused(loaded, exports):
    runner = OnnxRunner(exports["qg", "fp32"], static_cache=True)
    batch = sample_batch(loaded["qg"], rows=2)
    with pytest.raises(ConfigError, match="at most 31 tokens"):
        runner.generate(batch, max_new_tokens=runner.info.static_steps + 1)


HOST_INPUTS = {
    "Reshape": (1,),
    "Expand": (1,),
    "Unsqueeze": (1,),
    "Squeeze": (1,),
    "Slice": (1, 2, 3, 4),
    "Tile": (1,),
    "Pad": (1, 2, 3),
    "Split": (1,),
    "ReduceSum": (1,),
}
"""Inputs that ONNX Runtime's CUDA provider reads on the host: fed by anything but a constant they would
need a copy to the host, which a CUDA graph cannot hold (session creation refuses it)."""
HOST_NODES = {"Shape", "Size", "ConstantOfShape", "Range", "NonZero", "Clip", "TopK", "OneHot", "If", "Loop"}
"""Nodes that produce or read host values (or, Clip, read their bounds there), or branch on the host."""


def _host_work(path) -> list[tuple[str, str]]:
    """The nodes of the graph at ``path`` that would read or make a value on the host (`HOST_NODES`,
    `HOST_INPUTS` fed by anything but a constant)."""
    graph = onnx.load(str(path)).graph
    constants = {i.name for i in graph.initializer}
    constants |= {out for node in graph.node if node.op_type == "Constant" for out in node.output}
    found = [(node.op_type, node.name) for node in graph.node if node.op_type in HOST_NODES]
    return found + [
        (node.op_type, node.input[i])
        for node in graph.node
        for i in HOST_INPUTS.get(node.op_type, ())
        if i < len(node.input) and node.input[i] and node.input[i] not in constants
    ]


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_the_static_step_keeps_every_node_on_the_device(exports, variant):
    out = exports["qg", variant]
    assert _host_work(out / "decoder_static.onnx") == []
    assert _host_work(out / "decoder.onnx")  # the growing-past step reads its past length on the host
    if variant == "fp16":  # the overflow guard is there, as Max/Min
        ops = [n.op_type for n in onnx.load(str(out / "decoder_static.onnx")).graph.node]
        assert ops.count("Max") == ops.count("ReduceMax") == 3 * 2  # three residuals, two layers
