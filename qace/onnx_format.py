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
  encoder mask and every past K/V.

Bump `FORMAT_VERSION` when the graphs' inputs, outputs or arithmetic change, or which ONNX Runtime
versions can load them: cached exports of older formats are then redone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qace.errors import ConfigError

FORMAT_VERSION = 3
"""2: the decoder graphs return ``next_token`` (and ``answerability``), and ``compact.onnx`` drops rows;
3: every graph states ONNX IR version 8 (an older ``compact.onnx`` could carry the onnx package's newer
version, which ONNX Runtime refused to load)."""
MANIFEST = "manifest.json"
WEIGHTED_GRAPHS = ("encoder", "decoder_init", "decoder")
"""The graphs traced from the model (the ones int8 quantizes)."""
GRAPHS = (*WEIGHTED_GRAPHS, "compact")

ENCODER_INPUTS = ("input_ids", "attention_mask")
FEATURES = "features"
"""The Visual-T5 encoder's third input."""
ENCODER_OUTPUTS = ("encoder_hidden_states", "encoder_attention_mask")
SELF_KV = ("self_key", "self_value")
CROSS_KV = ("cross_key", "cross_value")


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
    start_id: int,
    eos_id: int,
    vocab_size: int,
    opset: int,
    exporter: str,
    versions: dict[str, str],
) -> dict[str, Any]:
    """An export's manifest (the exporter adds ``validation`` and ``export_seconds`` once measured)."""
    return {
        "format_version": FORMAT_VERSION,
        "source": source,
        "fingerprint": fingerprint,
        "precision": "fp16" if variant == "fp16" else "fp32",
        "variant": variant,
        "visual": visual,
        "layers": layers,
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
    visual: bool
    start_id: int
    eos_id: int
    float_dtype: str

    @classmethod
    def read(cls, export_dir: Path) -> GraphInfo:
        info = read_manifest(export_dir)
        return cls(
            int(info["layers"]),
            bool(info["visual"]),
            int(info["decoder_start_token_id"]),
            int(info["eos_token_id"]),
            "float16" if info["precision"] == "fp16" else "float32",
        )
