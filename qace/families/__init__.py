"""Model families beside the engine, and the table that reaches them.

The engine (`qace.engine`) is model-neutral: `TorchRunner` runs any encoder-decoder model whose family
gives it an encoder and a greedy decoder (`qace.engine.seq2seq.Seq2SeqParts`). A family is a package
here holding its model arithmetic (``t5/``: fused encoder, static-cache decoder, CUDA-graph decoding,
Triton kernels); `FAMILIES` maps a Hugging Face ``config.model_type`` to the function that builds its
parts. Whoever builds runners (`qace.metric.runners`, the export validation, tests, benchmarks) asks
`torch_runner`; adding a family is a package and a row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qace.engine.seq2seq import Seq2SeqParts
from qace.engine.torch_runner import TorchRunner
from qace.errors import ConfigError
from qace.families import t5

FAMILIES: dict[str, Callable[[Any], Seq2SeqParts]] = {
    "t5": t5.parts,  # T5 and Visual-T5 (a T5 config)
}
"""Model type (``model.config.model_type``) -> the builder of its encoder and decoder."""


def parts_for(model: Any) -> Seq2SeqParts:
    """The encoder and decoder of a loaded model, built by its family (`FAMILIES`)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    build = FAMILIES.get(str(model_type))
    if build is None:
        raise ConfigError(
            f"no model family runs model type {model_type!r} on the PyTorch backend "
            f"(known: {', '.join(sorted(FAMILIES))}); use a T5 checkpoint"
        )
    return build(model)


def torch_runner(model: Any, *, device: str = "cpu") -> TorchRunner:
    """A `TorchRunner` of a loaded model on ``device``, with its family's encoder and decoder."""
    return TorchRunner(model, parts_for(model), device=device)
