"""spaCy's matrix products with each weight laid out as numpy's BLAS multiplies it fastest.

thinc's layers multiply their inputs by a weight's transpose (``ops.gemm(x, W, trans2=True)``), which
numpy hands to BLAS as a transposed operand. A caption's parse has a few dozen rows a product, and at
that size OpenBLAS multiplies a contiguous right operand about twice as fast as a transposed one (on the
2-core CI host, 18 x 288 by 288 x 288 in fp32: 46 against 86 µs a product). `TransposedWeightOps` keeps
a contiguous copy of each transposed weight, made at its first use, and multiplies by that. The sums
are not bit-equal to the transposed operand's (BLAS adds in another order), so what the parse decides
is checked instead: the same tags, dependencies, heads, entities and candidates as spaCy's own load on
every distinct caption of PASCAL-50S and Flickr8k-Expert (`benchmarks.spacy_parse`), and on the captions
of ``tests/metric/test_spacy_ops.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from thinc.api import NumpyOps


class TransposedWeightOps(NumpyOps):  # type: ignore[misc]  # thinc's ops are untyped for mypy
    """numpy's ops (BLAS, not BLIS) whose ``gemm(x, W, trans2=True)`` multiplies by a contiguous copy of
    ``W.T`` when ``W`` is one of ``weights`` or a view of one from its first element (thinc's layers
    reshape their weights before the product). Any other product is numpy's ops' own."""

    def __init__(self, weights: list[np.ndarray]) -> None:
        super().__init__(use_blis=False)
        self._weights = {w.ctypes.data: w for w in weights}  # held, so no other array gets an address
        self._transposed: dict[tuple[int, tuple[int, ...], tuple[int, ...]], np.ndarray] = {}

    @property
    def copies(self) -> int:
        """How many transposed copies have been made (one per weight and layout multiplied by)."""
        return len(self._transposed)

    def gemm(
        self,
        x: np.ndarray,
        y: np.ndarray,
        *,
        out: np.ndarray | None = None,
        trans1: bool = False,
        trans2: bool = False,
    ) -> Any:
        if not trans2 or trans1 or y.ndim != 2 or y.ctypes.data not in self._weights:
            return super().gemm(x, y, out=out, trans1=trans1, trans2=trans2)
        key = (y.ctypes.data, y.shape, y.strides)
        transposed = self._transposed.get(key)
        if transposed is None:  # two threads may both make it: the same copy either way
            transposed = self._transposed[key] = np.ascontiguousarray(y.T)
        return np.dot(x, transposed) if out is None else np.dot(x, transposed, out=out)


def transpose_weights(nlp: Any) -> int:
    """Give every layer of ``nlp`` that multiplies through numpy's ops (not BLIS) one
    `TransposedWeightOps` over the pipeline's weights; returns how many layers it went to."""
    layers = [layer for _, pipe in nlp.pipeline if hasattr(pipe, "model") for layer in pipe.model.walk()]
    weights = [
        layer.get_param(name) for layer in layers for name in layer.param_names if layer.has_param(name)
    ]
    ops = TransposedWeightOps(weights)
    changed = 0
    for layer in layers:
        if type(layer.ops) is NumpyOps and not layer.ops.use_blis:
            layer.ops = ops
            changed += 1
    return changed
