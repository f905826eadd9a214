"""QACEReward: tensor rewards, invalid captions, components, TRL and SCST adapters, the SCST example."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qace.data.features import RandomFeatureStore
from qace.errors import ConfigError, InputError
from qace.reward import QACEReward, completion_text

REPO = Path(__file__).resolve().parents[2]
REFS = ["a girl in a red dress runs on the beach", "a child plays near the sea"]


@pytest.fixture(scope="module")
def reward(test_models_dir: Path) -> QACEReward:
    return QACEReward(models=test_models_dir)


def test_tensor_matches_scorer_and_invalid_captions_get_zero(reward: QACEReward) -> None:
    captions = ["a girl runs on the beach", "", "   ", None, "the the the", "a dog in the snow"]
    values = reward(captions, references=[REFS] * len(captions))
    assert values.shape == (6,) and values.dtype == torch.float32 and str(values.device) == "cpu"
    want = reward.scorer.score([captions[0], captions[5]], references=[REFS, REFS])
    assert values[0].item() == pytest.approx(want[0]["qace"], abs=1e-6)
    assert values[5].item() == pytest.approx(want[1]["qace"], abs=1e-6)
    assert values[1:5].tolist() == [0.0, 0.0, 0.0, 0.0]
    results = reward.score(captions, references=[REFS] * len(captions))
    assert [r.valid for r in results] == [True, False, False, False, True, True]
    assert results[1].reason == "empty or whitespace-only caption" and "NoneType" in results[3].reason
    assert results[4].row["flags"] == ["no_questions"]  # a real caption without candidates: 0.0 by the spec


def test_invisible_and_invalid_unicode_captions_are_invalid(reward: QACEReward) -> None:
    """Zero-width, format or control characters alone show nothing: invalid, like an empty caption (they
    used to pass and score as a caption). A lone surrogate, which JSON can carry, is invalid instead of
    failing the whole batch in spaCy."""
    captions = [
        "\u200b",
        "\u200b\u200d\ufeff",
        "\x00\x07\x1b",
        " \u200b\n\u2060 ",
        "a dog \ud800 runs",
        "a\u200bdog",
    ]
    results = reward.score([*captions, "a girl runs on the beach"], references=[REFS] * (len(captions) + 1))
    assert [r.valid for r in results] == [False] * 5 + [True, True]
    assert [r.reward for r in results[:5]] == [0.0] * 5
    assert all("invisible characters" in r.reason for r in results[:4])
    assert results[4].reason.startswith("caption holds a lone surrogate (\\ud800 at character 7)")
    assert results[6].reward == pytest.approx(reward(["a girl runs on the beach"], references=[REFS]).item())


def test_contexts_that_are_not_valid_unicode_raise_naming_the_sample(reward: QACEReward) -> None:
    """A lone surrogate in a reference used to fail the batch inside the tokenizer (TypeError)."""
    with pytest.raises(InputError, match=r"sample 1.*a reference holds a lone surrogate \(\\udc00"):
        reward(["a dog", "a cat"], references=[REFS, ["a cat \udc00"]])


def test_caption_over_the_scorer_limit_is_invalid_not_a_crash(reward: QACEReward) -> None:
    """A runaway 1.2 MB generation (spaCy's E088 used to raise) is invalid, with or without max_chars."""
    huge = "a dog " * 200_000
    for max_chars in (None, 5_000_000):
        results = reward.score([huge, "a girl on the beach"], references=[REFS, REFS], max_chars=max_chars)
        assert [r.valid for r in results] == [False, True]
        assert results[0].reason == "caption has 1200000 characters; the limit is 100000"


def test_only_unscorable_captions_do_not_crash(reward: QACEReward) -> None:
    assert reward(["the the the", "a a"], references=[REFS, REFS]).tolist() == [0.0, 0.0]
    assert reward(["", " "], references=[REFS, REFS]).tolist() == [0.0, 0.0]


def test_components_and_settings(reward: QACEReward, test_models_dir: Path) -> None:
    results = reward.score(["a girl runs on the beach"], references=[REFS])[0]
    f1 = reward(["a girl runs on the beach"], references=[REFS], component="qace_f1")
    assert f1.item() == pytest.approx(results.scores["qace_f1"])
    assert set(results.scores) == {"qace", "qace_f1", "qace_bs", "qace_an", "qace_max"}
    with pytest.raises(ConfigError):
        reward(["a"], references=[REFS], component="bleu")
    with pytest.raises(ConfigError):
        QACEReward(reward.scorer, device="cpu")
    custom = QACEReward(reward.scorer, invalid_reward=-1.0)
    assert custom([""], references=[REFS]).tolist() == [-1.0]
    with pytest.raises(ConfigError, match="give a finite number"):  # before any model would load
        QACEReward(models="/nonexistent/models", invalid_reward=float("nan"))


def test_missing_context_is_a_caller_bug(reward: QACEReward) -> None:
    with pytest.raises(InputError, match="references"):
        reward(["a dog"])
    with pytest.raises(InputError, match="sample 1"):
        reward(["a dog", "a cat"], references=[REFS, []])
    with pytest.raises(InputError, match="got 2 captions but 1 references"):
        reward(["a dog", "a cat"], references=[REFS])


def test_trl_reward_func(reward: QACEReward) -> None:
    func = reward.trl_reward_func()
    assert func.__name__ == "qace_ref_qace"
    completions = [
        "a girl runs on the beach</s>",
        [{"role": "assistant", "content": "a dog in the snow"}],
        "",
    ]
    got = func(prompts=["p"] * 3, completions=completions, references=[REFS] * 3, completion_ids=None)
    want = reward(["a girl runs on the beach", "a dog in the snow", ""], references=[REFS] * 3).tolist()
    assert got == pytest.approx(want) and isinstance(got[0], float)
    with pytest.raises(InputError, match="column"):
        func(prompts=["p"], completions=["a dog"], image_id=["x"])
    assert completion_text("a cat <|im_end|><|endoftext|>") == "a cat"


def test_trl_reward_func_takes_a_single_reference_string(reward: QACEReward) -> None:
    func = reward.trl_reward_func()
    got = func(prompts=["p"] * 2, completions=["a girl runs", "a dog"], references=REFS[:1] * 2)
    assert got == pytest.approx(reward(["a girl runs", "a dog"], references=[REFS[:1]] * 2).tolist())


def test_trl_reward_func_logs_the_components_from_one_pass(reward: QACEReward, monkeypatch) -> None:
    calls, metrics, extra = [], {}, {}
    score_records = reward.scorer.score_records
    monkeypatch.setattr(reward.scorer, "score_records", lambda r: calls.append(1) or score_records(r))
    captions = ["a girl runs on the beach", "", "a dog in the snow"]
    got = reward.trl_reward_func()(
        prompts=["p"] * 3, completions=captions, references=[REFS] * 3,
        log_metric=metrics.__setitem__, log_extra=extra.__setitem__,
    )  # fmt: skip
    assert len(calls) == 1
    rows = reward.score(captions, references=[REFS] * 3)
    assert got == pytest.approx([r.reward for r in rows])
    for name in ("qace_f1", "qace_bs", "qace_an"):
        assert extra[name] == [rows[0].scores[name], None, rows[2].scores[name]]
        assert metrics[name] == pytest.approx((rows[0].scores[name] + rows[2].scores[name]) / 2)


def test_scst_advantages(reward: QACEReward) -> None:
    sampled = ["a girl runs on the beach", "", "a dog in the snow", "a child near the sea"]
    greedy = ["a girl on the beach", "a dog"]
    refs = [REFS, ["a dog runs in the snow"]]
    adv = reward.scst(sampled, greedy, references=refs)
    r_s = reward(sampled, references=[REFS, REFS, refs[1], refs[1]])
    r_g = reward(greedy, references=refs)
    assert adv.tolist() == pytest.approx((r_s - r_g.repeat_interleave(2)).tolist(), abs=1e-6)
    with pytest.raises(InputError):
        reward.scst(sampled[:3], greedy, references=refs)


def test_img_variant_reads_image_ids(test_models_dir: Path) -> None:
    reward = QACEReward(models=test_models_dir, variant="img", features=RandomFeatureStore())
    func = reward.trl_reward_func(component="qace_an")
    values = func(prompts=None, completions=["a dog on the grass", ""], image_id=["img1", 7])
    assert len(values) == 2 and values[1] == 0.0 and 0.0 <= values[0] <= 1.0
    with pytest.raises(InputError, match="image id"):
        reward(["a dog"], image_ids=[None])
    with pytest.raises(ConfigError):
        QACEReward(reward.scorer, component="qace_max")


def test_scst_example_runs(test_models_dir: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "scst_train.py"),
            "--models",
            str(test_models_dir),
            "--steps",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "step 2:" in done.stdout and "greedy QACE" in done.stdout
