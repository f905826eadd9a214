"""Published figures on the shared data (skipped cleanly when ../shared/data is absent).

Flickr8k-Expert tau-c x 100 of BLEU-4/ROUGE-L/METEOR/CIDEr within 0.5 of the CLIPScore paper's Table 1;
the judges' agreement figures; PASCAL-50S accuracies against the paper's Table 4 as docs/meta.md's
reproduction note states them (HI and HM reproduced, HC not).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qace.meta.agreement import agreement_report
from qace.meta.baselines import compute_baselines
from qace.meta.correlation import correlate, expand_judgments
from qace.meta.datasets import PASCAL_SEEDS, load_flickr8k_expert, load_pascal50s
from qace.meta.evaluate import mean_accuracy, pascal_baselines
from qace.meta.report import PUBLISHED


def test_flickr8k_protocol_counts(shared_data: Path) -> None:
    data = load_flickr8k_expert(shared_data)
    everything = load_flickr8k_expert(shared_data, standard=False)
    assert len(everything) == 5822 and len(data) == 5664
    assert np.isfinite(data.human).sum() == 16992
    refs = {i: r for i, r in zip(everything.image_ids, everything.references, strict=True)}
    assert len(refs) == 1000 and sorted({len(r) for r in refs.values()}) == [4, 5]


def test_flickr8k_tau_c_targets(shared_data: Path, java: None) -> None:
    data = load_flickr8k_expert(shared_data)
    scores = compute_baselines(data.candidates, data.references, ["bleu4", "rouge_l", "meteor", "cider"])
    for name, values in scores.items():
        x, y, g = expand_judgments(values, data.human)
        tau = 100 * correlate(x, y, "kendall_c", groups=g).value
        assert tau == pytest.approx(PUBLISHED["flickr8k_tau_c"][name], abs=0.5), name


def test_flickr8k_judges(shared_data: Path) -> None:
    data = load_flickr8k_expert(shared_data, standard=False)
    rep = agreement_report(data.human, data.judges)
    assert round(rep.figures["fleiss_kappa"], 2) == 0.52
    gamma = rep.pairwise["gamma"]
    assert gamma["j1-j2"] == pytest.approx(0.996, abs=1e-3)
    assert gamma["j1-j3"] == pytest.approx(0.975, abs=1e-3)
    assert gamma["j2-j3"] == pytest.approx(0.996, abs=1e-3)
    assert gamma["mean"] == pytest.approx(0.989, abs=1e-3)


def test_pascal50s_against_table_4_as_the_reproduction_note_says(shared_data: Path, java: None) -> None:
    """docs/meta.md, "PASCAL-50S: what reproduces the paper": HI and HM within 2 points of Table 4, HC
    5 to 12.5 points below it (the labels here are not the paper's). If HC comes within reach (the
    paper's labels, another protocol), this fails: update the note with the numbers."""
    pairs = load_pascal50s(shared_data)
    assert len(pairs) == 4000 and (pairs.majority() != 0).all()
    runs = pascal_baselines(pairs, ["bleu4", "rouge_l", "meteor", "cider"], seeds=PASCAL_SEEDS)
    for name, by_seed in runs.items():
        assert sorted(by_seed) == list(PASCAL_SEEDS)
        acc = mean_accuracy(list(by_seed.values())).per_category
        paper = PUBLISHED["pascal50s"][name]
        for cat in ("HI", "HM"):
            assert acc[cat] == pytest.approx(paper[cat], abs=2.0), (name, cat)
        assert 5.0 <= paper["HC"] - acc["HC"] <= 12.5, (name, acc["HC"], paper["HC"])
