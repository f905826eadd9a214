"""`TransposedWeightOps`: products by a weight's transpose through a contiguous copy, anything else as
numpy's ops do it, and a pipeline that parses as spaCy's own load does."""

from __future__ import annotations

import numpy as np
from thinc.api import NumpyOps

from qace.metric.candidates import load_spacy
from qace.metric.spacy_ops import TransposedWeightOps
from tests.helpers import flickr_records


def test_a_product_by_a_weights_transpose_reads_a_copy_and_anything_else_is_numpys():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((3, 4, 6), dtype=np.float32)  # thinc reshapes it to (12, 6) to multiply
    other = rng.standard_normal((12, 6), dtype=np.float32)
    x = rng.standard_normal((5, 6), dtype=np.float32)
    ops, plain = TransposedWeightOps([weight]), NumpyOps(use_blis=False)
    shaped = weight.reshape(12, 6)
    np.testing.assert_allclose(ops.gemm(x, shaped, trans2=True), x @ shaped.T, rtol=1e-5, atol=1e-5)
    assert ops.copies == 1
    out = np.empty((5, 12), np.float32)
    assert ops.gemm(x, shaped, out=out, trans2=True) is out and ops.copies == 1  # the copy is kept
    np.testing.assert_allclose(out, x @ shaped.T, rtol=1e-5, atol=1e-5)
    # not one of the weights, or not by a transpose: numpy's ops, bit for bit, and no copy
    assert np.array_equal(ops.gemm(x, other, trans2=True), plain.gemm(x, other, trans2=True))
    square = rng.standard_normal((6, 6), dtype=np.float32)
    ops = TransposedWeightOps([square])
    assert np.array_equal(ops.gemm(x, square), plain.gemm(x, square)) and ops.copies == 0


def test_the_pipeline_multiplies_by_copies_and_parses_as_spacys_own_load():
    odd = ["", " ", "  a dog  runs ", "A man\n\nin a hat .", "I did it , he had one", "caf\u00e9 na\u00efve"]
    captions = odd + [r.caption for r in flickr_records(300)]
    fast, stock = load_spacy(), load_spacy(blis=True, pos_rules=False, transposed_weights=False)
    ops = fast.get_pipe("tok2vec").model.ops
    assert isinstance(ops, TransposedWeightOps) and ops.copies == 0
    read = ("POS", "TAG", "DEP", "HEAD", "ENT_IOB", "ENT_TYPE")
    parsed = [d.to_array(list(read)).tolist() for d in fast.pipe(captions)]
    assert ops.copies > 0  # the parse did multiply by the copies
    assert parsed == [d.to_array(list(read)).tolist() for d in stock.pipe(captions)]
    assert not isinstance(stock.get_pipe("tok2vec").model.ops, TransposedWeightOps)
