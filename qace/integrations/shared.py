"""One QACE engine per process and setting, shared by every integration that asks for it.

Evaluation loops build their metric objects freely (a ``Cider()`` per call, a torchmetrics metric per
validation epoch); loading the models each time would cost seconds per call. `shared_reward` keeps one
engine for each distinct set of ``QACE`` keyword arguments and hands out the same one again.

Scores go through `qace.reward.QACEReward`: a caption that cannot be scored (not a string, empty or
whitespace-only, as a model can generate) scores 0.0, the score of a caption without answer
candidates, and a missing context (references or image id) raises `qace.errors.InputError` naming
the sample.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

from qace.config import QACEConfig
from qace.errors import ConfigError, InputError

if TYPE_CHECKING:
    from qace.reward import QACEReward

PARTS = ("qace_f1", "qace_bs", "qace_an")
"""QACE's three components, as every integration reports them beside ``qace``."""

_ENGINES: dict[tuple[tuple[str, Hashable], ...], QACEReward] = {}
_LOCK = threading.Lock()
_MODEL_ARGS = ("models", "qg", "tqa", "vqa", "features")


def check_settings(settings: dict[str, Any]) -> None:
    """Raise `ConfigError` for settings ``QACE`` would reject, before any model loads."""
    config_fields = {k: v for k, v in settings.items() if k not in _MODEL_ARGS}
    unknown = set(config_fields) - set(QACEConfig.__dataclass_fields__)
    if unknown:
        valid = sorted({*QACEConfig.__dataclass_fields__, *_MODEL_ARGS} - {"extra"})
        raise ConfigError(f"unknown QACE setting(s) {sorted(unknown)}; valid: {valid}")
    QACEConfig(**config_fields)  # validates values (variant, precision, batch sizes, ...)


def shared_reward(**settings: Any) -> QACEReward:
    """The process's `QACEReward` for these ``QACE`` keyword arguments, built on first use.

    Arguments that are not hashable (a feature store object) are told apart by identity. Progress bars
    are off unless ``progress=True`` is passed.
    """
    check_settings(settings)
    settings.setdefault("progress", False)
    key = tuple(sorted((name, _hashable(value)) for name, value in settings.items()))
    with _LOCK:
        reward = _ENGINES.get(key)
        if reward is None:
            from qace.api import QACE
            from qace.reward import QACEReward

            reward = _ENGINES[key] = QACEReward(QACE(**settings))
        return reward


_SCORERS: dict[tuple[Hashable, ...], Any] = {}


def shared_scorer(metric: str, **settings: Any) -> Any:
    """The process's scorer of the registered ``metric`` (`qace.scorers`) for these keyword arguments
    (``device`` among them), built on first use through its registry entry; progress bars off."""
    from qace import scorers

    entry = scorers.get(metric)
    settings.setdefault("progress", False)
    device = str(settings.pop("device", "cpu"))
    key = (metric, device, *sorted((name, _hashable(value)) for name, value in settings.items()))
    with _LOCK:
        scorer = _SCORERS.get(key)
        if scorer is None:
            scorer = _SCORERS[key] = entry.build(device, **settings)
        return scorer


def metric_rows(metric: str, captions: Sequence[Any], contexts: Sequence[Any], **settings: Any) -> list[dict]:
    """The score and parts of the registered ``metric`` for every caption, through `shared_scorer`;
    ``contexts`` hold what the metric reads, one per caption (references, an image id or an image
    file). A caption that cannot be scored (empty, not a string) gets 0.0 everywhere, as in QACE's
    doors; any other refusal (a missing image) is an `InputError` naming the sample."""
    from qace import scorers
    from qace.data.records import Record, RecordError, caption_problem

    entry = scorers.get(metric)
    names = (entry.score_key, *entry.parts)
    if entry.reads is None or len(contexts) != len(captions):
        raise InputError(f"{metric} needs one {entry.reads or 'context'} per caption, got {len(contexts)}")
    texts = [c if isinstance(c, str) else "" for c in captions]
    records = []
    for i, (caption, context) in enumerate(zip(texts, contexts, strict=True)):
        if entry.reads == "references":
            refs = (context,) if isinstance(context, str) else tuple(context)
            records.append(Record(str(i), caption, references=refs))
        else:
            value = None if context is None else str(context)
            image_id, image = (value, None) if entry.reads == "image_id" else (None, value)
            records.append(Record(str(i), caption, image_id=image_id, image=image))
    out = []
    for caption, row in zip(texts, shared_scorer(metric, **settings).score_records(records), strict=True):
        if isinstance(row, RecordError):
            if caption_problem(caption) is None:
                raise InputError(f"{metric} cannot score it: {row.reason}", record_id=f"sample {row.id}")
            row = {}
        out.append({name: float(row.get(name, 0.0)) for name in names})
    return out


def _hashable(value: Any) -> Hashable:
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value
