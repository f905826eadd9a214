"""Validation of a Visual-T5 on `qace vqa-data` triples, answered by the engine as ``qace score`` does."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

ANSWERABLE_AT = 0.5
"""Answerability (spec section 5) at or above which a question counts as predicted answerable."""


def validate(model: Any, tokenizer: Any, table: Any, features: str, *, device: str = "cpu") -> dict[str, Any]:
    """Exact match and token F1 of the answers (both SQuAD-normalised, answers stopword-filtered as the
    metric filters them), and answerability accuracy against the triples' ``answerable``; None values
    for an empty split."""
    from qace.config import QACEConfig, speed_defaults
    from qace.engine.engine import BatchLimits, run_stages, visual_stage
    from qace.families import torch_runner
    from qace.features.stores import open_feature_store
    from qace.kernels.token_f1 import normalize_answer, token_f1
    from qace.metric.prompts import MAX_NEW_TOKENS, unanswerable_id
    from qace.metric.text import filter_stopwords_all
    from qace.models.visual_inputs import visual_question_inputs

    n = table.num_rows
    if n == 0:
        return {"triples": 0, "exact_match": None, "token_f1": None, "answerability_accuracy": None}
    config = QACEConfig(device=device).with_(**speed_defaults(device))
    store = open_feature_store(features)
    questions = table.column("question").to_pylist()
    stage = visual_stage(
        torch_runner(model, device=device),
        tokenizer,
        questions,
        table.column("image_id").to_pylist(),
        store.get,
        encode_questions=partial(visual_question_inputs, tokenizer, compose=True),
        limits=BatchLimits(config.max_batch_tokens, config.max_batch_rows),
        unanswerable_id=unanswerable_id(tokenizer),
    )
    (out,) = run_stages([stage], max_new_tokens=MAX_NEW_TOKENS)
    predicted = filter_stopwords_all(out.texts)
    gold = table.column("answer").to_pylist()
    exact = [normalize_answer(p) == normalize_answer(g) for p, g in zip(predicted, gold, strict=True)]
    answerable = np.asarray(table.column("answerable").to_pylist(), dtype=bool)
    assert out.answerability is not None
    return {
        "triples": n,
        "exact_match": float(np.mean(exact)),
        "token_f1": float(np.mean(token_f1(predicted, gold))),
        "answerability_accuracy": float(np.mean((out.answerability >= ANSWERABLE_AT) == answerable)),
    }
