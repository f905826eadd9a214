"""From per-question comparisons to caption scores (spec section 6)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

COMPONENTS = ("f1", "bs", "an")
EMPTY = {"qace": 0.0, "qace_f1": 0.0, "qace_bs": 0.0, "qace_an": 0.0, "qace_max": 0.0}


def caption_scores(
    f1: np.ndarray, bs: np.ndarray, an: np.ndarray, shapes: Sequence[tuple[int, int]]
) -> list[dict[str, float]]:
    """QACE and its three means for every caption of a chunk.

    Caption ``i`` has ``shapes[i] = (contexts, questions)`` values of each component, laid end to end in
    the flat arrays in (caption, context, question) order. Each context gets its own QACE (the mean of the
    three component means); a caption's scores are the means over its contexts (paper), and ``qace_max``
    is its best context (ours). With no question every value is 0.0 (ours).

    Captions of the same shape are reduced together as one ``(n, contexts, questions)`` array: the same
    numpy reductions along the same axis as one caption at a time, so the same values bit for bit, in a
    handful of calls instead of seven per caption.
    """
    sizes = np.array([k * m for k, m in shapes], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, shape in enumerate(shapes):
        groups.setdefault(shape, []).append(i)
    out: list[dict[str, float]] = [EMPTY] * len(shapes)
    for (contexts, questions), members in groups.items():
        if contexts == 0 or questions == 0:
            continue
        index = starts[members][:, None] + np.arange(contexts * questions)[None, :]
        means = [v[index].reshape(len(members), contexts, questions).mean(axis=2) for v in (f1, bs, an)]
        per_context = (means[0] + means[1] + means[2]) / 3.0
        columns = zip(
            per_context.mean(axis=1).tolist(),
            means[0].mean(axis=1).tolist(),
            means[1].mean(axis=1).tolist(),
            means[2].mean(axis=1).tolist(),
            per_context.max(axis=1).tolist(),
            strict=True,
        )
        for i, (qace, q_f1, q_bs, q_an, q_max) in zip(members, columns, strict=True):
            out[i] = {"qace": qace, "qace_f1": q_f1, "qace_bs": q_bs, "qace_an": q_an, "qace_max": q_max}
    return [dict(scores) for scores in out]
