"""ONNX Runtime's own T5 generation operator against qace's decoding loop, on the CPU, same arithmetic.

    python -m benchmarks.ort_generation --out benchmarks/results/ort_generation.json

``onnxruntime.transformers.convert_generation`` wraps a T5 encoder and decoder in the ``com.microsoft``
``BeamSearch`` operator, which runs the whole decoding loop inside one ``session.run``. Its ``GreedySearch``
accepts only GPT-2 ("Currently only gpt2 with greedy search/sampling is supported"), so greedy T5 is
``BeamSearch`` with one beam. Its T5 exporter traces transformers' own T5 classes, which transformers 5
(qace's) changed, so the subgraphs here are qace's export wrappers (``qace.export.graphs``) under the
operator's input/output contract (int32 ids; ``logits`` (B, 1, V); ``present_key_self_{i}`` ...).

Both sides run a T5-small-shaped random model (random weights rarely emit EOS, so both decode nearly the
full ``MAX_NEW_TOKENS`` for every row: the same work) on the same planned batches of Flickr8k-Expert QG
prompts, 2 intra-op threads, median of ``--rounds`` after a warm-up; outputs are compared row by row.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from benchmarks.onnx_cpu import REPO, _batches, _random_t5
from benchmarks.run_info import record
from benchmarks.workload import flickr_workload
from qace.engine.batches import TextBatch, cut_at_eos
from qace.engine.onnx_runner import OnnxRunner, make_session
from qace.export import graphs
from qace.export.exporter import _export_graph, export_model
from qace.metric.prompts import MAX_NEW_TOKENS


class _EncoderDecoderInit(torch.nn.Module):
    """Encoder plus first decoder step, outputs in the operator's (deprecated, 3-input) T5 layout."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.encoder, self.init = graphs.TextEncoder(model), graphs.DecoderInit(model)

    def forward(
        self,
        encoder_input_ids: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        decoder_input_ids: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        hidden, mask = self.encoder(encoder_input_ids.long(), encoder_attention_mask.long())
        unanswerable = torch.zeros(1, dtype=torch.long)
        logits, _, _, *present = self.init(decoder_input_ids.long(), hidden, mask, unanswerable)
        layers = len(present) // 4
        own = [present[4 * i + j] for i in range(layers) for j in (0, 1)]
        cross = [present[4 * i + j] for i in range(layers) for j in (2, 3)]
        return (logits[:, None, :], hidden, *own, *cross)


class _Decoder(torch.nn.Module):
    """Later steps: past self K/V of every layer, then past cross K/V of every layer (operator order)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.step = graphs.DecoderWithPast(model)

    def forward(
        self, input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        layers = len(past) // 4
        ordered = [
            t
            for i in range(layers)
            for t in (past[2 * i], past[2 * i + 1], past[2 * (layers + i)], past[2 * (layers + i) + 1])
        ]
        logits, _, *present = self.step(input_ids.long(), encoder_attention_mask.long(), *ordered)
        return (logits[:, None, :], *present)


def _names(layers: int, prefix: str) -> list[str]:
    own = [f"{prefix}_{kv}_self_{i}" for i in range(layers) for kv in ("key", "value")]
    return own + [f"{prefix}_{kv}_cross_{i}" for i in range(layers) for kv in ("key", "value")]


def build_beam_search(model: Any, out: Path) -> Path:
    """``out/beam_search.onnx``: one BeamSearch node with the two subgraphs (weights inside each)."""
    config, layers = model.config, model.config.num_decoder_layers
    ids = torch.tensor([[5, 6, 7, 1], [5, 6, 1, 0]], dtype=torch.int32)
    mask = (ids != 0).to(torch.int32)
    start = torch.zeros((2, 1), dtype=torch.int32)
    init_out = ["logits", "encoder_hidden_states", *_names(layers, "present")]
    batch, seq = {0: "batch"}, {0: "batch", 1: "encoder_length"}
    _export_graph(
        _EncoderDecoderInit(model),
        (ids, mask, start),
        out / "encoder_decoder_init.onnx",
        ["encoder_input_ids", "encoder_attention_mask", "decoder_input_ids"],
        init_out,
        {
            "encoder_input_ids": seq,
            "encoder_attention_mask": seq,
            "decoder_input_ids": batch,
            "logits": batch,
            "encoder_hidden_states": seq,
            **{n: {0: "batch", 2: "encoder_length"} for n in init_out[2:] if "cross" in n},
            **{n: batch for n in init_out[2:] if "self" in n},
        },
    )
    with torch.no_grad():
        _, _, *present = _EncoderDecoderInit(model)(ids, mask, start)
        own, cross = present[: 2 * layers], present[2 * layers :]
        _, *own = _Decoder(model)(start, mask, *own, *cross)  # two steps of past, as qace's exporter does
    past_in, present_out = _names(layers, "past"), _names(layers, "present")[: 2 * layers]
    _export_graph(
        _Decoder(model),
        (start, mask, *own, *cross),
        out / "decoder.onnx",
        ["input_ids", "encoder_attention_mask", *past_in],
        ["logits", *present_out],
        {
            "input_ids": batch,
            "encoder_attention_mask": seq,
            "logits": batch,
            **{n: {0: "batch", 2: "encoder_length" if "cross" in n else "past"} for n in past_in},
            **{n: {0: "batch", 2: "past_plus_1"} for n in present_out},
        },
    )
    encoder = onnx.load(str(out / "encoder_decoder_init.onnx")).graph
    decoder = onnx.load(str(out / "decoder.onnx")).graph
    inputs = ["input_ids", "max_length", "min_length", "num_beams", "num_return_sequences"]
    inputs += ["length_penalty", "repetition_penalty"]
    node = helper.make_node("BeamSearch", inputs, ["sequences"], domain="com.microsoft")
    node.attribute.extend(
        [
            helper.make_attribute("eos_token_id", int(config.eos_token_id)),
            helper.make_attribute("pad_token_id", int(config.pad_token_id)),
            helper.make_attribute("decoder_start_token_id", int(config.decoder_start_token_id)),
            helper.make_attribute("no_repeat_ngram_size", 0),
            helper.make_attribute("early_stopping", 0),
            helper.make_attribute("model_type", 1),
            helper.make_attribute("encoder", encoder),
            helper.make_attribute("decoder", decoder),
        ]
    )
    scalar = [helper.make_tensor_value_info(n, TensorProto.INT32, [1]) for n in inputs[1:5]]
    scalar += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in inputs[5:]]
    graph = helper.make_graph(
        [node],
        "t5 greedy (BeamSearch, 1 beam)",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT32, ["batch", "length"]), *scalar],
        [helper.make_tensor_value_info("sequences", TensorProto.INT32, ["batch", 1, "max_length"])],
    )
    opsets = [helper.make_opsetid("", graphs.OPSET), helper.make_opsetid("com.microsoft", 1)]
    path = out / "beam_search.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return path


def beam_search_tokens(session: Any, batch: TextBatch, eos: int) -> list[list[int]]:
    """Greedy tokens from the BeamSearch model, without the decoder start and cut before EOS."""
    feeds = {
        "input_ids": batch.input_ids.astype(np.int32),
        "max_length": np.array([MAX_NEW_TOKENS + 1], dtype=np.int32),
        "min_length": np.array([1], dtype=np.int32),
        "num_beams": np.array([1], dtype=np.int32),
        "num_return_sequences": np.array([1], dtype=np.int32),
        "length_penalty": np.array([1.0], dtype=np.float32),
        "repetition_penalty": np.array([1.0], dtype=np.float32),
    }
    (sequences,) = session.run(None, feeds)
    return cut_at_eos(sequences[:, 0, 1:].astype(np.int64), eos)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/ort_generation.json")
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--n", type=int, default=256, help="QG prompts")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-rows", type=int, default=64)
    parser.add_argument("--test-models", default=str(REPO / ".qace-cache" / "test-models"))
    args = parser.parse_args(argv)

    from qace.models.loading import load_seq2seq
    from qace.testing.qace_models import make_test_models

    torch.set_num_threads(args.threads)
    tokenizer = load_seq2seq(str(make_test_models(args.test_models) / "qg"), role="qg")[1]
    records = flickr_workload(Path(args.data_dir))[: args.n]
    prompts = [f"answer: {r.caption.split()[-1]}  context: {r.caption} </s>" for r in records]
    batches = _batches(tokenizer, prompts, args.batch_rows, 16384)
    model = _random_t5(0)
    eos = int(model.config.eos_token_id)
    with tempfile.TemporaryDirectory(prefix="qace-ort-generation-") as work:
        exported = export_model(model, Path(work) / "fp32", variant="fp32", validate=False).out_dir
        loop = OnnxRunner(exported, threads=args.threads)
        op = make_session(build_beam_search(model, Path(work)), threads=args.threads)
        sides = {
            "qace_loop": lambda b: loop.generate(b, max_new_tokens=MAX_NEW_TOKENS).tokens,
            "ort_beam_search_1_beam": lambda b: beam_search_tokens(op, b, eos),
        }
        tokens = {name: [t for b in batches for t in run(b)] for name, run in sides.items()}  # warm-up
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, run in sides.items():
                start = time.perf_counter()
                for b in batches:
                    run(b)
                times[name].append(time.perf_counter() - start)
    rows = sum(len(b.input_ids) for b in batches)
    base = statistics.median(times["qace_loop"])
    report = {
        **record("benchmarks.ort_generation", argv, device="cpu", packages=("onnxruntime",)),
        "threads": args.threads,
        "model": "T5-small shape, random weights, fp32",
        "rows": rows,
        "batches": len(batches),
        "mean_generated_tokens": float(np.mean([len(t) for t in tokens["qace_loop"]])),
        "identical_outputs": float(np.mean([a == b for a, b in zip(*tokens.values(), strict=True)])),
        "backends": {
            name: {
                "seconds_median": round(statistics.median(values), 3),
                "seconds_all": [round(v, 3) for v in values],
                "rows_per_second": round(rows / statistics.median(values), 1),
                "speed_vs_qace_loop": round(base / statistics.median(values), 2),
            }
            for name, values in times.items()
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
