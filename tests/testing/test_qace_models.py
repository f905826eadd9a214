"""Tiny test models: tokenizer conventions, useful (varied, EOS-terminated) outputs, determinism."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer, T5ForConditionalGeneration

from qace.errors import ConfigError
from qace.models.loading import checkpoint_fingerprint
from qace.testing import qace_models
from qace.testing.qace_models import TEST_MODEL_MARKER, make_test_models

CAPTIONS = [
    "a young girl in a red dress runs on the beach",
    "a old man in a blue coat sits on the grass with a yellow kite",
    "two dogs play with a ball in the park",
    "a little boy in a green hat walks on the street",
]
QG_PROMPTS = [
    "answer: young girl  context: a young girl in a red dress runs on the beach </s>",
    "answer: red dress  context: a young girl in a red dress runs on the beach </s>",
    "answer: yellow kite  context: a old man in a blue coat sits on the grass with a yellow kite </s>",
    "answer: park  context: two dogs play with a ball in the park </s>",
    "answer: green  context: a little boy in a green hat walks on the street </s>",
]
TQA_PROMPTS = [
    f"question: {q}  context: {c} </s>"
    for q in ("what is the girl wearing ?", "who sits on the grass ?", "where does the boy walk ?")
    for c in CAPTIONS
]


def _generate(model_dir, prompts: list[str]) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = T5ForConditionalGeneration.from_pretrained(model_dir).eval()
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_length=32, num_beams=1, do_sample=False)
    return out.tolist()


def test_layout_and_markers(test_models_dir) -> None:
    for role in ("qg", "tqa", "vqa"):
        path = test_models_dir / role
        for name in ("config.json", "model.safetensors", "tokenizer.json", TEST_MODEL_MARKER):
            assert (path / name).is_file(), f"{role}/{name}"
        config = json.loads((path / "config.json").read_text())
        assert config["qace_test_model"] is True and config["model_type"] == "t5"
        assert (config["decoder_start_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 1, 0)


def test_tokenizer_conventions(test_models_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    assert len(tokenizer(["unanswerable"], add_special_tokens=False)["input_ids"][0]) == 1
    ids = tokenizer(QG_PROMPTS[0])["input_ids"]
    assert ids[-2:] == [1, 1]  # the literal "</s>" in the prompt is EOS, then the appended EOS
    vqa_config = json.loads((test_models_dir / "vqa" / "config.json").read_text())
    assert vqa_config["image_prefix_ids"] == tokenizer("image :", add_special_tokens=False)["input_ids"]


def test_outputs_vary_and_end_early(test_models_dir) -> None:
    for role, prompts in (("qg", QG_PROMPTS), ("tqa", TQA_PROMPTS)):
        outputs = _generate(test_models_dir / role, prompts)
        assert len({tuple(o) for o in outputs}) >= 3, role
        lengths = {o.index(1) for o in outputs}
        assert all(1 in o and o.index(1) < 20 for o in outputs), role
        if role == "qg":
            assert len(lengths) >= 2
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    answers = tokenizer.batch_decode(
        _generate(test_models_dir / "tqa", TQA_PROMPTS), skip_special_tokens=True
    )
    assert "unanswerable" in answers and any(a != "unanswerable" for a in answers)


def test_a_complete_build_is_reused_not_rebuilt(test_models_dir, monkeypatch) -> None:
    def rebuild(*args: object) -> None:
        raise AssertionError("a complete build was built again")

    monkeypatch.setattr(qace_models, "_build_all", rebuild)
    assert make_test_models(test_models_dir) == test_models_dir


def test_refuses_to_overwrite_real_models(tmp_path) -> None:
    (tmp_path / "qg").mkdir()
    (tmp_path / "qg" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a qace test model"):
        make_test_models(tmp_path)


def test_build_is_deterministic(tmp_path, test_models_dir) -> None:
    again = make_test_models(tmp_path / "again", force=True)
    for role in ("qg", "tqa", "vqa"):
        assert checkpoint_fingerprint(again / role) == checkpoint_fingerprint(test_models_dir / role), role
    assert _generate(again / "qg", QG_PROMPTS) == _generate(test_models_dir / "qg", QG_PROMPTS)


def test_tokenizer_is_identical_across_processes() -> None:
    """Separate processes (different hash seeds, thread pools) build byte-identical tokenizers."""
    import subprocess
    import sys

    code = (
        "from qace.testing.qace_models import build_tokenizer;"
        "t = build_tokenizer(['a young girl runs on the beach', 'question: what ?']);"
        "print(t.backend_tokenizer.to_str())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**__import__("os").environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
