"""QACE (and any registered scorer) as a reward for reinforcement learning: one in-process object, three
calling conventions.

`QACEReward` loads the models once on a chosen device and turns captions into one float per
caption; `ScorerReward` does the same for any scorer (`qace.scorers`: the reward service serves every
registered metric so). `QACEReward` plugs into trainers as they are:

- plain: ``reward(captions, references=...)`` or ``reward(captions, image_ids=...)`` -> a 1-D
  float32 tensor (on ``reward.device`` unless ``tensor_device`` says otherwise);
- TRL: ``reward.trl_reward_func()`` is a ``reward_func(prompts, completions, **columns) -> list[float]``
  that reads the image id / references from dataset columns (``GRPOTrainer(reward_funcs=...)``);
- self-critical sequence training (SCST): ``reward.scst(sampled, greedy, ...)`` -> advantages
  ``r(sample) - r(greedy baseline)``.

Invalid captions never crash a batch, because one empty sample must not cost a whole RL step:
a caption that is not a string, is empty or whitespace-only gets ``invalid_reward`` (default 0.0,
the score of a caption with no answer candidate, the worst a real caption can get) and its reason
is reported in `RewardResult.reason`. Missing *contexts* (no references for QACE-Ref, no image id
for QACE-Img, unknown image features) are the caller's bug rather than the policy's, and would
silently train against a constant, so they raise `InputError` naming the sample.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qace.checks import check_invalid_reward
from qace.data.records import RecordError, caption_problem, surrogate_problem
from qace.errors import ConfigError, InputError
from qace.scoring import list_ids
from qace.signature import Signature

if TYPE_CHECKING:
    import torch

    from qace.api import QACE

log = logging.getLogger(__name__)

COMPONENTS = ("qace", "qace_f1", "qace_bs", "qace_an", "qace_max")
"""Result fields a reward can be built from (``qace_max``: best reference, QACE-Ref only)."""
LOGGED_COMPONENTS = ("qace_f1", "qace_bs", "qace_an")
"""The parts of QACE a trainer logs next to the reward."""

# trainers stream the policy's raw text; these end markers (and the unknown token) are not the caption
DEFAULT_STRIP = ("</s>", "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<eos>", "<pad>", "<unk>")


@dataclass(frozen=True)
class RewardResult:
    """The reward of one caption, why it is what it is, and (optionally) the full QACE row."""

    reward: float
    valid: bool
    reason: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    row: dict[str, Any] | None = None


class ScorerReward:
    """Any scorer (`qace.scorers.Scorer`, e.g. a registry entry's: `qace.scorers.ScorerEntry.build_reward`)
    as an RL reward: one float per caption, its ``component`` column (default: the scorer's score).

    ``reads`` is the context every caption comes with (``references``, ``image_id`` or ``image``; None
    for the caption alone): a missing one is the caller's bug and raises `InputError` naming the sample.
    ``columns`` are the scorer's numeric columns, the components a reward can be built from; ``parts``
    those a trainer logs beside the reward (`qace.scorers.ScorerEntry`'s, as its reward). Invalid
    captions, and captions the scorer could not score (an unreadable image, an answer without a rating),
    get ``invalid_reward`` with the reason.
    """

    max_caption_chars: int | None = None
    """Longer captions are always invalid (a scorer's own limit); None: no limit of its own."""

    def __init__(
        self,
        scorer: Any,
        *,
        reads: str | None = None,
        columns: Sequence[str] | None = None,
        parts: Sequence[str] = (),
        component: str | None = None,
        invalid_reward: float = 0.0,
        tensor_device: str | None = None,
    ) -> None:
        self.scorer = scorer
        self.reads = reads
        self.score_key: str = scorer.score_key
        self.components = tuple(columns or (self.score_key,))
        self.logged = tuple(parts)
        """The components a trainer logs next to the reward."""
        self.component = _checked(component or self.score_key, self.components)
        self.invalid_reward = check_invalid_reward(invalid_reward)
        self.device = str(getattr(getattr(scorer, "config", None), "device", "cpu"))
        self.tensor_device = tensor_device or self.device
        self.signature: str = scorer.signature
        self.name = Signature.parse(self.signature).metric
        """The metric's name (its signature's head: ``QACE-Ref``, ``VisCE2``)."""

    def warm_up(self) -> int:
        """Warm the scorer up (its ``warm_up``, where it has one); returns what it reports, else 0."""
        warm_up = getattr(self.scorer, "warm_up", None)
        return int(warm_up()) if callable(warm_up) else 0

    def score(
        self,
        captions: Sequence[Any],
        *,
        image_ids: Sequence[Any] | None = None,
        references: Sequence[Sequence[str]] | None = None,
        images: Sequence[Any] | None = None,
        component: str | None = None,
        max_chars: int | None = None,
    ) -> list[RewardResult]:
        """One `RewardResult` per caption, in order; invalid captions get ``invalid_reward``.

        ``max_chars`` also treats longer captions as invalid (a runaway generation, not a caption);
        captions over the scorer's own limit (`max_caption_chars`) always are.
        """
        component = _checked(component or self.component, self.components)
        limit = self.max_caption_chars
        max_chars = limit if max_chars is None else max_chars if limit is None else min(max_chars, limit)
        n = len(captions)
        list_ids(captions, image_ids=image_ids, references=references, images=images)
        self._check_contexts(n, image_ids, references, images)
        results: list[RewardResult | None] = [None] * n
        keep = []
        for i, caption in enumerate(captions):
            reason = caption_problem(caption, max_chars)
            if reason is None:
                keep.append(i)
            else:
                results[i] = RewardResult(self.invalid_reward, False, reason)
        if keep:
            from qace.data.records import Record

            records = [
                Record(
                    str(i),
                    captions[i],
                    str(image_ids[i]) if image_ids is not None else None,
                    tuple(references[i]) if references is not None else None,
                    str(images[i]) if images is not None else None,
                )
                for i in keep
            ]
            for i, row in zip(keep, self.scorer.score_records(records), strict=True):
                results[i] = self._result(i, row, component)
        invalid = sum(1 for r in results if r is not None and not r.valid)
        if invalid:
            log.debug("%d of %d captions invalid; rewarded %s", invalid, n, self.invalid_reward)
        return results  # type: ignore[return-value]

    def __call__(self, captions: Sequence[Any], **contexts: Any) -> torch.Tensor:
        """Rewards as a float32 tensor of shape ``(len(captions),)`` on ``tensor_device``; ``contexts``
        are `score`'s keywords (``references=``, ``image_ids=``, ``images=``, ``component=``)."""
        import torch

        results = self.score(captions, **contexts)
        return torch.tensor([r.reward for r in results], dtype=torch.float32, device=self.tensor_device)

    def _result(self, sample: int, row: dict[str, Any] | RecordError, component: str) -> RewardResult:
        """The reward of a scored row; a caption the scorer could not score gets ``invalid_reward``."""
        if isinstance(row, RecordError):
            return RewardResult(self.invalid_reward, False, row.reason)
        scores = {name: float(row[name]) for name in self.components if _is_number(row.get(name))}
        if component not in scores:
            reason = f"no {component} for this caption (flags: {', '.join(row.get('flags', [])) or 'none'})"
            return RewardResult(self.invalid_reward, False, reason, scores, row)
        return RewardResult(scores[component], True, None, scores, row)

    def _check_contexts(
        self,
        n: int,
        image_ids: Sequence[Any] | None,
        references: Sequence[Sequence[str]] | None,
        images: Sequence[Any] | None,
    ) -> None:
        """Fail loudly on a missing context: it is a data bug, not a bad caption."""
        if self.reads is None:
            return
        given = {"references": references, "image_id": image_ids, "image": images}[self.reads]
        keyword, missing = CONTEXTS[self.reads]
        if given is None:
            raise InputError(f"{self.name} rewards need {keyword}")
        for i, value in enumerate(given):
            if not (_references_ok(value) if self.reads == "references" else _filled(value)):
                raise InputError(missing, record_id=f"sample {i}")
            texts = value if self.reads == "references" else [str(value)]
            what = {"references": "a reference", "image_id": "the image id", "image": "the image path"}[
                self.reads
            ]
            problem = next(filter(None, (surrogate_problem(what, text) for text in texts)), None)
            if problem is not None:
                raise InputError(problem, record_id=f"sample {i}")


CONTEXTS = {
    "references": (
        "references=[[ref, ...], ...] (one list per caption)",
        "references must be a non-empty list of non-empty strings",
    ),
    "image_id": ("image_ids=[...] (one per caption)", "missing image id"),
    "image": ("images=[...] (one image file per caption)", "missing image file"),
}
"""Per context a reward reads: the keyword that gives it and what a sample without it is told."""


class QACEReward(ScorerReward):
    """QACE as an RL reward; models are loaded once, on ``device``. See the module docstring.

    Either pass a built ``scorer`` (a :class:`qace.api.QACE`), or the ``QACE`` keyword arguments
    (``models=DIR, variant="img", features=..., precision="bf16"``, ...). ``component`` picks the
    reward (``qace``, ``qace_f1``, ``qace_bs``, ``qace_an`` or ``qace_max``); ``explain`` keeps the
    per-question evidence in `RewardResult.row` for logging (costs a little time).
    """

    def __init__(
        self,
        scorer: QACE | None = None,
        *,
        component: str = "qace",
        invalid_reward: float = 0.0,
        device: str | None = None,
        tensor_device: str | None = None,
        models: str | Path | None = None,
        **settings: Any,
    ) -> None:
        _checked(component, COMPONENTS)
        check_invalid_reward(invalid_reward)  # before the models load
        if scorer is None:
            from qace.api import QACE

            settings.setdefault("progress", False)
            if device is not None:
                settings["device"] = device
            scorer = QACE(models=models, **settings)
        elif settings or models is not None or device is not None:
            raise ConfigError("pass either a built scorer or QACE settings (models=, device=, ...), not both")
        if component == "qace_max" and scorer.config.variant != "ref":
            raise ConfigError("component 'qace_max' (best reference) exists only for variant='ref'")
        self.variant = scorer.config.variant
        reads = "references" if self.variant == "ref" else "image_id"
        super().__init__(
            scorer, reads=reads, columns=COMPONENTS, parts=LOGGED_COMPONENTS, component=component,
            invalid_reward=invalid_reward, tensor_device=tensor_device,
        )  # fmt: skip
        self.max_caption_chars = scorer.config.max_caption_chars

    def warm_up(self, max_rows: int | None = None, max_length: int = 96) -> int:
        """Warm the engine up before the first training step (`QACE.warm_up`: the decoders' CUDA graphs,
        spaCy's workers, BERTScore), so that no reward call waits for them; returns how many batch
        shapes were captured (0 on the CPU)."""
        return self.scorer.warm_up(max_rows, max_length)

    def _result(self, sample: int, row: dict[str, Any] | RecordError, component: str) -> RewardResult:
        """A row QACE could not score is a context problem (unknown features): the caller's bug."""
        if isinstance(row, RecordError):
            raise InputError(row.reason, record_id=f"sample {sample}")
        scores = {name: float(row[name]) for name in COMPONENTS}
        return RewardResult(scores[component], True, None, scores, row)

    # -- trainer adapters ----------------------------------------------------------------------

    def scst(
        self,
        sampled: Sequence[str],
        greedy: Sequence[str],
        *,
        image_ids: Sequence[Any] | None = None,
        references: Sequence[Sequence[str]] | None = None,
    ) -> torch.Tensor:
        """Self-critical advantages ``r(sampled) - r(greedy)`` (Rennie et al., 2017).

        ``greedy`` has one caption per image and ``image_ids``/``references`` one entry per image;
        ``sampled`` holds ``k >= 1`` samples per image, grouped by image (sample ``j`` of image ``i``
        at ``i * k + j``, the order of ``repeat_interleave``). Both sets are scored in one engine
        call, so the baseline costs no extra model pass.
        """
        import torch

        n, total = len(greedy), len(sampled)
        if n == 0 or total % n:
            raise InputError(f"{total} sampled captions do not split evenly over {n} greedy captions")
        k = total // n
        ids = None if image_ids is None else [x for x in image_ids for _ in range(k + 1)]
        refs = None if references is None else [x for x in references for _ in range(k + 1)]
        # one call: per image, its k samples then its greedy caption
        captions = [c for i in range(n) for c in (*sampled[i * k : (i + 1) * k], greedy[i])]
        values = torch.tensor(
            [r.reward for r in self.score(captions, image_ids=ids, references=refs)], dtype=torch.float32
        ).view(n, k + 1)
        advantages = values[:, :k] - values[:, k:]
        return advantages.reshape(-1).to(self.tensor_device)

    def trl_reward_func(
        self,
        *,
        image_column: str = "image_id",
        references_column: str = "references",
        component: str | None = None,
        name: str | None = None,
        log_components: bool = True,
    ) -> Callable[..., list[float]]:
        """A TRL-style ``reward_func(prompts, completions, **columns) -> list[float]``.

        TRL passes every extra dataset column as a keyword argument holding one value per
        completion; the image id (QACE-Img) or the references (QACE-Ref) are read from
        ``image_column`` / ``references_column`` (a single reference may be a plain string).
        Completions may be plain strings or conversational (a list of ``{"role", "content"}``
        messages: the last one is the caption).

        With ``log_components``, the components of `LOGGED_COMPONENTS` come from the same metric pass
        as the reward and go to the trainer's ``log_metric`` (their means over the valid captions) and
        ``log_extra`` (one value per completion, ``None`` for invalid captions: the completions table)
        hooks, when it passes them (TRL's ``GRPOTrainer`` does).
        """
        chosen = component or self.component

        def reward_func(
            prompts: Sequence[Any] | None = None,
            completions: Sequence[Any] = (),
            log_metric: Callable[[str, float], None] | None = None,
            log_extra: Callable[[str, list[Any]], None] | None = None,
            **columns: Any,
        ) -> list[float]:
            captions = [completion_text(c) for c in completions]
            kwargs: dict[str, Any] = {}
            if self.variant == "ref":
                if references_column not in columns:
                    raise InputError(
                        f"the dataset has no {references_column!r} column (QACE-Ref needs references)"
                    )
                kwargs["references"] = [[r] if isinstance(r, str) else r for r in columns[references_column]]
            else:
                if image_column not in columns:
                    raise InputError(f"the dataset has no {image_column!r} column (QACE-Img needs image ids)")
                kwargs["image_ids"] = list(columns[image_column])
            results = self.score(captions, component=chosen, **kwargs)
            if log_components:
                _log_components(results, log_metric, log_extra)
            return [r.reward for r in results]

        reward_func.__name__ = name or f"qace_{self.variant}_{chosen}"  # TRL logs rewards by this name
        return reward_func


def _log_components(
    results: Sequence[RewardResult],
    log_metric: Callable[[str, float], None] | None,
    log_extra: Callable[[str, list[Any]], None] | None,
) -> None:
    """Hand the components of ``results`` to a trainer's logging hooks (either may be missing)."""
    valid = [r for r in results if r.valid]
    for name in LOGGED_COMPONENTS:
        if log_metric is not None and valid:
            log_metric(name, sum(r.scores[name] for r in valid) / len(valid))
        if log_extra is not None:
            log_extra(name, [r.scores[name] if r.valid else None for r in results])


def completion_text(completion: Any, strip: Sequence[str] = DEFAULT_STRIP) -> Any:
    """The caption inside a trainer completion: a string, or the last message of a conversation.

    End-of-text markers in ``strip`` are removed from the end; anything that is not text is
    returned unchanged so that `caption_problem` reports it.
    """
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        completion = completion[-1].get("content")
    if not isinstance(completion, str):
        return completion
    text = completion.strip()
    changed = True
    while changed:
        changed = False
        for marker in strip:
            if marker and text.endswith(marker):
                text, changed = text[: -len(marker)].rstrip(), True
    return text


def _checked(component: str, components: Sequence[str]) -> str:
    """``component`` if it is one of ``components``; else a `ConfigError` listing them."""
    if component not in components:
        raise ConfigError(f"unknown reward component {component!r}; choose one of {', '.join(components)}")
    return component


def _filled(value: Any) -> bool:
    """Whether a context value (an image id or path) is given and not blank."""
    return value is not None and str(value).strip() != ""


def _references_ok(refs: Any) -> bool:
    """Whether ``refs`` is a non-empty list of non-empty strings."""
    return not isinstance(refs, str) and bool(refs) and all(isinstance(r, str) and r.strip() for r in refs)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
