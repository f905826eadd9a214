"""One chunk of records through the metric: candidates -> questions -> answers -> comparisons -> scores.

Each stage is a function of the previous stage's output, run once for the whole chunk, so the engine
can batch and de-duplicate across captions; a chunk parsed in two parts asks and answers part by part
in one run (each part's answers are built while the device asks the next part's questions), and
compares all of it at once. Nothing reaches back to an earlier stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from qace.config import VARIANT_NAMES, QACEConfig
from qace.data.records import Record
from qace.engine.engine import (
    NO_LOCK,
    BatchLimits,
    Stage,
    StageOutput,
    deferred_stage,
    run_stages,
    text_stage,
    visual_stage,
)
from qace.engine.instrument import NO_TIMER
from qace.metric.aggregate import COMPONENTS, caption_scores
from qace.metric.candidates import CandidateParts
from qace.metric.prompts import MAX_NEW_TOKENS, QG_TEMPLATE, TQA_TEMPLATE, clean_question
from qace.metric.text import filter_stopwords_all
from qace.models.visual_inputs import visual_question_inputs


@dataclass
class ModelRunners:
    """Runners and tokenizers of the three models, and the answerability token id of each QA model."""

    qg: Any
    qg_tokenizer: Any
    tqa: Any
    tqa_tokenizer: Any
    tqa_unanswerable: int
    vqa: Any = None
    vqa_tokenizer: Any = None
    vqa_unanswerable: int | None = None
    device_lock: Any = NO_LOCK
    """Held around every stage's device work (`qace.engine.device_lock`), so that scorers in several
    threads take turns on the device while their host work overlaps."""


@dataclass
class CaptionWork:
    """What the pipeline learns about one caption as it goes."""

    record: Record
    contexts: list[str]
    candidates: list[str] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)


def score_chunk(
    records: Sequence[Record],
    candidates: Sequence[list[str]] | CandidateParts,
    models: ModelRunners,
    config: QACEConfig,
    matcher: Any,
    features: Any = None,
    signature: str = "",
    timer: Any = NO_TIMER,
) -> list[dict[str, Any]]:
    """Score validated records given their answer candidates (all known, or `CandidateParts`); one
    result row per record, in order."""
    limits = BatchLimits(config.max_batch_tokens, config.max_batch_rows)
    progress = config.progress and len(records) > 64
    text_run: dict[str, Any] = {
        "max_input_tokens": config.max_input_tokens,
        "limits": limits,
        "progress": progress,
    }
    work = [
        CaptionWork(r, list(r.references or ()) if config.variant == "ref" else [r.image_id or ""])
        for r in records
    ]

    if isinstance(candidates, CandidateParts):
        parts = candidates.parts
    else:
        known: Future[list[list[str]]] = Future()
        known.set_result(list(candidates))
        parts = [(list(range(len(work))), known)]

    # questions (first (question, answer) pair of each question wins); a part's run starts once its
    # candidates are known, and a later part's parse overlaps the device's work on the earlier ones
    owners: list[list[tuple[CaptionWork, str]]] = [[] for _ in parts]

    @contextmanager
    def questions_of(k: int) -> Iterator[Stage]:
        positions, found = parts[k]
        for at, cands in zip(positions, found.result(), strict=True):
            work[at].candidates = cands
        owners[k] = [(work[at], a) for at in positions for a in work[at].candidates]
        rows = [(a, item.record.caption) for item, a in owners[k]]
        with text_stage(
            models.qg, models.qg_tokenizer, QG_TEMPLATE, rows, desc="questions", **text_run
        ) as st:
            yield st

    asked: dict[int, list[CaptionWork]] = {}

    def part_asked(k: int, qg: StageOutput) -> list[CaptionWork]:
        """Part ``k``'s captions, their questions taken from the question stage's output (once)."""
        if k not in asked:
            for (item, answer), text, cut in zip(owners[k], qg.texts, qg.truncated, strict=True):
                question = clean_question(text)
                if cut:
                    item.flags.add("truncated_input")
                if question not in item.questions:
                    item.questions.append(question)
                    item.sources.append(answer)
            asked[k] = [work[at] for at in parts[k][0]]
        return asked[k]

    # answers on the caption and on every context: a text-QA stage (and, for QACE-Img, a visual stage)
    # per part, over its captions' questions in (caption, context, question) order
    text_pairs: list[list[tuple[CaptionWork, str, str]]] = [[] for _ in parts]
    visual_pairs: list[list[tuple[CaptionWork, str]]] = [[] for _ in parts]

    def text_answers(k: int, qg: StageOutput) -> AbstractContextManager[Stage]:
        items = part_asked(k, qg)
        pairs = [(item, q, item.record.caption) for item in items for q in item.questions]
        if config.variant == "ref":
            pairs += [(item, q, ctx) for item in items for ctx in item.contexts for q in item.questions]
        text_pairs[k] = pairs
        return text_stage(
            models.tqa,
            models.tqa_tokenizer,
            TQA_TEMPLATE,
            [(q, ctx) for _, q, ctx in pairs],
            unanswerable_id=models.tqa_unanswerable,
            desc="answers",
            **text_run,
        )

    def visual_answers(k: int, qg: StageOutput) -> AbstractContextManager[Stage]:
        visual_pairs[k] = [(item, q) for item in part_asked(k, qg) for q in item.questions]
        return visual_stage(
            models.vqa,
            models.vqa_tokenizer,
            [q for _, q in visual_pairs[k]],
            [item.record.image_id or "" for item, _ in visual_pairs[k]],
            features.get if features is not None else None,
            encode_questions=partial(visual_question_inputs, models.vqa_tokenizer, compose=True),
            limits=limits,
            unanswerable_id=models.vqa_unanswerable,
            progress=progress,
        )

    answer_stages: list[tuple[Any, int | None, Callable[[int, StageOutput], AbstractContextManager[Stage]]]]
    answer_stages = [(models.tqa, models.tqa_unanswerable, text_answers)]
    if config.variant == "img":
        answer_stages.append((models.vqa, models.vqa_unanswerable, visual_answers))
    question_stages = [
        questions_of(0),
        *(deferred_stage(models.qg, None, partial(questions_of, k)) for k in range(1, len(parts))),
    ]
    run = partial(run_stages, device_lock=models.device_lock, max_new_tokens=MAX_NEW_TOKENS)
    if len(parts) == 1:  # the answers need every question: a run of their own
        with timer("questions"):
            (qg,) = run(question_stages)
        with timer("answers"):
            answers = run([make(0, qg) for _, _, make in answer_stages])
    else:  # a part's answers are built while the device asks the next part's questions, in one run
        with timer("questions and answers"):
            answers = run(
                question_stages
                + [
                    deferred_stage(runner, uid, partial(make, k), needs=(k,))
                    for k in range(len(parts))
                    for runner, uid, make in answer_stages
                ]
            )[len(parts) :]

    # the parts' answers in part order: the chunk's captions in that order from here on
    own_texts: list[str] = []
    ctx_texts: list[str] = []
    ctx_an_parts: list[np.ndarray] = []
    roles = len(answer_stages)
    for k in range(len(parts)):
        tqa, *visual = answers[k * roles : (k + 1) * roles]
        for t in np.flatnonzero(tqa.truncated).tolist():  # rare: no loop over a chunk's 35,000 pairs
            text_pairs[k][t][0].flags.add("truncated_input")
        n_self = sum(len(item.questions) for item in asked[k])
        own_texts += tqa.texts[:n_self]
        assert tqa.answerability is not None
        if config.variant == "ref":
            ctx_texts += tqa.texts[n_self:]
            ctx_an_parts.append(tqa.answerability[n_self:])
        else:
            (vqa,) = visual
            for t in np.flatnonzero(vqa.truncated).tolist():
                visual_pairs[k][t][0].flags.add("truncated_question")
            ctx_texts += vqa.texts
            assert vqa.answerability is not None
            ctx_an_parts.append(vqa.answerability)
    own_answers = filter_stopwords_all(own_texts)
    ctx_answers = filter_stopwords_all(ctx_texts)
    ctx_an = np.concatenate(ctx_an_parts)
    order = [at for positions, _ in parts for at in positions]
    ordered = [work[at] for at in order]

    # comparisons, all pairs of the chunk at once
    own_for_ctx = _align_own_answers(ordered, own_answers)
    from qace.kernels.token_f1 import token_f1

    # token F1 is host work and BERTScore mostly waits for the GPU, so F1 runs beside it in a helper thread
    with ThreadPoolExecutor(1, thread_name_prefix="qace-f1") as helper:
        f1_future = helper.submit(token_f1, own_for_ctx, ctx_answers)
        with timer("bertscore"), models.device_lock:
            bs = matcher.score(own_for_ctx, ctx_answers)
        with timer("token_f1"):  # only what is left of it once BERTScore is done
            f1 = f1_future.result()

    shapes = [(len(item.contexts), len(item.questions)) for item in ordered]
    scores = caption_scores(f1, bs, ctx_an, shapes)
    rows, own_at, ctx_at = [], 0, 0
    for item, (k, m), caption in zip(ordered, shapes, scores, strict=True):
        row = _result_row(item, config, caption, signature)
        if config.explain:
            span = slice(ctx_at, ctx_at + k * m)
            values = {
                name: v[span].reshape(k, m) for name, v in zip(COMPONENTS, (f1, bs, ctx_an), strict=True)
            }
            row["explanation"] = _explanation(
                item, own_answers[own_at : own_at + m], ctx_answers[span], values
            )
        rows.append(row)
        own_at, ctx_at = own_at + m, ctx_at + k * m
    in_order: list[dict[str, Any]] = [{} for _ in rows]
    for at, row in zip(order, rows, strict=True):
        in_order[at] = row
    return in_order


def _align_own_answers(work: Sequence[CaptionWork], own_answers: list[str]) -> list[str]:
    """The caption's own answer repeated for every context, in (caption, context, question) order."""
    aligned, at = [], 0
    for item in work:
        m = len(item.questions)
        mine = own_answers[at : at + m]
        aligned += mine * len(item.contexts)
        at += m
    return aligned


