"""Caption scores of a whole chunk at once equal the spec's per-caption formula bit for bit."""

from __future__ import annotations

import numpy as np

from qace.metric.aggregate import caption_scores
from qace.metric.text import filter_stopwords, filter_stopwords_all


def _one_caption(f1: np.ndarray, bs: np.ndarray, an: np.ndarray) -> dict[str, float]:
    """Spec section 6 for one caption's ``(contexts, questions)`` arrays, written out plainly."""
    if f1.size == 0:
        return {"qace": 0.0, "qace_f1": 0.0, "qace_bs": 0.0, "qace_an": 0.0, "qace_max": 0.0}
    m_f1, m_bs, m_an = f1.mean(axis=1), bs.mean(axis=1), an.mean(axis=1)
    per_context = (m_f1 + m_bs + m_an) / 3.0
    return {
        "qace": float(per_context.mean()),
        "qace_f1": float(m_f1.mean()),
        "qace_bs": float(m_bs.mean()),
        "qace_an": float(m_an.mean()),
        "qace_max": float(per_context.max()),
    }


def test_chunk_scores_equal_the_per_caption_formula_exactly() -> None:
    rng = np.random.default_rng(0)
    shapes = [(5, 3), (1, 1), (5, 0), (4, 12), (5, 3), (1, 9), (0, 2), (5, 17), (1, 1)]
    total = sum(k * m for k, m in shapes)
    f1, bs, an = rng.random(total), rng.random(total), rng.random(total)
    got = caption_scores(f1, bs, an, shapes)
    at = 0
    for (k, m), scores in zip(shapes, got, strict=True):
        block = slice(at, at + k * m)
        assert scores == _one_caption(
            f1[block].reshape(k, m), bs[block].reshape(k, m), an[block].reshape(k, m)
        )
        at += k * m
    assert got[2]["qace"] == 0.0 and got[6]["qace_max"] == 0.0
    got[2]["qace"] = 1.0  # rows are independent dictionaries
    assert got[6]["qace"] == 0.0
    assert caption_scores(np.empty(0), np.empty(0), np.empty(0), []) == []


def test_filtering_many_answers_equals_filtering_each() -> None:
    texts = ["The red dress", "a dog", "The red dress", "", "of the  park", "a dog"]
    assert filter_stopwords_all(texts) == [filter_stopwords(t) for t in texts]
