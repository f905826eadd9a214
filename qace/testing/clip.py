"""A tiny random-weight CLIP (Transformers' ``CLIPModel``) for the CLIP-S / PAC-S tests and demo.

Two text layers and two vision layers of width 32 (32 px images, patch 4), the small CLIP BPE
tokenizer of `qace.testing.regen.write_clip_tokenizer`, and a ``CLIPImageProcessor`` (shortest edge
32, centre crop 32), saved with ``save_pretrained`` in the standard layout, so the scorer loads it
through the same path as ``openai/clip-vit-base-patch32``. Its scores mean nothing: the directory
carries ``TEST_MODEL_MARKER``. ``python -m qace.testing.clip DIR`` builds one.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from qace.testing.qace_models import TEST_MODEL_MARKER, build_once
from qace.testing.regen import END, IMAGE_SIZE, MAX_TOKENS, START, load_clip_tokenizer, write_clip_tokenizer

BUILD_VERSION = 1
"""Bump when the recipe changes, so cached builds are rebuilt."""
ROLE = "clip"


def tiny_clip(tokenizer: Any, *, seed: int = 0) -> Any:
    """A ``CLIPModel`` with tiny random weights (deterministic for a seed)."""
    import torch
    from transformers import CLIPConfig, CLIPModel

    end = tokenizer.convert_tokens_to_ids(END)
    text = {
        "vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": MAX_TOKENS,
        "bos_token_id": tokenizer.convert_tokens_to_ids(START), "eos_token_id": end, "pad_token_id": end,
    }  # fmt: skip
    vision = {
        "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
        "image_size": IMAGE_SIZE, "patch_size": 4,
    }  # fmt: skip
    torch.manual_seed(seed)
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    return CLIPModel(config).eval()


def make_clip_test_model(out_dir: str | Path, *, seed: int = 0, force: bool = False) -> Path:
    """Build ``out_dir/clip`` (model, tokenizer, image processor) and return that directory.

    Reuses a complete build of the same seed and recipe; deterministic; about a second on 2 CPU cores.
    """
    return (
        build_once(
            out_dir, (ROLE,), _build, seed=seed, version=BUILD_VERSION, force=force, what="CLIP TEST model"
        )
        / ROLE
    )


def _build(tmp: Path, seed: int) -> None:
    from transformers import CLIPImageProcessor

    out = tmp / ROLE
    tokenizer = load_clip_tokenizer(write_clip_tokenizer(tmp / "bpe"))
    tiny_clip(tokenizer, seed=seed).save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    size = {"shortest_edge": IMAGE_SIZE}
    CLIPImageProcessor(size=size, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(out)
    (out / TEST_MODEL_MARKER).write_text("qace CLIP TEST model: random weights, its scores mean nothing\n")


if __name__ == "__main__":
    print(make_clip_test_model(sys.argv[1] if len(sys.argv) > 1 else "clip-test-model"))
