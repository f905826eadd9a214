"""QACE as a pycocoevalcap scorer: ``compute_score(gts, res) -> (corpus_score, per_image_scores)``.

It drops into ``COCOEvalCap.evaluate``'s scorer list next to ``Bleu``, ``Cider`` and ``Spice``::

    from qace.integrations.coco import QACEScorer
    scorers = [(Cider(), "CIDEr"), (QACEScorer(), "QACE-Ref")]
    for scorer, method in scorers:
        score, scores = scorer.compute_score(gts, res)

``gts`` maps an image id to its reference captions and ``res`` the same ids to a one-caption list, as
pycocoevalcap's scorers take them: lists of strings, either raw or as ``PTBTokenizer.tokenize``
returns them (lower-cased, space-separated tokens), or lists of annotation dicts with a ``caption``
field (``COCOEvalCap`` before tokenising). QACE-Img (``variant="img"``) reads ``res``'s ids as image
ids of its region features and ignores ``gts``' captions.

The corpus score is the mean of the per-image QACE scores, which come as a NumPy array in ``gts``'
key order (the order ``COCOEvalCap`` pairs them with its image ids). `QACEScorer.last_components`
holds the per-image F1, BERTScore and answerability parts of the last call.

`MetricScorer` is the same door for any registered metric (`qace.scorers`): each image id's record
carries its caption, ``gts``' references and the id itself, so CLIP-S and RefCLIP-S find the image in
their ``images=`` folder (``MetricScorer("refclip-s", images="val2014/")``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from qace.config import VARIANT_NAMES
from qace.errors import InputError
from qace.integrations.shared import PARTS, check_settings, shared_reward


class QACEScorer:
    """A pycocoevalcap-style scorer; ``settings`` are `qace.api.QACE` keyword arguments
    (``models=DIR``, ``variant="img"``, ``features=...``, ``device="cuda"``, ...). Models load at the
    first `compute_score`, once per process for the same settings."""

    def __init__(self, **settings: Any) -> None:
        check_settings(settings)
        self.settings = settings
        self.variant = settings.get("variant", "ref")
        self.last_components: dict[str, np.ndarray] = {}

    def method(self) -> str:
        """The name ``COCOEvalCap`` reports: ``QACE-Ref`` or ``QACE-Img``."""
        return VARIANT_NAMES[self.variant]

    def compute_score(
        self, gts: Mapping[Any, Sequence[Any]], res: Mapping[Any, Sequence[Any]]
    ) -> tuple[float, np.ndarray]:
        """Mean QACE over the images and the per-image scores, in ``gts``' key order."""
        ids = _same_ids(gts, res)
        captions = []
        for image_id in ids:
            captions.append(_one_caption(res, image_id))
        reward = shared_reward(**self.settings)
        if self.variant == "ref":
            references = [_texts(gts[image_id], image_id, "gts") for image_id in ids]
            for image_id, refs in zip(ids, references, strict=True):
                if not refs or not all(r.strip() for r in refs):
                    raise InputError(
                        "QACE-Ref needs at least one non-empty reference caption in gts",
                        record_id=str(image_id),
                    )
            results = reward.score(captions, references=references)
        else:
            results = reward.score(captions, image_ids=[str(image_id) for image_id in ids])
        scores = np.array([r.reward for r in results], dtype=np.float64)
        self.last_components = {
            part: np.array([r.scores.get(part, 0.0) for r in results], dtype=np.float64) for part in PARTS
        }
        return (float(scores.mean()) if len(scores) else 0.0), scores


class MetricScorer:
    """A pycocoevalcap-style scorer for the registered ``metric`` (``"clip-s"``, ``"refclip-s"``, ...);
    ``settings`` are its scorer's keyword arguments (``images=DIR``, ``model=...``, ``device="cuda"``).
    The scorer loads at the first `compute_score`, once per process for the same settings. A caption
    the metric cannot score (empty, no image found) is an `InputError` naming its image id."""

    def __init__(self, metric: str, **settings: Any) -> None:
        from qace import scorers

        self.entry = scorers.get(metric)
        self.settings = settings
        self.last_components: dict[str, np.ndarray] = {}

    def method(self) -> str:
        """The name ``COCOEvalCap`` reports: the metric's signature name (``CLIP-S``)."""
        return self.entry.signature

    def compute_score(
        self, gts: Mapping[Any, Sequence[Any]], res: Mapping[Any, Sequence[Any]]
    ) -> tuple[float, np.ndarray]:
        """Mean score over the images and the per-image scores, in ``gts``' key order."""
        from qace.data.records import Record, RecordError
        from qace.integrations.shared import shared_scorer

        ids = _same_ids(gts, res)
        records = []
        for image_id in ids:
            refs = tuple(_texts(gts[image_id], image_id, "gts"))
            records.append(Record(str(image_id), _one_caption(res, image_id), str(image_id), refs))
        scorer = shared_scorer(self.entry.name, **self.settings)
        rows = list(scorer.score_records(records))
        for row in rows:
            if isinstance(row, RecordError):
                raise InputError(f"{self.entry.name} cannot score it: {row.reason}", record_id=row.id)
        scores = np.array([row[self.entry.score_key] for row in rows], dtype=np.float64)
        self.last_components = {
            part: np.array([row[part] for row in rows], dtype=np.float64) for part in self.entry.parts
        }
        return (float(scores.mean()) if len(scores) else 0.0), scores


def _one_caption(res: Mapping[Any, Sequence[Any]], image_id: Any) -> str:
    """The one caption ``res`` holds for ``image_id`` (pycocoevalcap's layout), or `InputError`."""
    candidates = _texts(res[image_id], image_id, "res")
    if len(candidates) != 1:
        raise InputError(
            f"res must hold exactly one caption per image, got {len(candidates)}", record_id=str(image_id)
        )
    return candidates[0]


def _same_ids(gts: Mapping[Any, Any], res: Mapping[Any, Any]) -> list[Any]:
    """``gts``' keys, after checking that ``res`` has the same ones."""
    if set(gts) != set(res):
        missing, extra = sorted(map(str, set(gts) - set(res))), sorted(map(str, set(res) - set(gts)))
        raise InputError(
            f"gts and res must have the same image ids: {len(missing)} only in gts {missing[:5]}, "
            f"{len(extra)} only in res {extra[:5]}"
        )
    return list(gts)


def _texts(items: Sequence[Any], image_id: Any, name: str) -> list[str]:
    """The caption strings of one image's entry: strings, or dicts with a ``caption`` field."""
    if isinstance(items, str) or not isinstance(items, Sequence):
        raise InputError(
            f"{name} values must be lists of captions (strings or {{'caption': ...}} dicts), "
            f"got {type(items).__name__}",
            record_id=str(image_id),
        )
    texts = []
    for item in items:
        text = item.get("caption") if isinstance(item, Mapping) else item
        if not isinstance(text, str):
            raise InputError(
                f"{name} holds a {type(item).__name__} without a caption string", record_id=str(image_id)
            )
        texts.append(text)
    return texts
