"""Check an export against the PyTorch model it came from, the way optimum's exporters do after export.

Two measurements on the same fixed inputs (a few rows of varied length; random region features for
Visual-T5):

- ``max_abs_diff``: the largest logit difference over every decoding step, with both sides fed the
  PyTorch greedy tokens (teacher forcing), so one early flip cannot hide later differences;
- ``token_agreement``: the share of rows whose greedy outputs (``TorchRunner`` vs ``OnnxRunner``, the
  engine's own loops) are identical; ``static_token_agreement`` the same for the ONNX runner decoding
  over the static-cache step (``decoder_static``, on the device the export is validated on: CUDA
  graphs on CUDA).

fp32 must reproduce PyTorch: logits within ``1e-3`` and every greedy output equal. fp16 and int8 are
lossy by design; their bounds only catch a broken graph (NaN, garbage) and the measured agreement is
reported, not promised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qace.engine.batches import TextBatch, VisualBatch
from qace.engine.onnx_runner import OnnxRunner
from qace.errors import ExportValidationError
from qace.families import torch_runner
from qace.onnx_format import (
    ENCODER_INPUTS,
    ENCODER_OUTPUTS,
    FEATURES,
    decoder_input_names,
    decoder_output_names,
    init_input_names,
    init_output_names,
    merge_past,
)

TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-3, 1.0),
    "fp16": (1.0, 0.5),
    "int8": (math.inf, 0.5),
}
"""Per variant: (max |logit difference|, min share of rows with identical greedy output)."""
ROWS = 6


@dataclass(frozen=True)
class ValidationReport:
    """What the check measured, and the bounds it was held to."""

    variant: str
    max_abs_diff: float
    token_agreement: float
    static_token_agreement: float
    rows: int
    atol: float
    min_agreement: float


VALIDATION_STEPS = 31
"""Greedy steps an export is checked over: as many as QACE ever decodes (spec: ``max_length=32``, so 31
new tokens; `tests/export` keeps it at least `qace.metric.prompts.MAX_NEW_TOKENS`)."""


def sample_batch(model: Any, rows: int = ROWS, seed: int = 0) -> TextBatch | VisualBatch:
    """Fixed pseudo-random inputs in the model's vocabulary, rows of different lengths, right-padded."""
    rng = np.random.default_rng(seed)
    vocab, eos = int(model.config.vocab_size), int(model.config.eos_token_id)
    if hasattr(model.encoder, "img_emb"):
        from qace.models.visual_inputs import NUM_REGIONS, QUESTION_SLOTS, REGION_DIM

        ids = np.zeros((rows, QUESTION_SLOTS), dtype=np.int64)
        for row in range(rows):
            ids[row, : 3 + 2 * row] = rng.integers(3, vocab, size=3 + 2 * row)
        features = rng.exponential(0.5, size=(rows, NUM_REGIONS, REGION_DIM)).astype(np.float32)
        return VisualBatch(ids, (ids != 0).astype(np.int64), features)
    lengths = [4 + 3 * row for row in range(rows)]
    ids = np.zeros((rows, max(lengths)), dtype=np.int64)
    for row, length in enumerate(lengths):
        ids[row, : length - 1] = rng.integers(3, vocab, size=length - 1)
        ids[row, length - 1] = eos
    return TextBatch(ids, (ids != 0).astype(np.int64))


@torch.inference_mode()
def _torch_logits(model: Any, batch: TextBatch | VisualBatch, decoder_ids: np.ndarray) -> np.ndarray:
    ids, mask = torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask)
    if isinstance(batch, VisualBatch):
        encoder_outputs, mask = model.encode_visual(ids, mask, torch.from_numpy(batch.features))
        hidden = encoder_outputs.last_hidden_state
    else:
        hidden = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    out = model(
        encoder_outputs=(hidden,), attention_mask=mask, decoder_input_ids=torch.from_numpy(decoder_ids)
    )
    return out.logits.float().numpy()


