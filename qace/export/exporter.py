"""Export one QG/TQA/Visual-T5 model to its ONNX graphs, validate them, and write a manifest.

Exporter choice: ``torch.onnx.export`` (TorchScript tracing) on the wrappers in ``qace.export.graphs``
for all three model kinds. Optimum was the first choice for QG/TQA, but every optimum release that
ships the ONNX exporter (optimum 1.x, optimum-onnx 0.1) pins ``transformers<4.58`` or imports APIs
that transformers 5 removed, and qace needs transformers 5. Visual-T5 (encoder with region features)
is not an optimum architecture anyway, so one exporter for all three keeps the graphs' names and
layout identical, which is what lets one runner serve them.

Variants: ``fp32``; ``fp16`` (weights and activations in half precision, meant for CUDA; logits are
returned in fp32); ``int8`` (ONNX Runtime dynamic quantization of the fp32 graphs' MatMuls, for CPU).
"""

from __future__ import annotations

import copy
import logging
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from qace import onnx_format as fmt
from qace._version import __version__
from qace.engine.onnx_runner import import_ort
from qace.errors import ConfigError
from qace.export import graphs
from qace.export.static_graphs import StaticInit, StaticStep
from qace.export.validate import VALIDATION_STEPS, ValidationReport, validate_export

logger = logging.getLogger(__name__)

VARIANTS = ("fp32", "fp16", "int8")
OPSET = graphs.OPSET


@dataclass(frozen=True)
class ExportResult:
    """Where an export went and how well it agreed with PyTorch."""

    out_dir: Path
    variant: str
    validation: ValidationReport
    seconds: float


def is_visual(model: Any) -> bool:
    """Visual-T5 carries the region projection ``encoder.img_emb``."""
    return hasattr(model.encoder, "img_emb")


def _export_graph(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    path: Path,
    inputs: list[str],
    outputs: list[str],
    axes: dict[str, dict[int, str]],
) -> None:
    with torch.inference_mode(False), torch.no_grad():
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
            do_constant_folding=True,
        )


def _kv_axes(names: list[str], length: str) -> dict[str, dict[int, str]]:
    return {n: {0: "batch", 2: length if "self" in n else "encoder_length"} for n in names}