def _result_row(
    item: CaptionWork, config: QACEConfig, scores: dict[str, float], signature: str
) -> dict[str, Any]:
    record = item.record
    if not item.questions:
        item.flags.add("no_questions")
    row: dict[str, Any] = {
        "id": record.id,
        "image_id": record.image_id_value,
        "metric": VARIANT_NAMES[config.variant],
    }
    row.update(scores)
    row["n_questions"] = len(item.questions)
    if config.variant == "ref":
        row["n_references"] = len(item.contexts)
    row["flags"] = sorted(item.flags)
    row["signature"] = signature
    return row


def _explanation(
    item: CaptionWork, own: list[str], ctx_answers: list[str], values: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Per-question evidence (spec section 7): candidate, question, answers and the three values."""
    m = len(item.questions)
    questions = []
    for i, (question, source) in enumerate(zip(item.questions, item.sources, strict=True)):
        questions.append(
            {
                "candidate": source,
                "question": question,
                "answer_on_caption": own[i],
                "answers_on_context": [ctx_answers[c * m + i] for c in range(len(item.contexts))],
                "f1": [float(v) for v in values["f1"][:, i]],
                "bs": [float(v) for v in values["bs"][:, i]],
                "an": [float(v) for v in values["an"][:, i]],
            }
        )
    return {"caption": item.record.caption, "candidates": item.candidates, "questions": questions}
