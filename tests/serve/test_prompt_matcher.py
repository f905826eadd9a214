"""Where an OpenRLHF query's completion starts (`qace.serve.openrlhf.PromptMatcher`), with a real T5
tokenizer (the test models')."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from qace.serve.openrlhf import MAX_PATTERN_CHARS, PromptMatcher


@pytest.fixture(scope="module")
def t5(test_models_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(test_models_dir / "qg")


def _query(tokenizer: Any, prompt: str, completion: str) -> str:
    """The query as OpenRLHF builds it: the prompt's and the completion's ids decoded together."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids += tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize(
    "prompt",
    [
        "Describe the image: ",
        "Describe  the\nimage:\t",
        "Caption «this» image — briefly: ",
        "Ünïcode ﬁ café: ",
    ],
)
@pytest.mark.parametrize("completion", ["", "a girl runs on the beach", "\u200b"])
def test_the_completion_is_found_as_the_policy_tokenizer_decodes_the_prompt(
    t5: Any, prompt: str, completion: str
) -> None:
    query = _query(t5, prompt, completion)
    want = t5.decode(t5(completion, add_special_tokens=False)["input_ids"], skip_special_tokens=True).strip()
    assert PromptMatcher(t5).completion(query, prompt) == want


def test_without_the_tokenizer_whitespace_and_end_markers_still_match() -> None:
    matcher = PromptMatcher()
    assert matcher.completion("Describe the image:</s>", "Describe the image: ") == ""
    assert matcher.completion("Describe the\timage:  a dog</s><pad>", "Describe  the\nimage: ") == "a dog"
    assert matcher.completion("Describe the image: <unk>", "Describe the image: ") == ""
    assert matcher.completion("<unk>n<unk>code: a dog</s>", "Ünïcode: ") is None  # only the tokenizer knows
    assert matcher.completion("Other: a dog", "Describe: ") is None


def test_odd_prompts_never_raise(t5: Any) -> None:
    matcher = PromptMatcher(t5)
    assert matcher.completion("a \ud800 prompt: a dog", "a \ud800 prompt: ") == "a dog"
    long = "word " * (MAX_PATTERN_CHARS // 4)
    assert matcher.completion(long.replace(" ", "  ") + "a dog", long) is None  # too long to match loosely
    assert matcher.completion(long + "a dog", long) == "a dog"