def _onnx_logits(runner: OnnxRunner, batch: TextBatch | VisualBatch, decoder_ids: np.ndarray) -> np.ndarray:
    """Step-by-step logits of the exported graphs, fed ``decoder_ids`` (teacher forcing, plain ``run``)."""
    feeds = dict(zip(ENCODER_INPUTS, (batch.input_ids, batch.attention_mask), strict=True))
    if isinstance(batch, VisualBatch):
        feeds[FEATURES] = batch.features
    sessions, layers = runner.sessions, runner.info.layers
    hidden, mask = sessions["encoder"].run(list(ENCODER_OUTPUTS), feeds)
    init_names = init_output_names(layers)
    unanswerable = np.zeros(1, dtype=np.int64)
    logits, *past = sessions["decoder_init"].run(
        [init_names[0], *init_names[3:]],  # logits and the K/V
        dict(zip(init_input_names(), (decoder_ids[:, :1], hidden, mask, unanswerable), strict=True)),
    )
    steps = [logits]
    step_inputs, step_outputs = decoder_input_names(layers), decoder_output_names(layers)
    for step in range(1, decoder_ids.shape[1]):
        token = decoder_ids[:, step : step + 1]
        feeds = dict(zip(step_inputs, (token, mask, *past), strict=True))
        logits, *selfkv = sessions["decoder"].run([step_outputs[0], *step_outputs[2:]], feeds)
        past = merge_past(selfkv, past)
        steps.append(logits)
    return np.stack(steps, axis=1)


def measure(
    model: Any,
    export_dir: Path,
    *,
    variant: str,
    device: str = "cpu",
    batch: TextBatch | VisualBatch | None = None,
) -> ValidationReport:
    """Run both backends on ``batch`` (default :func:`sample_batch`) and measure their differences."""
    batch = batch if batch is not None else sample_batch(model)
    atol, min_agreement = TOLERANCES[variant]
    expected = torch_runner(model).generate(batch, max_new_tokens=VALIDATION_STEPS).tokens
    static = OnnxRunner(export_dir, device=device, static_cache=True)
    steps = min(VALIDATION_STEPS, static.info.static_steps)
    static_expected = [t[:steps] for t in expected]
    static_agreement = _agreement(static_expected, static.generate(batch, max_new_tokens=steps).tokens)
    del static
    runner = OnnxRunner(export_dir, device=device, static_cache=False)
    agreement = _agreement(expected, runner.generate(batch, max_new_tokens=VALIDATION_STEPS).tokens)
    start, eos = int(model.config.decoder_start_token_id), int(model.config.eos_token_id)
    width = max(len(t) for t in expected) + 1
    decoder_ids = np.full((len(expected), width), eos, dtype=np.int64)
    decoder_ids[:, 0] = start
    for row, tokens in enumerate(expected):
        decoder_ids[row, 1 : 1 + len(tokens)] = tokens
    reference = _torch_logits(model, batch, decoder_ids)
    exported = _onnx_logits(runner, batch, decoder_ids)
    # Compare each row up to and including the step that emits its EOS.
    diffs = [
        np.abs(reference[r, : len(t) + 1] - exported[r, : len(t) + 1]).max() for r, t in enumerate(expected)
    ]
    max_diff = float(max(diffs))
    if not np.isfinite(exported).all():
        max_diff = math.inf
    return ValidationReport(
        variant, max_diff, agreement, static_agreement, len(expected), atol, min_agreement
    )


def _agreement(expected: list[list[int]], got: list[list[int]]) -> float:
    """The share of rows whose ids are identical."""
    return float(np.mean([a == b for a, b in zip(expected, got, strict=True)]))


def validate_export(
    model: Any, export_dir: Path, *, variant: str, device: str = "cpu", enforce: bool = True
) -> ValidationReport:
    """:func:`measure`, raising ExportValidationError when the report is outside the variant's bounds."""
    report = measure(model, export_dir, variant=variant, device=device)
    agreement = min(report.token_agreement, report.static_token_agreement)
    if enforce and not (report.max_abs_diff <= report.atol and agreement >= report.min_agreement):
        raise ExportValidationError(
            f"{variant} ONNX export of {export_dir.name} disagrees with PyTorch: max |logit diff| "
            f"{report.max_abs_diff:.3g} (allowed {report.atol:g}), identical greedy outputs "
            f"{report.token_agreement:.0%} of {report.rows} rows, over the static cache "
            f"{report.static_token_agreement:.0%} (required {report.min_agreement:.0%}). "
            "Fix: report it with the manifest.json of the failed export; use --backend torch meanwhile.",
            max_abs_diff=report.max_abs_diff,
        )
    return report
