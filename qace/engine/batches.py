"""Plain dataclasses that cross the scheduler/runner boundary (numpy, backend-neutral)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TextBatch:
    """Right-padded encoder inputs of a text model (QG or TQA)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray


@dataclass(frozen=True)
class ImageRows:
    """Region features named, not carried: row ``i`` of a batch is image ``image_ids[rows[i]]``. A host
    process builds batches this way and the process that owns the device gathers the features there
    (`qace.engine.engine.gather_features`), so no region feature crosses processes."""

    image_ids: tuple[str, ...]
    rows: np.ndarray


@dataclass(frozen=True)
class VisualBatch:
    """Visual-T5 inputs: 64 question slots plus 36 region features per row (spec section 4)."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    features: Any
    """(B, 36, 2054) float32 numpy array, rows gathered on the runner's device from its feature cache, or
    `ImageRows` naming them (a batch built away from the device)."""


@dataclass(frozen=True)
class Generated:
    """Greedy outputs of one batch, row-aligned with its inputs."""

    tokens: list[list[int]]
    """Generated ids per row, without the decoder start token and cut before EOS."""
    answerability: np.ndarray | None
    """``1 - softmax(first-step logits)[unanswerable]`` per row, when asked for (spec section 5)."""


def cut_at_eos(out: np.ndarray, eos_id: int) -> list[list[int]]:
    """Generated ids per row up to (excluding) EOS; ``-1`` marks steps after a row ended.

    A row stops at its first EOS or ``-1`` (decoders write ``-1`` only after a row's EOS), found for
    all rows at once; only the ids kept become Python ints (one ``tolist`` of them all, then sliced per
    row): a batch's rows are padded to its longest, so most of ``out`` is not kept.
    """
    lengths, _ = eos_lengths(out, eos_id)
    kept = out[np.arange(out.shape[1]) < lengths[:, None]].tolist()
    ends = np.cumsum(lengths).tolist()
    return [kept[start:end] for start, end in zip([0, *ends][:-1], ends, strict=True)]


def eos_lengths(out: np.ndarray, eos_ids: int | Collection[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per row of generated ids ``(B, steps)``: how many come before its first EOS (any of ``eos_ids``)
    or ``-1``, and whether it stopped there at all (False: it ran out of steps)."""
    eos = (out == eos_ids) if isinstance(eos_ids, int) else np.isin(out, sorted(eos_ids))
    stop = eos | (out < 0)
    stopped = np.asarray(stop.any(axis=1), dtype=bool)
    return np.where(stopped, stop.argmax(axis=1), out.shape[1]), stopped