def _export_graphs(model: Any, out: Path, steps: int) -> None:
    """Trace every graph of ``model`` into ``out`` (the static-cache step over ``steps`` positions)."""
    config = model.config
    layers = config.num_decoder_layers
    dtype = next(model.parameters()).dtype
    batch = 2
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 1], [5, 6, 7, 1, 0, 0, 0]], dtype=torch.long)
    mask = (ids != 0).long()
    enc_out = list(fmt.ENCODER_OUTPUTS)
    if is_visual(model):
        from qace.models.visual_inputs import NUM_REGIONS, QUESTION_SLOTS, REGION_DIM

        ids = torch.zeros((batch, QUESTION_SLOTS), dtype=torch.long)
        ids[:, :5] = 5
        mask = (ids != 0).long()
        feats = torch.rand((batch, NUM_REGIONS, REGION_DIM), generator=torch.Generator().manual_seed(0))
        encoder: torch.nn.Module = graphs.VisualEncoder(model)
        _export_graph(
            encoder,
            (ids, mask, feats),
            out / "encoder.onnx",
            [*fmt.ENCODER_INPUTS, fmt.FEATURES],
            enc_out,
            {
                "input_ids": {0: "batch"},
                "attention_mask": {0: "batch"},
                "features": {0: "batch"},
                "encoder_hidden_states": {0: "batch"},
                "encoder_attention_mask": {0: "batch"},
            },
        )
        hidden, enc_mask = encoder(ids, mask, feats)
    else:
        seq = {0: "batch", 1: "encoder_length"}
        encoder = graphs.TextEncoder(model)
        _export_graph(
            encoder,
            (ids, mask),
            out / "encoder.onnx",
            list(fmt.ENCODER_INPUTS),
            enc_out,
            {
                "input_ids": seq,
                "attention_mask": seq,
                "encoder_hidden_states": seq,
                "encoder_attention_mask": seq,
            },
        )
        hidden, enc_mask = encoder(ids, mask)
    hidden = hidden.to(dtype)
    token = torch.full((batch, 1), int(config.decoder_start_token_id), dtype=torch.long)
    unanswerable = torch.tensor([2], dtype=torch.long)
    init_out = fmt.init_output_names(layers)
    enc_axes = {
        "encoder_hidden_states": {0: "batch", 1: "encoder_length"},
        "encoder_attention_mask": {0: "batch", 1: "encoder_length"},
    }
    _export_graph(
        graphs.DecoderInit(model),
        (token, hidden, enc_mask, unanswerable),
        out / "decoder_init.onnx",
        fmt.init_input_names(),
        init_out,
        {
            "decoder_input_ids": {0: "batch"},
            **{name: {0: "batch"} for name in init_out[:3]},
            **enc_axes,
            **_kv_axes(init_out[3:], "one"),
        },
    )
    with torch.no_grad():
        _, _, _, *past = graphs.DecoderInit(model)(token, hidden, enc_mask, unanswerable)
        # Two steps of past, so no past axis is traced as the constant 1.
        _, _, *selfkv = graphs.DecoderWithPast(model)(token, enc_mask, *past)
    init_selfkv = [kv for i, kv in enumerate(past) if i % 4 < 2]
    past = fmt.merge_past(selfkv, past)
    dec_in, dec_out = fmt.decoder_input_names(layers), fmt.decoder_output_names(layers)
    _export_graph(
        graphs.DecoderWithPast(model),
        (token, enc_mask, *past),
        out / "decoder.onnx",
        dec_in,
        dec_out,
        {
            "decoder_input_ids": {0: "batch"},
            "logits": {0: "batch"},
            "next_token": {0: "batch"},
            "encoder_attention_mask": enc_axes["encoder_attention_mask"],
            **_kv_axes(dec_in[2:], "past_length"),
            **_kv_axes(dec_out[2:], "past_length_plus_1"),
        },
    )
    _export_static(model, out, steps, enc_mask, init_selfkv, past)
    from onnx import TensorProto

    float_type = TensorProto.FLOAT16 if dtype == torch.float16 else TensorProto.FLOAT
    graphs.write_compact_graph(out / "compact.onnx", layers, float_type)


def _export_static(
    model: Any,
    out: Path,
    steps: int,
    enc_mask: torch.Tensor,
    first: list[torch.Tensor],
    past: list[torch.Tensor],
) -> None:
    """Trace ``static_init`` (fed ``decoder_init``'s self K/V ``first``) and ``decoder_static`` (fed the
    layout of ``past``, its self K/V padded to ``steps`` positions) into ``out``."""
    layers = int(model.config.num_decoder_layers)
    batch = enc_mask.shape[0]
    forced = torch.full((batch, steps), fmt.NOT_FORCED, dtype=torch.long)
    batch_only = {0: "batch"}
    encoder = {0: "batch", 1: "encoder_length"}
    init_in, init_out = fmt.static_init_input_names(layers), fmt.static_init_output_names(layers)
    next_token = torch.tensor([5, int(model.config.eos_token_id)], dtype=torch.long)
    _export_graph(
        StaticInit(steps, int(model.config.eos_token_id)),
        (next_token, forced, enc_mask, *first),
        out / "static_init.onnx",
        init_in,
        init_out,
        {
            **{name: batch_only for name in init_in + init_out if name not in ("next.step",)},
            "encoder_attention_mask": encoder,
            "next.encoder_attention_mask": encoder,
        },
    )
    caches = [F.pad(kv, (0, 0, 0, steps - kv.shape[2])) if i % 4 < 2 else kv for i, kv in enumerate(past)]
    state = (next_token[:, None], torch.tensor([2]), torch.zeros(batch, dtype=torch.bool))
    step_in, step_out = fmt.static_input_names(layers), fmt.static_output_names(layers)
    _export_graph(
        StaticStep(model, steps),
        (*state, forced, enc_mask, *caches),
        out / "decoder_static.onnx",
        step_in,
        step_out,
        {
            **{name: batch_only for name in step_in + step_out if "step" not in name},
            "encoder_attention_mask": encoder,
            **{name: {0: "batch", 2: "encoder_length"} for name in step_in if name.endswith(fmt.CROSS_KV)},
        },
    )


