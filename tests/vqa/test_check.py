"""``qace models check``: the authors' demo example on the models at hand, and the `real_models` marker."""

from __future__ import annotations

import numpy as np
import pytest

from qace.cli import main
from qace.errors import FeatureError
from qace.vqa import check
from qace.vqa.check import TEXT_PAIRS, VISUAL_PAIRS, CheckResult, StageCheck
from tests.helpers import SHARED_DATA, random_regions


def write_npz(path, seed: int = 0):
    features, boxes = random_regions(seed)
    np.savez(path, features=features, norm_bb=boxes)
    return path


def result(text=TEXT_PAIRS, visual=VISUAL_PAIRS, precision="fp32", hints=()) -> CheckResult:
    stages = [StageCheck("QG+TQA on the caption", TEXT_PAIRS, list(text))]
    stages.append(StageCheck("Visual-T5 on butd_sample.npz", VISUAL_PAIRS, list(visual)))
    return CheckResult(stages, ["two men", "horses", "ground"], precision, list(hints))


@pytest.mark.real_models
def test_the_papers_models_reproduce_the_authors_demo(monkeypatch) -> None:
    shared = SHARED_DATA / "region_features" / "butd_sample.npz"
    features = shared if shared.is_file() else check.SAMPLE_FEATURES
    missing = check.missing_real_models(features)
    if missing:
        pytest.skip("real models absent: " + "; ".join(missing))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    outcome = check.check_models(features=features)
    assert outcome.ok, check.report(outcome)


def test_pairs_compare_as_sets_in_any_order() -> None:
    outcome = result(text=reversed(TEXT_PAIRS), visual=reversed(VISUAL_PAIRS))
    assert outcome.ok and outcome.causes() == []
    assert outcome.verdict().startswith("verdict: MATCH")


def test_each_mismatch_names_its_likely_cause() -> None:
    other_questions = [("Who rides?", "men"), *TEXT_PAIRS[1:]]
    assert "wrong QG checkpoint" in result(text=other_questions).verdict()
    other_answer = [*TEXT_PAIRS[:2], ("Where are the horses?", "field")]
    verdict = result(text=other_answer).verdict()
    assert "wrong TQA checkpoint" in verdict and "QG" not in verdict
    other_visual = [*VISUAL_PAIRS[:2], ("Where are the horses?", "ground")]
    verdict = result(visual=other_visual, precision="bf16").verdict()
    assert "wrong Visual-T5 checkpoint" in verdict and "precision bf16" in verdict
    assert "TQA" not in verdict
    lines = result(visual=other_visual).stages[1].lines()
    assert any("'field'" in line and "'ground'" in line and "differs" in line for line in lines)


def test_test_models_fail_the_check_with_tokenizer_and_checkpoint_causes(
    test_models_dir, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    features = write_npz(tmp_path / "butd_sample.npz")
    assert main(["models", "check", str(test_models_dir), "--features", str(features)]) == 1
    out = capsys.readouterr().out
    assert "Two men are riding horses on the ground" in out
    for question, answer in TEXT_PAIRS + VISUAL_PAIRS:
        assert f"{question!r}: expected {answer!r}" in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("verdict: MISMATCH") and "wrong tokenizer for QG" in verdict
    assert "wrong Visual-T5 checkpoint" in verdict


def test_bad_arguments_fail_before_any_model_loads(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["models", "check", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["models", "check", "--features", str(tmp_path / "none.npz")]) == 2
    assert check.SAMPLE_FEATURES_URL in capsys.readouterr().err


def test_sample_features_are_downloaded_once_unless_offline(tmp_path, monkeypatch) -> None:
    source = write_npz(tmp_path / "release.npz", seed=3)
    monkeypatch.setattr(check, "SAMPLE_FEATURES_URL", source.as_uri())
    monkeypatch.setattr(check, "SAMPLE_FEATURES", tmp_path / "cache" / "butd_sample.npz")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FeatureError, match="HF_HUB_OFFLINE"):
        check.sample_features(None)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    regions = check.sample_features(None)
    assert regions.shape == (36, 2054) and (tmp_path / "cache" / "butd_sample.npz").is_file()
    with np.load(source) as data:
        np.testing.assert_allclose(regions[:, :2048], data["features"])
