"""TRL's own ``GRPOTrainer`` trains a tiny local policy for two steps on CPU with QACE as its reward.

Checked against what the trainer itself recorded: every (prompt, completion, reward) it logged is recomputed
with the references of that prompt, so a reward attached to the wrong completion fails the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

import pyarrow as pa  # noqa: E402
from datasets import Dataset, load_dataset  # noqa: E402
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from qace.data.features import RandomFeatureStore  # noqa: E402
from qace.reward import QACEReward, completion_text  # noqa: E402

REFS = {
    "a girl on the beach": ["a girl in a red dress runs on the beach", "a child plays near the sea"],
    "a dog in the snow": ["a brown dog runs through the snow", "a dog plays in the white snow"],
}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "rewards.md"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def _policy(test_models_dir: Path) -> tuple[Any, Any]:
    """A random one-layer GPT-2 over the test models' 392-token vocabulary (built here, no hub)."""
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "qg")
    tokenizer.chat_template = CHAT_TEMPLATE
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=128,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                        bos_token_id=tokenizer.eos_token_id)  # fmt: skip
    return GPT2LMHeadModel(config), tokenizer


class Record(TrainerCallback):
    """What the trainer logged for each step: its prompts, completions and rewards per function."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self.steps: list[tuple[list[Any], list[Any], dict[str, list[float]]]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        logs = self.trainer._logs
        rewards = {name: list(values) for name, values in logs["rewards"].items()}
        self.steps.append((list(logs["prompt"]), list(logs["completion"]), rewards))


def _train(
    reward: QACEReward, test_models_dir: Path, tmp_path: Path, rows: list[dict[str, Any]] | Dataset
) -> Record:
    model, tokenizer = _policy(test_models_dir)
    config = GRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, num_generations=4,
        max_completion_length=8, learning_rate=1e-3, beta=0.0, use_cpu=True, report_to="none",
        logging_steps=1, save_strategy="no", seed=0, temperature=1.0,
    )  # fmt: skip
    record = Record()
    trainer = GRPOTrainer(model=model, reward_funcs=[reward.trl_reward_func()], args=config,
                          train_dataset=rows if isinstance(rows, Dataset) else Dataset.from_list(rows),
                          processing_class=tokenizer,
                          callbacks=[record])  # fmt: skip
    record.trainer = trainer
    trainer.train()
    return record


def _text(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


@pytest.mark.parametrize("chat", [False, True], ids=["string-prompts-one-reference", "chat-prompts-lists"])
def test_grpo_trains_with_qace_ref_rewards_on_the_right_completions(
    test_models_dir: Path, tmp_path: Path, chat: bool
) -> None:
    """String prompts with one reference per row as a plain string; chat prompts with reference lists."""
    reward = QACEReward(models=test_models_dir)
    refs = REFS if chat else {key: refs[:1] for key, refs in REFS.items()}
    rows = [
        {"prompt": [{"role": "user", "content": key}] if chat else key, "references": r if chat else r[0]}
        for key, r in refs.items()
    ]
    record = _train(reward, test_models_dir, tmp_path, rows)
    assert len(record.steps) == 2
    history = record.trainer.state.log_history
    assert all("qace_f1" in h and "qace_an" in h for h in history if "loss" in h)  # one pass, logged
    scored = []
    for prompts, completions, rewards in record.steps:
        assert len(completions) == 4 and list(rewards) == ["qace_ref_qace"]
        captions = [completion_text(c) for c in completions]
        want = reward(captions, references=[refs[_text(p)] for p in prompts]).tolist()
        assert rewards["qace_ref_qace"] == pytest.approx(want, abs=1e-6)
        scored += want
    assert len(set(scored)) > 1  # the random policy's completions get different rewards


def test_grpo_trains_with_qace_img_rewards(test_models_dir: Path, tmp_path: Path) -> None:
    features = RandomFeatureStore()
    reward = QACEReward(models=test_models_dir, variant="img", features=features)
    images = {"a girl on the beach": "img-1", "a dog in the snow": "img-2"}
    rows = [{"prompt": prompt, "image_id": image} for prompt, image in images.items()]
    record = _train(reward, test_models_dir, tmp_path, rows)
    for prompts, completions, rewards in record.steps:
        captions = [completion_text(c) for c in completions]
        want = reward(captions, image_ids=[images[p] for p in prompts]).tolist()
        assert rewards["qace_img_qace"] == pytest.approx(want, abs=1e-6)


def test_a_references_column_mixing_strings_and_lists_fails_in_arrow_as_the_docs_say() -> None:
    """A ``Dataset`` column holds one type: ``from_list`` refuses one reference as a string beside a list,
    whichever comes first, with the messages the TRL section of docs/rewards.md quotes."""
    one, many = {"references": "a dog"}, {"references": ["a cat", "a kitten"]}
    section = DOCS.read_text().split("### TRL", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    trl_section = " ".join(section.split())  # as a reader sees it, lines joined
    for rows, error, message in [
        ([one, many], pa.ArrowTypeError, "Expected bytes, got a 'list' object"),
        ([many, one], pa.ArrowInvalid, "cannot mix list and non-list, non-null values"),
    ]:
        with pytest.raises(error, match=message):
            Dataset.from_list(rows)
        assert message in trl_section


def test_grpo_takes_a_json_file_mixing_string_and_list_references(
    test_models_dir: Path, tmp_path: Path
) -> None:
    """``load_dataset("json")`` reads a column of strings and lists as a ``Json`` feature: each row's value
    comes as written, and the reward takes both."""
    refs = {
        "a girl on the beach": REFS["a girl on the beach"][:1],
        "a dog in the snow": REFS["a dog in the snow"],
    }
    rows = [{"prompt": "a girl on the beach", "references": refs["a girl on the beach"][0]},
            {"prompt": "a dog in the snow", "references": refs["a dog in the snow"]}]  # fmt: skip
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    dataset = load_dataset("json", data_files=str(data), split="train", cache_dir=str(tmp_path / "cache"))
    assert type(dataset.features["references"]).__name__ == "Json"
    reward = QACEReward(models=test_models_dir)
    record = _train(reward, test_models_dir, tmp_path / "out", dataset)
    for prompts, completions, rewards in record.steps:
        want = reward(
            [completion_text(c) for c in completions], references=[refs[p] for p in prompts]
        ).tolist()
        assert rewards["qace_ref_qace"] == pytest.approx(want, abs=1e-6)