def _quantize(src: Path, dst: Path) -> None:
    """Dynamic int8 quantization of every MatMul weight (activations quantized on the fly)."""
    import_ort()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    quiet = _DropPreprocessHint()
    root.addFilter(quiet)  # onnxruntime logs a generic "run pre-processing" hint on the root logger
    try:
        for name in fmt.WEIGHTED_GRAPHS:
            quantize_dynamic(
                str(src / f"{name}.onnx"),
                str(dst / f"{name}.onnx"),
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul"],
            )
    finally:
        root.removeFilter(quiet)


class _DropPreprocessHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()


def _prepared(model: Any, variant: str) -> Any:
    """``model`` in the dtype the variant traces (fp16 for fp16, else fp32), in eval mode, on CPU."""
    dtype = torch.float16 if variant == "fp16" else torch.float32
    if next(model.parameters()).dtype == dtype and next(model.parameters()).device.type == "cpu":
        return model.eval()
    return copy.deepcopy(model).to(device="cpu", dtype=dtype).eval()


def export_model(
    model: Any,
    out_dir: str | Path,
    *,
    variant: str = "fp32",
    fingerprint: str = "",
    source: str = "",
    validate: bool = True,
    validation_device: str = "cpu",
    steps: int = VALIDATION_STEPS,
) -> ExportResult:
    """Export ``model`` (T5 or Visual-T5) as ``variant`` into ``out_dir`` and validate it there.

    ``steps``: the positions of the static-cache step's self-attention cache, so the most new tokens
    that decoding over it can produce (default: as many as the export is validated over, which covers
    every answer the metric decodes).

    The graphs are written to a temporary directory next to ``out_dir`` and moved into place only after
    validation passed, so a failed export never leaves a directory that looks usable. Raises
    :class:`qace.errors.ExportValidationError` with the measured difference when the check fails.
    """
    if variant not in VARIANTS:
        raise ConfigError(f"unknown ONNX variant {variant!r}; choose from {', '.join(VARIANTS)}")
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    reference = _prepared(model, "fp32")
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp_name:
        tmp = Path(tmp_name)
        graphs_dir = tmp / "graphs"
        graphs_dir.mkdir()
        if variant == "int8":
            fp32_dir = tmp / "fp32"
            fp32_dir.mkdir()
            _export_graphs(reference, fp32_dir, steps)
            _quantize(fp32_dir, graphs_dir)
            for name in fmt.WEIGHTLESS_GRAPHS:
                shutil.copy(fp32_dir / f"{name}.onnx", graphs_dir)
        else:
            _export_graphs(_prepared(model, variant), graphs_dir, steps)
        manifest = _manifest(model, variant, fingerprint, source, steps)
        fmt.write_manifest(graphs_dir, manifest)
        report = validate_export(
            reference, graphs_dir, variant=variant, device=validation_device, enforce=validate
        )
        manifest["validation"] = asdict(report)
        manifest["export_seconds"] = round(time.perf_counter() - start, 2)
        fmt.write_manifest(graphs_dir, manifest)
        if out.exists():
            shutil.rmtree(out)
        graphs_dir.rename(out)
    seconds = time.perf_counter() - start
    logger.info(
        "exported %s (%s) to %s in %.1f s: max |logit diff| %.3g, greedy token agreement %.3f",
        source or "model",
        variant,
        out,
        seconds,
        report.max_abs_diff,
        report.token_agreement,
    )
    return ExportResult(out, variant, report, seconds)


def _manifest(model: Any, variant: str, fingerprint: str, source: str, steps: int) -> dict[str, Any]:
    import onnx

    ort = import_ort()
    config = model.config
    return fmt.manifest(
        source=source,
        fingerprint=fingerprint,
        variant=variant,
        visual=is_visual(model),
        layers=int(config.num_decoder_layers),
        heads=int(config.num_heads),
        d_kv=int(config.d_kv),
        static_steps=steps,
        start_id=int(config.decoder_start_token_id),
        eos_id=int(config.eos_token_id),
        vocab_size=int(config.vocab_size),
        opset=OPSET,
        exporter=f"torch.onnx (TorchScript) {torch.__version__}",
        versions={
            "qace": __version__,
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
            "numpy": np.__version__,
        },
    )
