"""A tiny, deterministic LLaVA-style vision-language model for VisCE² tests and offline demos.

Random weights, built locally in the standard Hugging Face layout (config, safetensors weights, a
constructed tokenizer, a ``CLIPImageProcessor`` and a chat template), so ``AutoProcessor`` and
``AutoModelForImageTextToText`` load it from the directory like any hub LLaVA. The tokenizer splits
numbers into single digits as Llama's does, and the output head is tilted towards digits, spaces
and end-of-sequence, so the greedy outputs hold numbers often enough to exercise rating parsing,
the expected rating and the no-rating error path. Its scores mean nothing: the directory carries
the same marker file as the QACE test models, so the CLI warns loudly.
"""

from __future__ import annotations

import argparse
import logging
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from qace.testing.qace_models import TEST_MODEL_MARKER, _deterministic, build_once

logger = logging.getLogger(__name__)

BUILD_VERSION = 1
"""Bump when the recipe changes, so cached builds are rebuilt."""
IMAGE_TOKEN = "<image>"
IMAGE_SIZE = 32
PATCH_SIZE = 8
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<image>\n' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}"
    "{% if message['role'] == 'user' %} {% else %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
"""LLaVA-1.5's conversation format (``USER: <image>\\n{prompt} ASSISTANT:``), as llava-hf ships it."""

_SCENE_WORDS = (
    "a an the girl boy man woman child dog cat red blue green yellow brown white dress shirt jacket "
    "helmet beach sand sea ocean water waves park grass field frisbee ball bicycle bike city street "
    "road cars car building kitchen women cooking pasta food stove counter sofa snow runs running "
    "jumps plays sleeps riding object objects features relationship colour color shape size texture "
    "left right near next behind front top image caption rating score good bad yes no"
)
INIT_RANGE = 0.5
"""Weight scale; far above the usual 0.02, so answers depend on the caption and image, not only the prompt."""
DIGIT_BOOST = 1.5
"""Output-head rows of digits are scaled by this, so random greedy outputs often contain numbers."""
SPACE_AND_EOS_BOOST = 1.5
"""Rows of the word boundary and end-of-sequence, so numbers end and outputs stop."""


def build_vlm_tokenizer(corpus: Sequence[str], *, size: int | None = None):  # noqa: ANN201
    """A Llama-style tokenizer built from a word list: ``<s>`` added in front, digits split one by one.

    Built, not trained, so every build is identical. Corpus words are single pieces; other words fall
    back to characters. ``size`` pads the vocabulary with filler pieces (``▁w1``, ``▁w2``, ...) to a
    real model's size, so every id a random model emits decodes to text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for line in corpus for w in re.findall(r"[A-Za-z]+", line)})
    specials = ["<unk>", "<s>", "</s>", "<pad>", IMAGE_TOKEN]
    vocab: list[tuple[str, float]] = [(s, 0.0) for s in specials] + [("▁", -3.0)]
    vocab += [(f"▁{w}", -2.0) for w in words]
    vocab += [(d, -2.0) for d in string.digits]
    vocab += [(p, -2.0) for p in string.punctuation] + [(f"▁{p}", -2.0) for p in string.punctuation]
    vocab += [(c, -10.0) for c in string.ascii_letters]
    vocab += [(f"▁w{i}", -12.0) for i in range(1, (size or 0) - len(vocab) + 1)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Metaspace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )


def tiny_llava_config(vocab_size: int, image_token_id: int, pad_token_id: int):  # noqa: ANN201
    """LLaVA-1.5's architecture (CLIP tower, 2-layer GELU projector, Llama) at toy sizes."""
    from transformers import CLIPVisionConfig, LlamaConfig

    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        projection_dim=32,
        initializer_range=INIT_RANGE,
    )
    text = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=pad_token_id,
        initializer_range=INIT_RANGE,
    )
    config = llava_config(vision, text, image_token_id, pad_token_id, qace_test_model=True)
    config.initializer_range = INIT_RANGE
    return config


def llava_config(vision: Any, text: Any, image_token_id: int, pad_token_id: int, **extra: Any):  # noqa: ANN201
    """A ``LlavaConfig`` wired as LLaVA-1.5 is (2-layer GELU projector, second-to-last vision layer,
    CLS dropped), for any tower sizes: the test VLM's and the benchmark's 7B shapes."""
    from transformers import LlavaConfig

    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=image_token_id,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        pad_token_id=pad_token_id,
        **extra,
    )


def _corpus() -> list[str]:
    from qace.judges import visce2_prompts as prompts

    return [*prompts.ALL_PROMPTS, _SCENE_WORDS, "USER ASSISTANT"]


def _build(tmp: Path, seed: int) -> None:
    from transformers import CLIPImageProcessor, LlavaForConditionalGeneration, LlavaProcessor

    out = tmp / "vlm"

    tokenizer = build_vlm_tokenizer(_corpus())
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    config = tiny_llava_config(len(tokenizer), image_token_id, tokenizer.pad_token_id)
    with _deterministic(seed):
        model = LlavaForConditionalGeneration(config).eval()
    _tilt_output_head(model, tokenizer)
    model.generation_config.max_new_tokens = 32
    model.save_pretrained(out)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_CHAT_TEMPLATE,
        num_additional_image_tokens=1,
    )
    processor.save_pretrained(out)
    (out / TEST_MODEL_MARKER).write_text(
        f"qace test VLM (LLaVA-style, seed {seed}): tiny with random weights.\n"
        "VisCE² scores computed with it are meaningless; use it only for tests and smoke runs.\n"
    )


def _tilt_output_head(model: torch.nn.Module, tokenizer: object) -> None:
    """Scale the output-head rows of digits, the word boundary and EOS (see the constants above)."""
    head = model.get_output_embeddings().weight  # type: ignore[operator]
    digits = tokenizer.convert_tokens_to_ids(list(string.digits))  # type: ignore[attr-defined]
    others = tokenizer.convert_tokens_to_ids(["▁", "</s>"])  # type: ignore[attr-defined]
    with torch.no_grad():
        head[digits] *= DIGIT_BOOST
        head[others] *= SPACE_AND_EOS_BOOST


def make_test_vlm(out_dir: str | Path, *, seed: int = 0, force: bool = False) -> Path:
    """Build the tiny VLM into ``out_dir/vlm`` unless a complete build of ``seed`` is there; return it.

    Deterministic (same seed, same weights) and about a second on a laptop CPU.
    """
    out = build_once(
        out_dir, ("vlm",), _build, seed=seed, version=BUILD_VERSION, force=force, what="qace TEST VLM"
    )
    return out / "vlm"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m qace.testing.vlm DIR``: build (or reuse) the tiny test VLM."""
    parser = argparse.ArgumentParser(prog="python -m qace.testing.vlm", description=main.__doc__)
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    print(make_test_vlm(args.out_dir, seed=args.seed, force=args.force))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
