"""The ONNX export format: its graph files, their input and output names, and the manifest (a leaf).

`qace.export` writes exports in this format and `qace.engine.onnx_runner` runs them; both take every
name and key from here, so neither reaches into the other. An export directory holds one ``<graph>.onnx``
per name in `GRAPHS` and `MANIFEST`:

- ``encoder``: ``input_ids``, ``attention_mask`` (B, S), Visual-T5 also ``features`` (B, 36, 2054) ->
  ``encoder_hidden_states`` (B, S, D), ``encoder_attention_mask`` (B, S);
- ``decoder_init`` (first step): `init_input_names` -> `init_output_names`: ``logits`` (B, V) fp32,
  ``next_token`` (B,) (the argmax), ``answerability`` (B,) fp32, then per layer ``present.{i}.self_key``,
  ``present.{i}.self_value`` (B, H, 1, Dk), ``present.{i}.cross_key``, ``present.{i}.cross_value``;
- ``decoder`` (with past): `decoder_input_names` (the past K/V laid out as `merge_past` makes them) ->
  `decoder_output_names` (the new self-attention K/V, one position longer);
- ``compact`` (no weights): `compact_input_names` -> `compact_output_names`: the rows ``index`` of the
  encoder mask and every past K/V;
- ``decoder_static`` (a step over a static cache of ``static_steps`` positions, CUDA-graph friendly):
  `static_input_names` -> `static_output_names`: the greedy state (`STATE`: the token fed, the step
  index, the ended flags), the forced tokens, the encoder mask, per layer the self-attention cache
  ``past.{i}.self_*`` (B, H, static_steps, Dk) and the cross K/V -> ``emitted`` (what the greedy loop
  writes for the step: the token, or -1 once the row had ended) and ``next.<input>`` for every
  `static_carried` input: the outputs of one step are the inputs of the next;
- ``static_init`` (no weights): `static_init_input_names` -> `static_init_output_names`: the state
  after the first step (``decoder_init``'s), written where the first ``decoder_static`` reads it.

Bump `FORMAT_VERSION` when the graphs' inputs, outputs or arithmetic change, or which ONNX Runtime
versions can load them: cached exports of older formats are then redone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qace.errors import ConfigError

FORMAT_VERSION = 6
"""2: the decoder graphs return ``next_token`` (and ``answerability``), and ``compact.onnx`` drops rows;
3: every graph states ONNX IR version 8 (an older ``compact.onnx`` could carry the onnx package's newer
version, which ONNX Runtime refused to load); 4: the static-cache step (``decoder_static``,
``static_init``, the manifest's ``heads``, ``d_kv`` and ``static_steps``), and fp16 graphs clamp with
Max/Min (ONNX Runtime's CUDA Clip read its computed bounds on the host); 5: the fp16 guard's "any
infinity" as a half-precision ReduceMax (it was an int64 ReduceSum, slow on ONNX Runtime's CUDA provider);
6: ``decoder_static`` writes its self-attention keys and values in place (`static_in_place`)."""
MANIFEST = "manifest.json"
WEIGHTED_GRAPHS = ("encoder", "decoder_init", "decoder", "decoder_static")
"""The graphs traced from the model (the ones int8 quantizes)."""
WEIGHTLESS_GRAPHS = ("compact", "static_init")
GRAPHS = (*WEIGHTED_GRAPHS, *WEIGHTLESS_GRAPHS)
LOOP_GRAPHS = ("encoder", "decoder_init", "decoder", "compact")
"""What decoding with a growing past runs (the engine's greedy loop)."""
STATIC_GRAPHS = ("encoder", "decoder_init", "static_init", "decoder_static")
"""What decoding over a static cache runs."""

ENCODER_INPUTS = ("input_ids", "attention_mask")
FEATURES = "features"
"""The Visual-T5 encoder's third input."""
ENCODER_OUTPUTS = ("encoder_hidden_states", "encoder_attention_mask")
SELF_KV = ("self_key", "self_value")
CROSS_KV = ("cross_key", "cross_value")
STATE = ("decoder_input_ids", "step", "finished")
"""A static step's greedy state: each row's token to feed (B, 1) int64, the step index (1,) int64 (on
the device, so that no shape or host value depends on it), each row's ended flag (B,) bool."""
FORCED = "forced"
"""(B, static_steps) int64: the token each row must emit at each step (benchmarks), `NOT_FORCED` where
the greedy choice stands."""
NOT_FORCED = -1
EMITTED = "emitted"
NEXT = "next."
"""Prefix of a static step's output that is its input of that name at the next step."""


def past_names(layers: int, prefix: str, kinds: tuple[str, ...]) -> list[str]:
    """``{prefix}.{i}.{kind}`` for every layer, layer-major (the order the graphs use)."""
    return [f"{prefix}.{i}.{kind}" for i in range(layers) for kind in kinds]


def init_input_names() -> list[str]:
    return ["decoder_input_ids", *ENCODER_OUTPUTS, "unanswerable_id"]


def init_output_names(layers: int) -> list[str]:
    return ["logits", "next_token", "answerability", *past_names(layers, "present", SELF_KV + CROSS_KV)]


def decoder_input_names(layers: int) -> list[str]:
    return ["decoder_input_ids", "encoder_attention_mask", *past_names(layers, "past", SELF_KV + CROSS_KV)]


def decoder_output_names(layers: int) -> list[str]:
    return ["logits", "next_token", *past_names(layers, "present", SELF_KV)]


def compact_input_names(layers: int) -> list[str]:
    return ["index", "encoder_attention_mask", *past_names(layers, "past", SELF_KV + CROSS_KV)]


def compact_output_names(layers: int) -> list[str]:
    return [f"kept.{name}" for name in compact_input_names(layers)[1:]]


def static_carried(layers: int) -> list[str]:
    """The inputs of ``decoder_static`` that each step returns, updated, as ``next.<input>``."""
    return [*STATE, *past_names(layers, "past", SELF_KV)]


def static_in_place(layers: int) -> list[str]:
    """The carried inputs of ``decoder_static`` that it updates where they lie: the self-attention caches.
    The step writes its keys and values at position ``step`` with ``ScatterElements`` and returns the
    cache as ``next.<input>``; bound to the input's own buffer, that output is the input updated in place
    (ONNX Runtime's kernel skips its copy when the two alias), so no step copies a whole cache."""
    return past_names(layers, "past", SELF_KV)


def static_input_names(layers: int) -> list[str]:
    return [*STATE, FORCED, "encoder_attention_mask", *past_names(layers, "past", SELF_KV + CROSS_KV)]


def static_output_names(layers: int) -> list[str]:
    return [EMITTED, *(NEXT + name for name in static_carried(layers))]


def static_init_input_names(layers: int) -> list[str]:
    """``decoder_init``'s greedy choice and self-attention K/V, the forced tokens and the encoder mask."""
    return ["next_token", FORCED, "encoder_attention_mask", *past_names(layers, "present", SELF_KV)]


def static_init_output_names(layers: int) -> list[str]:
    """The first step's ``emitted``, then ``next.<input>`` for every ``decoder_static`` input but the
    cross-attention K/V (``decoder_init`` writes those)."""
    written = [name for name in static_input_names(layers) if not name.endswith(CROSS_KV)]
    return [EMITTED, *(NEXT + name for name in written)]


def merge_past(self_kv: list[Any], past: list[Any]) -> list[Any]:
    """Next step's past: each layer's new self-attention K/V with its unchanged cross-attention K/V."""
    return [
        kv
        for i in range(len(self_kv) // 2)
        for kv in (*self_kv[2 * i : 2 * i + 2], *past[4 * i + 2 : 4 * i + 4])
    ]


def manifest(
    *,
    source: str,
    fingerprint: str,
    variant: str,
    visual: bool,
    layers: int,
    heads: int,
    d_kv: int,
    static_steps: int,
    start_id: int,
    eos_id: int,
    vocab_size: int,
    opset: int,
    exporter: str,
    versions: dict[str, str],
) -> dict[str, Any]:
    """An export's manifest (the exporter adds ``validation`` and ``export_seconds`` once measured).
    ``static_steps``: the positions of ``decoder_static``'s cache, the most tokens it decodes."""
    return {
        "format_version": FORMAT_VERSION,
        "source": source,
        "fingerprint": fingerprint,
        "precision": "fp16" if variant == "fp16" else "fp32",
        "variant": variant,
        "visual": visual,
        "layers": layers,
        "heads": heads,
        "d_kv": d_kv,
        "static_steps": static_steps,
        "decoder_start_token_id": start_id,
        "eos_token_id": eos_id,
        "vocab_size": vocab_size,
        "opset": opset,
        "exporter": exporter,
        "versions": versions,
    }


def write_manifest(export_dir: Path, content: dict[str, Any]) -> None:
    (export_dir / MANIFEST).write_text(json.dumps(content, indent=2) + "\n")


def read_manifest(export_dir: Path) -> dict[str, Any]:
    """The manifest of ``export_dir``, or a ConfigError saying it is not an export."""
    path = export_dir / MANIFEST
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a qace ONNX export ({exc}); re-run `qace export`") from exc
    if not isinstance(content, dict):
        raise ConfigError(f"{path}: not a qace ONNX export (no manifest object); re-run `qace export`")
    return content


@dataclass(frozen=True)
class GraphInfo:
    """What the runner reads from an export's manifest."""

    layers: int
    heads: int
    d_kv: int
    static_steps: int
    visual: bool
    start_id: int
    eos_id: int
    float_dtype: str

    @classmethod
    def read(cls, export_dir: Path) -> GraphInfo:
        info = read_manifest(export_dir)
        return cls(
            int(info["layers"]),
            int(info["heads"]),
            int(info["d_kv"]),
            int(info["static_steps"]),
            bool(info["visual"]),
            int(info["decoder_start_token_id"]),
            int(info["eos_token_id"]),
            "float16" if info["precision"] == "fp16" else "float32",
        )
