"""From per-question comparisons to caption scores (spec section 6)."""

from __future__ import annotations

import numpy as np

COMPONENTS = ("f1", "bs", "an")


def caption_scores(f1: np.ndarray, bs: np.ndarray, an: np.ndarray) -> dict[str, float]:
    """QACE and its three means for one caption against one or more contexts.

    Inputs are ``(contexts, questions)`` arrays. Each context gets its own QACE (the mean of the three
    component means); the caption's scores are the means over contexts (paper), and ``qace_max`` is the
    best context (ours). With no question every value is 0.0 (ours).
    """
    contexts, questions = f1.shape
    if questions == 0 or contexts == 0:
        return {"qace": 0.0, "qace_f1": 0.0, "qace_bs": 0.0, "qace_an": 0.0, "qace_max": 0.0}
    means = {name: values.mean(axis=1) for name, values in zip(COMPONENTS, (f1, bs, an), strict=True)}
    per_context = (means["f1"] + means["bs"] + means["an"]) / 3.0
    return {
        "qace": float(per_context.mean()),
        "qace_f1": float(means["f1"].mean()),
        "qace_bs": float(means["bs"].mean()),
        "qace_an": float(means["an"].mean()),
        "qace_max": float(per_context.max()),
    }
