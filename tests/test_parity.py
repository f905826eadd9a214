"""Parity: the engine's questions, answers and scores equal the plain reference implementation's.

Both run the same tiny trained test models in fp32; the reference (written from the spec, importing nothing
from ``qace``; BERTScore from the ``bert-score`` package) calls Hugging Face ``generate`` once per input
(the release's loop), the engine batches, de-duplicates and decodes on its own. Marked ``gpu``: the engine
on the GPU (its Triton kernels and CUDA graphs, fp32) against the same reference on the CPU. The engine
runs in one process (no host or spaCy processes): `tests/metric/test_host_processes.py` holds the engine
core to these rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from qace.api import QACE
from qace.data.features import RandomFeatureStore
from tests.helpers import flickr_records
from tests.reference_pool import ReferencePool

N_CAPTIONS = 200
COMPONENTS = ("qace", "qace_f1", "qace_bs", "qace_an", "qace_max")
TOLERANCE = 2e-6
"""fp32 answerability differs from per-input ``generate`` by up to about 1e-6: batched and single-input matrix
products round differently, and MKL's choice of kernel also depends on the process's allocation history
(one full-suite run measured 1.25e-6 on a single per-question value; isolated runs stay under 8e-7). Texts
must match exactly."""
GPU_TOLERANCE = 1e-5
"""The engine on a GPU (fp32, its Triton kernels and CUDA graphs) against the reference on the CPU: other
kernels, other rounding; texts must still match exactly."""
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def reference(test_models_dir):
    """``reference(records, variant)``: the reference's rows, computed in a pool of processes."""
    pytest.importorskip("spacy")
    pytest.importorskip("bert_score")
    pool = ReferencePool(test_models_dir)
    yield pool.rows
    pool.close()


def _compare(rows, expected_rows, tolerance=TOLERANCE):
    for row, exp in zip(rows, expected_rows, strict=True):
        questions = row["explanation"]["questions"]
        assert [q["question"] for q in questions] == exp["questions"], row["id"]
        assert [q["answer_on_caption"] for q in questions] == exp["answer_on_caption"], row["id"]
        contexts = range(len(exp["answers_on_context"]))
        got_ctx = [[q["answers_on_context"][c] for q in questions] for c in contexts]
        assert got_ctx == exp["answers_on_context"], row["id"]
        for key in COMPONENTS:
            assert row[key] == pytest.approx(exp[key], abs=tolerance), (row["id"], key)
        for key in ("f1", "bs", "an"):
            got = np.array([q[key] for q in questions]).T if questions else np.zeros((0, 0))
            np.testing.assert_allclose(got.reshape(exp[key].shape), exp[key], rtol=0, atol=tolerance)


@pytest.fixture(scope="module")
def engine(test_models_dir):
    """The engine of a variant on a device, built once per module: the tests of a variant share its
    loading and, on a GPU, its kernels' compiles and graph captures."""
    built = {}

    def get(variant, device):
        if (variant, device) not in built:
            features = {"features": RandomFeatureStore(seed=0)} if variant == "img" else {}
            built[variant, device] = QACE(
                models=test_models_dir,
                variant=variant,
                device=device,
                precision="fp32",
                explain=True,
                progress=False,
                max_batch_rows=48,
                host_workers=0,
                spacy_workers=0,
                **features,
            )
        return built[variant, device]

    yield get
    for scorer in built.values():
        scorer.close()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_refs", [1, 5])
def test_qace_ref_matches_reference(engine, reference, n_refs, device):
    records = flickr_records(N_CAPTIONS, refs=n_refs)
    rows = list(engine("ref", device).score_records(records))
    expected = reference(records, "ref")
    _compare(rows, expected, TOLERANCE if device == "cpu" else GPU_TOLERANCE)
    assert sum(row["n_questions"] for row in rows) > N_CAPTIONS  # the test models do ask questions
    assert len({q for e in expected for q in e["questions"]}) > 50  # and they differ


@pytest.mark.parametrize("device", DEVICES)
def test_qace_img_matches_reference(engine, reference, device):
    records = flickr_records(N_CAPTIONS)
    rows = list(engine("img", device).score_records(records))
    expected = reference(records, "img")
    _compare(rows, expected, TOLERANCE if device == "cpu" else GPU_TOLERANCE)
    answers = {a for e in expected for ctx in e["answers_on_context"] for a in ctx}
    assert len(answers) > 3
