"""QACE as a torchmetrics metric, for validation loops (Lightning included) and DDP.

``update(preds, target)`` only collects text: ``preds`` are captions, ``target`` their references
(QACE-Ref: a list of reference strings per caption, or one string) or image ids (QACE-Img). The
states are list states with ``dist_reduce_fx="cat"``, so torchmetrics gathers every rank's captions
on `compute`. `compute` then scores once, through the process's one shared engine
(`qace.integrations.shared.shared_reward`), not once per call. When the states were gathered over
several ranks, each rank scores its share and the scores are exchanged, so no caption is scored twice.

Models load at the first `compute`, on the metric's device unless ``device=`` is given: in Lightning,
where the module (and its metrics) moves to its GPU before validation starts, they load there once.

``metric=`` scores any registered metric instead (`qace.scorers`: ``"clip-s"``, ``"pac-s"``, ...):
``target`` is then the context that metric reads (an image file path for CLIP-S, references, or an
image id), ``scorer_kwargs`` its scorer's keyword arguments, and the result its score column (with
``components``, its parts).

Strings travel as their UTF-8 bytes stored in float tensors of the metric's dtype (exact: byte values
and lengths are far below 2**24), because torchmetrics stands in an empty tensor of that dtype for a
rank that saw no data, and a gather needs one dtype on all ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchmetrics import Metric

from qace.errors import ConfigError, InputError
from qace.integrations.shared import PARTS, check_settings, metric_rows, shared_reward

_TEXT_STATES = ("captions", "caption_lengths", "contexts", "context_lengths", "context_counts")


class QACEScore(Metric):
    """Mean QACE of the captions seen since the last reset.

    ``variant``: ``"ref"`` (QACE-Ref, ``target`` = references) or ``"img"`` (QACE-Img, ``target`` =
    image ids; pass ``features=``). ``per_sample`` adds each caption's score (in rank order, then
    update order), ``components`` the means (and with ``per_sample`` the values) of F1, BERTScore and
    answerability; either turns the result into a dict with the mean under ``"qace"``.
    ``scorer_kwargs`` are `qace.api.QACE` keyword arguments (``models=DIR``, ``precision="bf16"``, ...),
    checked here, before any model loads; ``metric_kwargs`` go to torchmetrics' ``Metric``
    (``sync_on_compute``, ``process_group``, ...). An empty or non-string caption scores 0.0.
    ``metric`` names another registered metric (``"clip-s"``: ``target`` = image files; see the module
    docstring); ``scorer_kwargs`` are then its scorer's keyword arguments, and ``variant`` is unused.
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    # list states (`_TEXT_STATES`): lists of tensors, one tensor each once synced
    captions: Any
    caption_lengths: Any
    contexts: Any
    context_lengths: Any
    context_counts: Any

    def __init__(
        self,
        variant: str = "ref",
        *,
        metric: str | None = None,
        per_sample: bool = False,
        components: bool = False,
        metric_kwargs: dict[str, Any] | None = None,
        **scorer_kwargs: Any,
    ) -> None:
        super().__init__(**(metric_kwargs or {}))
        self.names: tuple[str, ...] = ("qace", *PARTS)
        if metric is None:
            check_settings({"variant": variant, **scorer_kwargs})
            self.reads = "references" if variant == "ref" else "image_id"
        else:
            from qace import scorers

            entry = scorers.get(metric)
            if entry.reads is None:
                raise ConfigError(f"--metric {metric} reads no context; torchmetrics' target would be unused")
            self.reads, self.names = entry.reads, (entry.score_key, *entry.parts)
        self.metric = metric
        self.variant = variant
        self.per_sample = per_sample
        self.components = components
        self.scorer_kwargs = scorer_kwargs
        for name in _TEXT_STATES:
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(self, preds: str | Sequence[str], target: Sequence[Any]) -> None:
        """Collect ``preds`` (captions) and ``target`` (references per caption, or image ids); one caption
        may be given as a string with its references (a list or one string) or image id."""
        if isinstance(preds, str):  # one caption: target is its references (or image id)
            preds, target = [preds], [target]
        preds, target = list(preds), list(target)
        if len(preds) != len(target):
            raise InputError(f"got {len(preds)} captions but {len(target)} targets; give one per caption")
        contexts: list[str] = []
        counts: list[int] = []
        for i, item in enumerate(target):
            texts = self._context(item, i)
            contexts += texts
            counts.append(len(texts))
        captions = [p if isinstance(p, str) else "" for p in preds]  # scored 0.0, like an empty caption
        self._append("captions", "caption_lengths", captions)
        self._append("contexts", "context_lengths", contexts)
        self.context_counts.append(torch.tensor(counts, dtype=self.dtype, device=self.device))

    def _context(self, item: Any, i: int) -> list[str]:
        if self.reads != "references":
            if item is None or str(item).strip() == "":
                what = "QACE-Img" if self.metric is None else self.metric
                kind = {"image_id": "image id", "image": "image file"}[self.reads]
                raise InputError(f"{what} needs an {kind} per caption in target", record_id=f"sample {i}")
            return [str(item)]
        refs = [item] if isinstance(item, str) else item
        if (
            not isinstance(refs, Sequence)
            or not refs
            or not all(isinstance(r, str) and r.strip() for r in refs)
        ):
            raise InputError(
                "QACE-Ref targets must be a non-empty list of non-empty reference strings (or one string)",
                record_id=f"sample {i}",
            )
        return list(refs)

    def _append(self, codes: str, lengths: str, texts: list[str]) -> None:
        encoded = [t.encode("utf-8") for t in texts]
        flat = b"".join(encoded)
        getattr(self, codes).append(torch.tensor(list(flat), dtype=self.dtype, device=self.device))
        getattr(self, lengths).append(
            torch.tensor([len(e) for e in encoded], dtype=self.dtype, device=self.device)
        )

    def compute(self) -> torch.Tensor | dict[str, torch.Tensor]:
        captions = _decode(self.captions, self.caption_lengths)
        contexts = _decode(self.contexts, self.context_lengths)
        counts = [int(c) for c in _flat(self.context_counts).tolist()]
        grouped, at = [], 0
        for k in counts:
            grouped.append(contexts[at : at + k])
            at += k
        rows = self._score_shared(captions, grouped)
        values = {name: torch.tensor([r[name] for r in rows], dtype=torch.float64) for name in self.names}
        if not (self.per_sample or self.components):
            return _mean(values[self.names[0]])
        names = self.names if self.components else self.names[:1]
        out = {name: _mean(values[name]) for name in names}
        if self.per_sample:
            out.update({f"{name}_per_sample": values[name].float() for name in names})
        return out

    def _score_shared(self, captions: list[str], contexts: list[list[str]]) -> list[dict[str, float]]:
        """Component scores of every caption; over gathered ranks each rank scores ``rank::world``."""
        rank, world = 0, 1
        if self._is_synced and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank(self.process_group)
            world = torch.distributed.get_world_size(self.process_group)
        mine = list(range(rank, len(captions), world))
        scores = self._score([captions[i] for i in mine], [contexts[i] for i in mine])
        if world == 1:
            return scores
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, scores, group=self.process_group)
        rows: list[dict[str, float]] = [{}] * len(captions)
        for r, part in enumerate(gathered):
            for i, row in zip(range(r, len(captions), world), part, strict=True):
                rows[i] = row
        return rows

    def _score(self, captions: list[str], contexts: list[list[str]]) -> list[dict[str, float]]:
        if not captions:
            return []
        if self.metric is not None:
            flat = [c if self.reads == "references" else c[0] for c in contexts]
            return metric_rows(self.metric, captions, flat, device=str(self.device), **self.scorer_kwargs)
        settings = {"device": str(self.device), **self.scorer_kwargs, "variant": self.variant}
        reward = shared_reward(**settings)
        if self.variant == "img":
            results = reward.score(captions, image_ids=[c[0] for c in contexts])
        else:
            results = reward.score(captions, references=contexts)
        return [{name: r.scores.get(name, r.reward) for name in ("qace", *PARTS)} for r in results]


def _flat(state: Any) -> torch.Tensor:
    """A list state as one tensor: a list of tensors before a sync, one tensor after it."""
    if isinstance(state, torch.Tensor):
        return state.reshape(-1)
    return torch.cat([s.reshape(-1) for s in state]) if state else torch.zeros(0)


def _decode(codes: Any, lengths: Any) -> list[str]:
    """The strings of a byte-code state and its length state (see `_flat`)."""
    data = _flat(codes).to(torch.uint8).cpu().numpy().tobytes()
    texts, at = [], 0
    for n in (int(x) for x in _flat(lengths).tolist()):
        texts.append(data[at : at + n].decode("utf-8"))
        at += n
    return texts


def _mean(values: torch.Tensor) -> torch.Tensor:
    return values.mean().float() if len(values) else torch.tensor(0.0)
