"""What the PyTorch runner needs from a model family: an encoder and a greedy decoder.

The engine knows no model family. `qace.engine.torch_runner.TorchRunner` runs any encoder-decoder model
whose family (`qace.families`) hands it these two parts; the family owns the model's arithmetic (fused
kernels, caches, CUDA graphs), the runner owns batches, devices, streams and instrumentation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


class Encoder(Protocol):
    """Encodes a batch once; the decoder cross-attends to its output."""

    @property
    def feature_dtype(self) -> torch.dtype | None:
        """The dtype region features are kept in on the device (models that read them), else None."""
        ...

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        features: torch.Tensor | None = None,
        *,
        kept: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states ``(B, S, D)`` and the mask the decoder's cross-attention needs with them (a
        family may pack positions away, so both can be narrower than the input). ``features``: the
        region features of a visual batch, on the runner's device. ``kept``: the most unmasked positions
        of any row of ``attention_mask``, when the caller knows it on the host; a family that packs
        positions sizes its batch by it instead of reading the mask back from the device (a read that
        waits for all the work queued before it). It must be exact: None = read it from the mask."""
        ...

    def warm_up(self, max_tokens: int) -> int:
        """Prepare now what batches of up to ``max_tokens`` padded tokens would otherwise prepare on
        first sight (a family whose products pad rows to few counts: each count's kernel choice);
        returns how many shapes were prepared (0 where there is nothing to prepare)."""
        ...


class Decoder(Protocol):
    """Greedy generation from encoder states."""

    eos_id: int

    def generate(
        self,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        *,
        max_new_tokens: int,
        unanswerable_id: int | None = None,
        forced: torch.Tensor | None = None,
        meanwhile: Callable[[], object] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Greedy tokens ``(B, max_new_tokens)`` (``-1`` after a row ended) and, with
        ``unanswerable_id``, ``1 - P(unanswerable)`` of the first step per row. ``forced`` (benchmarks,
        ``(B, max_new_tokens)``) replaces each step's argmax. ``meanwhile`` is called once, after the
        first step is queued and before the host first waits for the device, so the caller's host work
        runs while the device works."""
        ...

    def warm_up(
        self,
        shapes: Iterable[tuple[int, int]],
        *,
        device: torch.device,
        steps: int,
        forcing: bool = False,
        unanswerable_id: int | None = None,
        progress: Callable[[int], object] | None = None,
    ) -> int:
        """Prepare now what later batches of up to ``rows`` rows padded to ``length`` would otherwise
        prepare on first sight (CUDA graphs), for each ``(rows, length)`` of ``shapes``; returns how many
        batch shapes were new (0 where there is nothing to prepare)."""
        ...


@dataclass(frozen=True)
class Seq2SeqParts:
    """A model family's encoder and decoder of one loaded model, for `TorchRunner`."""

    encoder: Encoder
    decoder: Decoder
