"""Questions about captions, answered on the captions themselves: the QG and TQA stages of the metric
(spec sections 2 and 3) for a batch of captions, on the engine (`qace.engine.engine`).

`qace models check` runs them on the release's demo caption; `qace vqa-data` on COCO captions, keeping a
question only where the answer on the caption is the phrase it was generated from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from qace.engine.engine import BatchLimits, run_stages, text_stage
from qace.metric.pipeline import ModelRunners
from qace.metric.prompts import MAX_NEW_TOKENS, QG_TEMPLATE, TQA_TEMPLATE, clean_question
from qace.metric.text import filter_stopwords_all


@dataclass(frozen=True)
class CaptionQA:
    """One question about a caption: the candidate it was generated from, and the text-QA answer on the
    caption (lowercased and stopword-filtered like the candidate)."""

    candidate: str
    question: str
    answer: str

    @property
    def consistent(self) -> bool:
        """The answer on the caption is the candidate: the paper's filter for its synthetic VQA set."""
        return self.answer == self.candidate


def caption_qa(
    captions: Sequence[str],
    candidates: Sequence[Sequence[str]],
    models: ModelRunners,
    *,
    limits: BatchLimits,
    max_input_tokens: int = 512,
    progress: bool = False,
) -> list[list[CaptionQA]]:
    """For every caption, its distinct questions (first (question, candidate) pair wins, as in the metric)
    with their answers on the caption; one QG and one TQA stage for all captions together."""
    owners = [(c, a) for c, cands in enumerate(candidates) for a in cands]
    run = partial(text_stage, max_input_tokens=max_input_tokens, limits=limits, progress=progress)
    prompts = [(a, captions[c]) for c, a in owners]
    stage = run(models.qg, models.qg_tokenizer, QG_TEMPLATE, prompts, desc="questions")
    (qg,) = run_stages([stage], models.device_lock, max_new_tokens=MAX_NEW_TOKENS)
    asked: list[list[tuple[str, str]]] = [[] for _ in captions]
    for (c, answer), text in zip(owners, qg.texts, strict=True):
        question = clean_question(text)
        if all(question != q for q, _ in asked[c]):
            asked[c].append((question, answer))
    pairs = [(q, captions[c]) for c, qs in enumerate(asked) for q, _ in qs]
    stage = run(models.tqa, models.tqa_tokenizer, TQA_TEMPLATE, pairs, desc="answers")
    (tqa,) = run_stages([stage], models.device_lock, max_new_tokens=MAX_NEW_TOKENS)
    answers = iter(filter_stopwords_all(tqa.texts))
    return [[CaptionQA(a, q, next(answers)) for q, a in qs] for qs in asked]
