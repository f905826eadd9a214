"""VisCE² throughput: the engine (per-image context cache, batched ratings) vs the paper's per-caption loop.

    python -m benchmarks.visce2 --out benchmarks/results/visce2_h100.json          # one GPU, ~3-4 min
    python -m benchmarks.visce2 --tiny --out /tmp/visce2_tiny.json                 # CPU smoke test, <1 min

Both sides use the same model in the same process, greedy decoding and fixed-length answers (EOS
suppressed, ``min_new_tokens = max_new_tokens``: context 128 tokens, rating 4), so they do the same
work per answer and the timing compares only how the work is organised:

- **loop** (the release's shape): per caption, the visual context (image + step-1 prompt, one
  ``generate``), then the rating (image + caption + context, one ``generate``), one caption at a time;
- **engine**: `qace.judges.visce2.VisCE2` as users run it (``score`` on image files): each image's
  context once (contexts of different images batched), then all ratings batched, longest first, cut
  by a padded-token budget.

Model: LLaVA-1.5-7B's shapes with random weights, built directly on the GPU in bf16 (Llama 4096 hidden,
32 layers, 11008 FFN, 32 heads, vocabulary 32064; CLIP ViT-L/14 at 336 px; 2-layer GELU projector),
with a constructed tokenizer of the same vocabulary size. Images are drawn with numpy (smooth colour
fields, 336 x 336) and saved as PNG, so the engine side reads files like a user's run. Needs Pillow
(the image processor and `qace.judges.images` use it). The loop runs on the first ``--loop-images``
images; its scores are compared with the engine's on the same captions (no rating counts as a value;
bf16 batched vs one-at-a-time kernels may flip a near-tie, so agreement is reported, not asserted).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.run_info import record
from qace.engine import instrument
from qace.engine.instrument import cuda_sync
from qace.judges.images import load_image
from qace.judges.rating import parse_rating
from qace.judges.visce2 import VisCE2
from qace.judges.visce2_prompts import CONTEXT_PROMPT, RATING_PROMPT
from qace.testing.vlm import (
    IMAGE_TOKEN,
    LLAVA_CHAT_TEMPLATE,
    build_vlm_tokenizer,
    llava_config,
    tiny_llava_config,
)

LLAVA_7B = {
    "text": {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "intermediate_size": 11008,
        "num_attention_heads": 32,
    },
    "vision": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
    },
    "vocab_size": 32064,
    "image_size": 336,
    "patch_size": 14,
}
TINY_VOCAB = 512
CAPTION_WORDS = (
    "a the man woman girl boy dog cat red blue green small large runs sits plays on in near with "
    "beach park street kitchen field ball bike car table grass water snow two three people"
).split()


def build_model(tiny: bool, device: str, dtype: torch.dtype) -> tuple[Any, Any, dict[str, Any]]:
    """(model, processor, shape summary): LLaVA-1.5-7B shapes with random weights, or the tiny test shapes."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    corpus = [CONTEXT_PROMPT, RATING_PROMPT, " ".join(CAPTION_WORDS), "USER ASSISTANT"]
    tokenizer = build_vlm_tokenizer(corpus, size=TINY_VOCAB if tiny else LLAVA_7B["vocab_size"])
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    if tiny:
        config = tiny_llava_config(len(tokenizer), image_token_id, tokenizer.pad_token_id)
        image_size, patch = config.vision_config.image_size, config.vision_config.patch_size
    else:
        image_size, patch = LLAVA_7B["image_size"], LLAVA_7B["patch_size"]
        vision = CLIPVisionConfig(
            **LLAVA_7B["vision"], image_size=image_size, patch_size=patch, projection_dim=768
        )
        text = LlamaConfig(
            **LLAVA_7B["text"],
            num_key_value_heads=32,
            vocab_size=LLAVA_7B["vocab_size"],
            max_position_embeddings=4096,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=tokenizer.pad_token_id,
        )
        config = llava_config(vision, text, image_token_id, tokenizer.pad_token_id)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # random init straight on the GPU, in bf16
            model = LlavaForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    model = model.to(device=device, dtype=dtype).eval()
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(
            size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
        ),
        tokenizer=tokenizer,
        patch_size=patch,
        vision_feature_select_strategy="default",
        chat_template=LLAVA_CHAT_TEMPLATE,
        num_additional_image_tokens=1,
    )
    shapes = {
        "text": {k: getattr(config.text_config, k) for k in LLAVA_7B["text"]},
        "vision": {k: getattr(config.vision_config, k) for k in LLAVA_7B["vision"]},
        "vocab_size": config.text_config.vocab_size,
        "image_size": image_size,
        "image_tokens": (image_size // patch) ** 2,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    return model, processor, shapes


def draw_images(folder: Path, count: int, size: int, seed: int = 0) -> list[str]:
    """``count`` smooth random colour fields with a few blobs, as PNG files (numpy drawing, Pillow I/O)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    paths = []
    for i in range(count):
        base = rng.uniform(0, 255, 3) * (1 - yy[..., None]) + rng.uniform(0, 255, 3) * yy[..., None]
        for _ in range(3):
            cx, cy, r = rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8), rng.uniform(0.05, 0.2)
            inside = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
            base[inside] = rng.uniform(0, 255, 3)
        path = folder / f"img{i:04d}.png"
        Image.fromarray(base.astype(np.uint8)).save(path)
        paths.append(str(path))
    return paths


def make_captions(count: int, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(CAPTION_WORDS, size=int(rng.integers(5, 16)))) for _ in range(count)]


def run_loop(scorer: VisCE2, captions: list[str], images: list[str], args: argparse.Namespace) -> list[str]:
    """The paper's loop: per caption, context then rating, one ``generate`` each, no reuse, no batching."""
    runner = scorer.runner
    answers = []
    for caption, path in zip(captions, images, strict=True):
        image = load_image(path)
        context = runner.generate([runner.encode(image, CONTEXT_PROMPT)], args.context_tokens)[0].text
        prompt = RATING_PROMPT.format(caption=caption, context=context)
        answers.append(runner.generate([runner.encode(image, prompt)], args.rating_tokens)[0].text)
    return answers


def _timed(fn: Any) -> tuple[Any, float]:
    cuda_sync()
    start = time.perf_counter()
    result = fn()
    cuda_sync()
    return result, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.visce2", description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on the CPU: a smoke test (<1 min)")
    parser.add_argument("--images", type=int, help="images for the engine side (default 32; tiny: 4)")
    parser.add_argument(
        "--loop-images", type=int, help="images for the per-caption loop (default 6; tiny: 2)"
    )
    parser.add_argument("--captions-per-image", type=int, default=5)
    parser.add_argument("--context-tokens", type=int, help="fixed context length (default 128; tiny: 16)")
    parser.add_argument("--rating-tokens", type=int, default=4, help="fixed rating answer length")
    parser.add_argument("--batch-tokens", type=int, default=65536, help="padded tokens per generate call")
    parser.add_argument("--batch-rows", type=int, default=64, help="rows per generate call")
    parser.add_argument("--device", help="default: cuda if available, else cpu (tiny: cpu)")
    parser.add_argument("--out", type=Path, help="write the JSON here (it is always printed)")
    args = parser.parse_args(argv)
    tiny = args.tiny
    args.images = args.images or (4 if tiny else 32)
    args.loop_images = min(args.loop_images or (2 if tiny else 6), args.images)
    args.context_tokens = args.context_tokens or (16 if tiny else 128)
    device = args.device or ("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    precision = "fp32" if device == "cpu" else "bf16"
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    if not tiny and device == "cpu":
        raise SystemExit("the full benchmark needs a GPU (7B weights); use --tiny on the CPU")

    torch.manual_seed(0)
    model, processor, shapes = build_model(tiny, device, dtype)
    scorer = VisCE2.from_model(
        model,
        processor,
        fingerprint="random-llava-1.5-7b-shapes" if not tiny else "random-tiny-llava",
        test_model=True,
        device=device,
        precision=precision,
        context_tokens=args.context_tokens,
        rating_tokens=args.rating_tokens,
        max_batch_tokens=args.batch_tokens,
        max_batch_rows=args.batch_rows,
        chunk_size=args.images * args.captions_per_image,
        progress=False,
    )
    instrument.attach(scorer.runner, full_length=True)
    per = args.captions_per_image
    with tempfile.TemporaryDirectory() as tmp:
        files = draw_images(Path(tmp), args.images, shapes["image_size"])
        images = [f for f in files for _ in range(per)]
        captions = make_captions(len(images))
        loop_n = args.loop_images * per
        run_loop(scorer, captions[:1], images[:1], args)  # warm-up: CUDA context, kernels, allocator
        scorer.score(captions[:2], images[:2])
        scorer.contexts = type(scorer.contexts)()

        loop_answers, loop_s = _timed(lambda: run_loop(scorer, captions[:loop_n], images[:loop_n], args))
        rows, engine_s = _timed(lambda: scorer.score(captions, images))
    loop_scores = [None if (p := parse_rating(a)) is None else float(p.value) for a in loop_answers]
    same = sum(r.get("visce2") == v for r, v in zip(rows[:loop_n], loop_scores, strict=True))
    engine_cps = len(captions) / engine_s
    loop_cps = loop_n / loop_s
    result = {
        "benchmark": "visce2",
        **record("benchmarks.visce2", argv, device=device, packages=("transformers",)),
        "device": device,
        "precision": precision,
        "tiny": tiny,
        "model": shapes,
        "context_tokens": args.context_tokens,
        "rating_tokens": args.rating_tokens,
        "fixed_lengths": True,
        "captions_per_image": per,
        "engine": {
            "images": args.images,
            "captions": len(captions),
            "seconds": round(engine_s, 6),
            "captions_per_s": round(engine_cps, 3),
            "contexts_computed": scorer.contexts.computed,
            "batch_tokens": args.batch_tokens,
            "batch_rows": args.batch_rows,
            "scored": sum("visce2" in r for r in rows),
            "no_rating": sum("error" in r for r in rows),
        },
        "loop": {
            "images": args.loop_images,
            "captions": loop_n,
            "seconds": round(loop_s, 6),
            "captions_per_s": round(loop_cps, 3),
            "contexts_computed": loop_n,
            "scored": sum(v is not None for v in loop_scores),
        },
        "speedup": round(engine_cps / loop_cps, 2),
        "scores_identical_on_loop_captions": f"{same}/{loop_n}",
        "signature": scorer.signature,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
