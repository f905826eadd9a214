"""Tiny random-weight text-to-image pipeline and image encoder for the regeneration score's tests.

Shaped like diffusers' own fast tests (``get_dummy_components`` of StableDiffusionPipeline): a
two-block UNet, a two-block VAE, a two-layer CLIP text encoder and a CLIP tokenizer whose BPE files
are written here, plus a two-layer CLIP vision encoder with projection. Everything is saved with
``save_pretrained`` in the standard layouts, so the judge loads it through the same path as a real
model. Their scores mean nothing: both directories carry ``TEST_MODEL_MARKER``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from qace.testing.qace_models import TEST_MODEL_MARKER, build_once

logger = logging.getLogger(__name__)

"""Written last into the output directory, so a half-built directory is never reused."""
BUILD_VERSION = 1
"""Bump when the recipe changes, so cached builds are rebuilt."""
ROLES = ("generator", "encoder")
IMAGE_SIZE = 32
"""Default generated image side (the VAE halves it once: latents are 16 x 16)."""
START, END = "<|startoftext|>", "<|endoftext|>"
MAX_TOKENS = 77
"""CLIP's text length; Stable Diffusion pads every prompt to it."""
WORDS = (
    "a an the of on in with and is are at to by near two three dog cat man woman girl boy child "
    "people group red blue green yellow white black brown small large young old running sitting "
    "standing playing riding holding walking eating grass field beach street park water snow ball "
    "kite frisbee bike car bus train horse table plate pizza tree sky road room photo picture"
).split()


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte -> printable character map (byte-level BPE works on these)."""
    printable = list(range(ord("!"), ord("~") + 1))
    printable += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


def write_clip_tokenizer(out_dir: str | Path, words: Iterable[str] = WORDS) -> Path:
    """Write ``vocab.json``/``merges.txt``/``tokenizer_config.json`` of a small CLIP BPE tokenizer.

    Every byte (alone and word-final) is a token, so any text tokenises; each of ``words`` becomes one
    token through a left-to-right chain of merges. Built, not trained: identical wherever it is built.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    alphabet = list(bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for token in alphabet + [c + "</w>" for c in alphabet]:
        vocab.setdefault(token, len(vocab))
    merges: list[str] = []
    seen: set[str] = set()
    for word in dict.fromkeys(words):
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        left = pieces[0]
        for right in pieces[1:]:
            pair = f"{left} {right}"
            left += right
            if pair not in seen:
                seen.add(pair)
                merges.append(pair)
                vocab.setdefault(left, len(vocab))
    for special in (START, END):
        vocab[special] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n")
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    config = {
        "tokenizer_class": "CLIPTokenizer",
        "model_max_length": MAX_TOKENS,
        "bos_token": START,
        "eos_token": END,
        "unk_token": END,
        "pad_token": END,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def load_clip_tokenizer(tokenizer_dir: str | Path) -> Any:
    """The tokenizer written by :func:`write_clip_tokenizer`."""
    from transformers import CLIPTokenizer

    return CLIPTokenizer.from_pretrained(str(tokenizer_dir))


def tiny_components(tokenizer: Any, *, seed: int = 0) -> dict[str, Any]:
    """StableDiffusionPipeline components with tiny random weights (seeded per component)."""
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    torch.manual_seed(seed)
    unet: Any = UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=IMAGE_SIZE // 2,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=4,
        norm_num_groups=4,
    )
    torch.manual_seed(seed + 1)
    vae: Any = AutoencoderKL(
        block_out_channels=(8, 16),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        norm_num_groups=4,
        sample_size=IMAGE_SIZE,
    )
    torch.manual_seed(seed + 2)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=MAX_TOKENS,
            bos_token_id=tokenizer.convert_tokens_to_ids(START),
            eos_token_id=tokenizer.convert_tokens_to_ids(END),
            pad_token_id=tokenizer.convert_tokens_to_ids(END),
        )
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return {
        "unet": unet.eval(),
        "vae": vae.eval(),
        "text_encoder": text_encoder.eval(),
        "tokenizer": tokenizer,
        "scheduler": scheduler,
        "safety_checker": None,
        "feature_extractor": None,
        "image_encoder": None,
        "requires_safety_checker": False,
    }


def tiny_image_encoder(*, seed: int = 0) -> tuple[Any, Any]:
    """A CLIP vision encoder with projection (32 px, patch 4) and its image processor config."""
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(seed + 3)
    model = CLIPVisionModelWithProjection(
        CLIPVisionConfig(
            hidden_size=32,
            intermediate_size=37,
            projection_dim=16,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=IMAGE_SIZE,
            patch_size=4,
        )
    )
    processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    return model.eval(), processor


def make_regen_test_models(out_dir: str | Path, *, seed: int = 0, force: bool = False) -> Path:
    """Build ``out_dir/generator`` (diffusers layout) and ``out_dir/encoder`` (transformers layout).

    Reuses a complete build of the same seed and recipe; deterministic (same seed, identical weights);
    a few seconds on 2 CPU cores.
    """
    return build_once(
        out_dir,
        ROLES,
        _build,
        seed=seed,
        version=BUILD_VERSION,
        force=force,
        what="regeneration-score TEST models",
    )


def _build(tmp: Path, seed: int) -> None:
    from diffusers import StableDiffusionPipeline

    tokenizer = load_clip_tokenizer(write_clip_tokenizer(tmp / "bpe"))
    pipe: Any = StableDiffusionPipeline(**tiny_components(tokenizer, seed=seed))
    pipe.save_pretrained(str(tmp / "generator"), safe_serialization=True)
    model, processor = tiny_image_encoder(seed=seed)
    model.save_pretrained(str(tmp / "encoder"), safe_serialization=True)
    processor.save_pretrained(str(tmp / "encoder"))
    for role in ROLES:
        (tmp / role / TEST_MODEL_MARKER).write_text(
            "qace regeneration-score TEST model: random weights, its scores mean nothing\n"
        )
