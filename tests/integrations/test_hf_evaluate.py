"""Hugging Face evaluate door: the metric folder loads offline and scores through the shared engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from qace.errors import ConfigError, InputError
from qace.integrations import evaluate_metric_path
from qace.integrations.shared import shared_reward

PREDICTIONS = ["a girl runs on the beach", "a dog in the snow", ""]
REFERENCES = [
    ["a girl in a red dress runs on the beach", "a child plays near the sea"],
    ["a dog runs through snow"],
    ["a cat"],
]


@pytest.fixture(scope="module")
def metric(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("HF_EVALUATE_OFFLINE", "1")
        mp.setenv("HF_MODULES_CACHE", str(tmp_path_factory.mktemp("modules")))
        evaluate = pytest.importorskip("evaluate")
        mp.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
        mp.setattr(evaluate.config, "HF_HUB_OFFLINE", True, raising=False)
        yield evaluate.load(str(evaluate_metric_path()), cache_dir=str(tmp_path_factory.mktemp("cache")))


def test_compute_equals_the_shared_scorer(metric, test_models_dir: Path) -> None:  # noqa: ANN001
    out = metric.compute(predictions=PREDICTIONS, references=REFERENCES, models=str(test_models_dir))
    reward = shared_reward(models=str(test_models_dir), variant="ref")
    want = reward.score(PREDICTIONS, references=REFERENCES)
    assert out["scores"] == pytest.approx([r.reward for r in want], abs=1e-6)
    assert out["scores"][2] == 0.0 and out["scores"][0] > 0.0
    assert out["qace"] == pytest.approx(sum(out["scores"]) / 3)
    assert out["qace_bs"] == pytest.approx(sum(r.scores.get("qace_bs", 0.0) for r in want) / 3)
    assert out["signature"] == reward.signature and out["signature"].startswith("QACE-Ref|")
    # one reference string per prediction is the other input form
    single = metric.compute(
        predictions=PREDICTIONS[1:],
        references=["a dog runs through snow", "a cat"],
        models=str(test_models_dir),
    )
    assert single["scores"] == pytest.approx(out["scores"][1:], abs=1e-6)


def test_card_states_the_signature() -> None:
    card = (evaluate_metric_path() / "README.md").read_text()
    assert "qace.compute(predictions: list[str], references: list[list[str] | str]" in card
    assert '"signature"' in card


def test_bad_settings_and_missing_references(metric, test_models_dir: Path) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match="variant"):
        metric.compute(predictions=["a dog"], references=["a dog"], variant="both")
    with pytest.raises(InputError, match="sample 0"):
        metric.compute(predictions=["a dog"], references=[[]], models=str(test_models_dir))
