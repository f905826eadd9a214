"""Regeneration score throughput: batched pipeline calls vs one caption at a time, same run, same models.

    python -m benchmarks.regen --out benchmarks/results/regen_h100.json          # one GPU, ~1-2 minutes
    python -m benchmarks.regen --tiny --out /tmp/regen-tiny.json                 # CPU smoke run, seconds

Models: Stable-Diffusion-1.5-shaped random weights (UNet 320/640/1280/1280 channels, cross-attention
768, CLIP-L text encoder shape, the standard VAE, PNDM scheduler) and a CLIP ViT-L/14-shaped vision
encoder, initialised directly on the device in ``--precision`` (bf16 by default: random weights can
overflow fp16). Workload: distinct captions, one random 512 x 512 original image each (stored as
``.npy`` and read with ``np.load``; generated images stay tensors), classifier-free guidance 7.5.
Needs torch, transformers and diffusers (which itself imports Pillow: bring its wheel too).

Both runs go through ``RegenScore`` end to end (original image read + embedding, generation, 8-bit
quantisation, embedding of the generated image, cosine) with one shared set of models:
``batched`` calls the pipeline with ``--batch`` captions at once; ``sequential`` with one. The
sequential run scores the first ``--sequential-captions`` captions of the batched run, so the report
also gives the largest score difference batching makes (reduced precision rounds differently per
batch size; in fp32 on the CPU it is zero up to float rounding). Warm-up calls are not timed.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.run_info import record
from qace.engine.instrument import cuda_sync
from qace.judges.regen import RegenScore
from qace.judges.regen_loading import ImageEncoder, Preprocess
from qace.precision import TORCH_PRECISIONS, torch_dtype

log = logging.getLogger(__name__)

TARGET_RATIO = 3.0
"""The issue's goal: batched images/s at least 3x one caption at a time."""
CLIP_L_PREPROCESS = {
    "size": {"shortest_edge": 224},
    "crop_size": {"height": 224, "width": 224},
    "do_center_crop": True,
    "resample": 3,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
"""openai/clip-vit-large-patch14's preprocessor_config.json (the fields that matter)."""
_WORDS = {
    "adj": ["young", "old", "small", "large", "red", "blue", "white", "black", "brown", "green"],
    "subj": ["dog", "cat", "man", "woman", "girl", "boy", "child", "horse", "bird", "group of people"],
    "verb": ["running", "sitting", "standing", "playing", "walking", "jumping", "eating", "riding"],
    "place": ["on the grass", "on the beach", "in the snow", "near the water", "in a park", "on a street"],
}


def captions(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct COCO-like captions (seeded)."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        pick = {k: rng.choice(v) for k, v in _WORDS.items()}
        out[f"a {pick['adj']} {pick['subj']} {pick['verb']} {pick['place']} {rng.randint(1, 9)}"] = None
    return list(out)


def sd15_pipeline(device: str, dtype: torch.dtype, tokenizer_dir: Path) -> Any:
    """StableDiffusionPipeline with SD-1.5 shapes and random weights, built on ``device``."""
    from diffusers import AutoencoderKL, PNDMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from qace.testing.regen import END, START, load_clip_tokenizer, write_clip_tokenizer

    tokenizer = load_clip_tokenizer(write_clip_tokenizer(tokenizer_dir))
    torch.manual_seed(0)
    with torch.device(device):
        unet: Any = UNet2DConditionModel(sample_size=64, cross_attention_dim=768)  # defaults: SD-1.x
        vae: Any = AutoencoderKL(
            block_out_channels=(128, 256, 512, 512),
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            layers_per_block=2,
            latent_channels=4,
            sample_size=512,
        )
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=49408,
                hidden_size=768,
                intermediate_size=3072,
                num_hidden_layers=12,
                num_attention_heads=12,
                max_position_embeddings=77,
                hidden_act="quick_gelu",
                bos_token_id=tokenizer.convert_tokens_to_ids(START),
                eos_token_id=tokenizer.convert_tokens_to_ids(END),
                pad_token_id=tokenizer.convert_tokens_to_ids(END),
            )
        )
    scheduler = PNDMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        skip_prk_steps=True,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    pipe: Any = StableDiffusionPipeline(
        unet=unet.to(dtype).eval(),
        vae=vae.to(dtype).eval(),
        text_encoder=text_encoder.to(dtype).eval(),
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def clip_l_encoder(device: str, dtype: torch.dtype) -> ImageEncoder:
    """A CLIP ViT-L/14-shaped vision encoder with projection, random weights, built on ``device``."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    torch.manual_seed(1)
    with torch.device(device):
        model = CLIPVisionModelWithProjection(
            CLIPVisionConfig(
                hidden_size=1024,
                intermediate_size=4096,
                num_hidden_layers=24,
                num_attention_heads=16,
                image_size=224,
                patch_size=14,
                projection_dim=768,
                hidden_act="quick_gelu",
            )
        )
    return ImageEncoder(model, Preprocess.from_config(CLIP_L_PREPROCESS), device=device, dtype=dtype)


def tiny_models(models_dir: Path, device: str, dtype: torch.dtype) -> tuple[Any, ImageEncoder]:
    """The tests' tiny random models, built or reused in ``models_dir``, loaded the judge's real way."""
    from qace.judges.regen_loading import load_generator
    from qace.testing.regen import make_regen_test_models

    models = make_regen_test_models(models_dir)
    pipe = load_generator(str(models / "generator"), device=device, dtype=dtype)
    return pipe, ImageEncoder.load(str(models / "encoder"), device=device, dtype=dtype)


def _timed(judge: RegenScore, texts: list[str], paths: list[str]) -> tuple[float, list[dict[str, Any]]]:
    cuda_sync()
    start = time.perf_counter()
    rows = judge.score(texts, images=paths)
    cuda_sync()
    return time.perf_counter() - start, rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    device, dtype = args.device, torch_dtype(args.precision)
    n_total = args.captions + args.warmup_captions
    texts = captions(n_total)
    t_setup = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="regen-bench-") as tmp_name:
        tmp = Path(tmp_name)
        rng = np.random.default_rng(0)
        paths = []
        for i in range(n_total):
            path = tmp / f"original-{i}.npy"
            np.save(path, rng.integers(0, 256, (args.original_size, args.original_size, 3), dtype=np.uint8))
            paths.append(str(path))
        if args.tiny:
            models_dir = Path(args.models_dir) if args.models_dir else tmp / "regen-test-models"
            pipe, encoder = tiny_models(models_dir, device, dtype)
        else:
            pipe, encoder = sd15_pipeline(device, dtype, tmp / "tokenizer"), clip_l_encoder(device, dtype)
        setup_s = time.perf_counter() - t_setup

        def judge(batch: int) -> RegenScore:
            return RegenScore(
                pipeline=pipe,
                encoder=encoder,
                image_reader=np.load,
                generator="random-sd15" if not args.tiny else "tiny-random",
                image_encoder="random-clip-vit-l14" if not args.tiny else "tiny-random",
                steps=args.steps,
                size=args.size,
                guidance=args.guidance,
                precision=args.precision,
                device=device,
                batch_size=batch,
                chunk_size=max(args.captions, 1),
                progress=False,
            )

        warm, timed = slice(args.captions, n_total), slice(0, args.captions)
        # warm-up: kernels, cuDNN/cuBLAS heuristics and the allocator, at both batch shapes (not timed)
        judge(args.batch).score(texts[warm][: args.batch], images=paths[warm][: args.batch])
        judge(1).score(texts[warm][:1], images=paths[warm][:1])

        batched_s, batched = _timed(judge(args.batch), texts[timed], paths[timed])
        m = min(args.sequential_captions, args.captions)
        sequential_s, sequential = _timed(judge(1), texts[:m], paths[:m])
        signature = judge(args.batch).signature
    batched_rate = args.captions / batched_s
    sequential_rate = m / sequential_s
    scores = [row["regen"] for row in batched]
    diffs = [abs(a["regen"] - b["regen"]) for a, b in zip(batched[:m], sequential, strict=True)]
    return {
        "benchmark": "regen",
        **record("benchmarks.regen", args.argv, device=device, packages=("diffusers", "transformers")),
        "tiny": args.tiny,
        "device": device,
        "precision": args.precision,
        "steps": args.steps,
        "size": args.size,
        "guidance": args.guidance,
        "batch": args.batch,
        "captions_batched": args.captions,
        "captions_sequential": m,
        "images_per_s": {"batched": round(batched_rate, 4), "sequential": round(sequential_rate, 4)},
        "seconds": {
            "batched": round(batched_s, 3),
            "sequential": round(sequential_s, 3),
            "setup": round(setup_s, 3),
        },
        "ratio": round(batched_rate / sequential_rate, 3),
        "target_ratio": TARGET_RATIO,
        "target_met": None if args.tiny else batched_rate / sequential_rate >= TARGET_RATIO,
        "mean_regen": float(np.mean(scores)),
        "max_abs_diff_batched_vs_sequential": max(diffs, default=0.0),
        "nonfinite_images": sum("nonfinite_image" in row["flags"] for row in batched),
        "signature": signature,
        "note": "random weights: the scores mean nothing; timing includes original read + embedding, "
        "generation, generated-image embedding and cosine",
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.regen", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON report path")
    p.add_argument("--tiny", action="store_true", help="tiny random models on the CPU (smoke run)")
    p.add_argument("--device", help="default: cuda (cpu with --tiny)")
    p.add_argument("--precision", choices=sorted(TORCH_PRECISIONS), help="default: bf16 (fp32 with --tiny)")
    p.add_argument("--steps", type=int, help="denoising steps (default 20; 2 with --tiny)")
    p.add_argument("--size", type=int, help="image side (default 512; 32 with --tiny)")
    p.add_argument("--guidance", type=float, default=7.5)
    p.add_argument("--batch", type=int, help="captions per pipeline call (default 16; 4 with --tiny)")
    p.add_argument("--captions", type=int, help="captions in the batched run (default 96; 12 with --tiny)")
    p.add_argument(
        "--sequential-captions", type=int, help="captions one at a time (default 16; 4 with --tiny)"
    )
    p.add_argument("--original-size", type=int, help="side of the random originals (default 512; 48 tiny)")
    p.add_argument(
        "--models-dir", help="--tiny: where to build or reuse the tiny models (default: a temp dir)"
    )
    args = p.parse_args(argv)
    tiny = args.tiny
    defaults = {
        "device": "cpu" if tiny else "cuda",
        "precision": "fp32" if tiny else "bf16",
        "steps": 2 if tiny else 20,
        "size": 32 if tiny else 512,
        "batch": 4 if tiny else 16,
        "captions": 12 if tiny else 96,
        "sequential_captions": 4 if tiny else 16,
        "original_size": 48 if tiny else 512,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.warmup_captions = args.batch
    args.argv = argv
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available; use --tiny for a CPU smoke run", file=sys.stderr)
        return 2
    report = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    rates = report["images_per_s"]
    print(
        f"regen: batched {rates['batched']:.2f} images/s, one at a time {rates['sequential']:.2f} images/s, "
        f"ratio {report['ratio']:.2f}x (target {TARGET_RATIO}x) -> {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
