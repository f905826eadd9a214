"""ScorerReward: any scorer as a reward (here the toy metric of `tests.toy_scorer`, no models)."""

from __future__ import annotations

import pytest

from qace.errors import ConfigError, InputError
from qace.reward import ScorerReward
from tests.toy_scorer import CaptionLength


def test_rewards_components_and_invalid_captions() -> None:
    reward = ScorerReward(CaptionLength(), reads="image", columns=("length",), invalid_reward=-1.0)
    results = reward.score(["a dog runs", "", 7], images=["a.png", "b.png", "c.png"])
    assert [(r.reward, r.valid) for r in results] == [(3.0, True), (-1.0, False), (-1.0, False)]
    assert results[0].scores == {"length": 3.0} and results[0].row is not None
    assert reward(["one two"], images=["a.png"]).tolist() == [2.0]
    assert reward.name == "Length" and reward.component == "length" and reward.logged == ()
    with pytest.raises(ConfigError, match="choose one of length"):
        reward(["a"], images=["a.png"], component="qace")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_non_finite_invalid_reward_is_refused(value) -> None:
    with pytest.raises(ConfigError, match="give a finite number"):
        ScorerReward(CaptionLength(), reads="image", columns=("length",), invalid_reward=value)


def test_a_missing_context_is_a_caller_bug() -> None:
    reward = ScorerReward(CaptionLength(), reads="image", columns=("length",))
    with pytest.raises(InputError, match=r"Length rewards need images=\[\.\.\.\]"):
        reward(["a dog"])
    with pytest.raises(InputError, match="sample 1.*missing image file"):
        reward(["a dog", "a cat"], images=["a.png", " "])
    with pytest.raises(InputError, match="got 2 captions but 1 images"):
        reward(["a dog", "a cat"], images=["a.png"])
