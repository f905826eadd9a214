"""CLIP-S throughput on one GPU: the embedding pass over JPEG files, then captions with cached image
embeddings, against torchmetrics' ``CLIPScore`` loop in the same run, on the same model.

    python -m benchmarks.clip --out benchmarks/results/clip_h100.json     # one GPU, ~1-2 minutes
    python -m benchmarks.clip --tiny --out /tmp/clip-tiny.json            # CPU smoke run, seconds

Model: ViT-B/32-shaped ``CLIPModel`` with random weights (text: 12 layers of 512, vision: 12 layers of
768, patch 32, 224 px, projection 512), built here (no download); the tokenizer is qace's small CLIP
BPE, whose words are single tokens, so captions have real CLIP lengths (about 15 tokens with the
prompt). Workload: ``--images`` random JPEG files (500 x 375, smooth colour fields and shapes, quality
90) and ``--captions`` distinct captions over them.

- ``images_per_s``: `ClipEncoder.image_embeddings` over every file, cold cache: decoding, resizing and
  cropping in ``--workers`` processes, the vision tower on the GPU.
- ``captions_per_s``: `ClipScore.score_records` over every caption once the image embeddings are
  cached (CLIP-S: tokenising, text tower, cosine, rows).
- ``baseline``: torchmetrics' ``CLIPScore`` as users run it, ``update(images, captions)`` per batch of
  ``--baseline-batch`` (images already decoded to uint8 tensors, which favours it), on the first
  ``--baseline-captions`` captions, fp32 (its default), and its agreement with ours at w = 100 without
  the prompt, one caption at a time. Needs torchmetrics (pure Python: carry its wheel and
  lightning-utilities'); without it the baseline is null.

Each precision of ``--precisions`` is measured on its own copy of the model; warm-up calls are not timed.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import run_info
from benchmarks.clip_reference import tensor_features
from qace.data.records import Record
from qace.judges.clip import ClipScore
from qace.judges.clip_images import ClipPixels
from qace.judges.clip_model import ClipEncoder

TARGET_CAPTIONS_PER_S = 20_000
"""The issue's goal: CLIP-S captions/s on one H100 with cached image embeddings."""


def preprocess(side: int) -> dict[str, Any]:
    """openai/clip-vit-base-patch32's preprocessor_config.json (the fields that matter) at ``side`` px."""
    return {
        "size": {"shortest_edge": side}, "crop_size": {"height": side, "width": side}, "resample": 3,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    }  # fmt: skip


_WORDS = {
    "adj": ["young", "old", "small", "large", "red", "blue", "white", "black", "brown", "green"],
    "subj": ["dog", "cat", "man", "woman", "girl", "boy", "child", "horse", "people", "group"],
    "verb": ["running", "sitting", "standing", "playing", "walking", "eating", "riding", "holding"],
    "place": ["grass", "field", "beach", "street", "park", "water", "snow", "road", "room", "table"],
    "thing": ["ball", "kite", "frisbee", "bike", "car", "bus", "train", "plate", "pizza", "tree"],
}


def captions(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct captions of 8-12 words from the tokenizer's vocabulary."""
    rng = np.random.default_rng(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        w = {k: v[int(rng.integers(len(v)))] for k, v in _WORDS.items()}
        a, b = _WORDS["adj"][int(rng.integers(10))], _WORDS["adj"][int(rng.integers(10))]
        out[f"a {a} {w['subj']} {w['verb']} with a {b} {w['thing']} near the {w['adj']} {w['place']}"] = None
    return list(out)


def write_images(folder: Path, n: int, size: tuple[int, int], seed: int = 0) -> list[str]:
    """``n`` JPEG files: a smooth two-colour gradient with a few filled shapes each."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    width, height = size
    ramp = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    paths = []
    for i in range(n):
        a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        pixels = (a * (1 - ramp) + b * ramp).repeat(height, axis=0).astype(np.uint8)
        image = Image.fromarray(pixels)
        draw = ImageDraw.Draw(image)
        for _ in range(4):
            x, y = int(rng.integers(width)), int(rng.integers(height))
            draw.ellipse((x, y, x + 60, y + 40), fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
        path = folder / f"{i:05d}.jpg"
        image.save(path, quality=90)
        paths.append(str(path))
    return paths


def vit_b32(tokenizer: Any) -> Any:
    """A ViT-B/32-shaped CLIPModel with random weights (fp32, CPU)."""
    from transformers import CLIPConfig, CLIPModel

    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    text = {"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
            "num_attention_heads": 8, "max_position_embeddings": 77, "eos_token_id": end, "pad_token_id": end,
            "bos_token_id": tokenizer.convert_tokens_to_ids("<|startoftext|>")}  # fmt: skip
    vision = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
              "num_attention_heads": 12, "image_size": 224, "patch_size": 32}  # fmt: skip
    torch.manual_seed(0)
    return CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=512)).eval()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _ours(args: argparse.Namespace, base: Any, tokenizer: Any, precision: str, paths: list[str],
          records: list[Record]) -> dict[str, Any]:  # fmt: skip
    """Embedding pass from JPEG files, then CLIP-S over every caption with cached embeddings."""
    pixels = ClipPixels.from_config(preprocess(args.side))
    name = "random-vit-b32" if not args.tiny else "tiny-random-clip"
    encoder = ClipEncoder(copy.deepcopy(base), tokenizer, pixels, name=name, fingerprint=name,
                          device=args.device, precision=precision, workers=args.workers)  # fmt: skip
    try:
        encoder.image_embeddings(paths[: args.image_batch], args.image_batch)  # warm-up (workers start)
        encoder.forget_images()
        _sync(args.device)
        start = time.perf_counter()
        encoder.image_embeddings(paths, args.image_batch)
        _sync(args.device)
        image_s = time.perf_counter() - start
        scorer = ClipScore(encoder=encoder, model=name, device=args.device, precision=precision,
                           chunk_size=args.chunk, text_batch=args.text_batch, image_batch=args.image_batch,
                           progress=False)  # fmt: skip
        list(scorer.score_records(records[: args.chunk]))  # warm-up
        _sync(args.device)
        start = time.perf_counter()
        rows = list(scorer.score_records(records))
        _sync(args.device)
        caption_s = time.perf_counter() - start
        where = where_the_time_goes(scorer, records, args.device)
    finally:
        encoder.close()
    scores = [row["clip_s"] for row in rows if isinstance(row, dict)]
    assert len(scores) == len(records), "a benchmark caption was not scored"
    return {
        "images_per_s": round(len(paths) / image_s, 2),
        "captions_per_s": round(len(records) / caption_s, 2),
        "seconds": {"images": round(image_s, 3), "captions": round(caption_s, 3)},
        "mean_clip_s": float(np.mean(scores)),
        "signature": scorer.signature,
        "where_the_time_goes": where,
    }


def where_the_time_goes(scorer: ClipScore, records: list[Record], device: str) -> dict[str, Any]:
    """One more caption pass, profiled (so slower than the timed one): the GPU's kernel seconds (the union
    of their intervals) against the wall, and the host functions of qace and the tokenizer with the most
    cumulative seconds (Python's profiler: every call pays its overhead, so read the shares)."""
    import cProfile
    import pstats

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    host = cProfile.Profile()
    on_gpu = device.startswith("cuda")
    with profile(activities=[ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]) as kernels:
        start = time.perf_counter()
        host.enable()
        list(scorer.score_records(records))
        host.disable()
        _sync(device)
        wall = time.perf_counter() - start
    busy, end = 0, -1
    spans = sorted(
        (e.start_ns(), e.start_ns() + e.duration_ns())
        for e in kernels.profiler.kineto_results.events()
        if on_gpu and e.device_type() == DeviceType.CUDA
    )
    for lo, hi in spans:
        busy += max(0, hi - max(lo, end))
        end = max(end, hi)
    stats = pstats.Stats(host).stats  # type: ignore[attr-defined]
    ours = [
        (f"{Path(where).parent.name}/{Path(where).name}:{name}", row[3])
        for (where, _, name), row in stats.items()
        if "/qace/" in where or "tokenizers" in where
    ]
    top = sorted(ours, key=lambda item: -item[1])[:15]
    return {
        "captions": len(records),
        "wall_s_profiled": round(wall, 3),
        "gpu_kernel_s": round(busy / 1e9, 3) if on_gpu else None,
        "gpu_kernels": len(spans) if on_gpu else None,
        "host_cumulative_s": {name: round(seconds, 3) for name, seconds in top},
    }


def _baseline(args: argparse.Namespace, base: Any, tokenizer: Any, paths: list[str],
              records: list[Record]) -> dict[str, Any] | None:  # fmt: skip
    """torchmetrics' CLIPScore loop (fp32) and its agreement with ours (w 100, no prompt)."""
    try:
        from torchmetrics.multimodal.clip_score import CLIPScore
    except ImportError:
        return None
    from PIL import Image
    from transformers import CLIPImageProcessor, CLIPProcessor

    model = tensor_features(copy.deepcopy(base))
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(**preprocess(args.side)), tokenizer=tokenizer
    )
    metric = CLIPScore(model_name_or_path=lambda: (model, processor)).to(args.device)
    decoded = {p: torch.from_numpy(np.array(Image.open(p).convert("RGB"))).permute(2, 0, 1) for p in paths}
    subset = records[: args.baseline_captions]
    batches = [subset[i : i + args.baseline_batch] for i in range(0, len(subset), args.baseline_batch)]

    def update(batch: list[Record]) -> None:
        metric.update([decoded[r.image or ""].to(args.device) for r in batch], [r.caption for r in batch])

    update(batches[0])  # warm-up
    metric.reset()
    _sync(args.device)
    start = time.perf_counter()
    for batch in batches:
        update(batch)
    _sync(args.device)
    seconds = time.perf_counter() - start
    pixels = ClipPixels.from_config(preprocess(args.side))
    encoder = ClipEncoder(
        copy.deepcopy(base), tokenizer, pixels, name="x", fingerprint="x", device=args.device
    )
    ours = ClipScore(encoder=encoder, model="x", w=100.0, prompt="", device=args.device, progress=False)
    check = subset[: args.agreement_captions]
    mine = [row["clip_s"] if isinstance(row, dict) else float("nan") for row in ours.score_records(check)]
    theirs = []
    for record in check:
        metric.reset()
        update([record])
        theirs.append(float(metric.compute()))
    return {
        "captions": len(subset),
        "batch": args.baseline_batch,
        "precision": "fp32",
        "captions_per_s": round(len(subset) / seconds, 2),
        "seconds": round(seconds, 3),
        "agreement_captions": len(check),
        "max_abs_diff_at_w100": max(abs(a - b) for a, b in zip(mine, theirs, strict=True)),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from qace.testing.regen import load_clip_tokenizer, write_clip_tokenizer

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="clip-bench-") as tmp_name:
        tmp = Path(tmp_name)
        tokenizer = load_clip_tokenizer(write_clip_tokenizer(tmp / "bpe"))
        if args.tiny:
            from qace.testing.clip import tiny_clip

            base = tiny_clip(tokenizer)
        else:
            base = vit_b32(tokenizer)
        paths = write_images(tmp, args.images, (500, 375) if not args.tiny else (64, 48))
        texts = captions(args.captions)
        records = [Record(str(i), text, image=paths[i % len(paths)]) for i, text in enumerate(texts)]
        setup_s = time.perf_counter() - t0
        results = {p: _ours(args, base, tokenizer, p, paths, records) for p in args.precisions}
        baseline = _baseline(args, base, tokenizer, paths, records)
    best = max(r["captions_per_s"] for r in results.values())
    return {
        "benchmark": "clip",
        **run_info.record(
            "benchmarks.clip", args.argv, device=args.device, packages=("transformers", "torchmetrics", "PIL")
        ),
        "tiny": args.tiny,
        "device": args.device,
        "workers": args.workers,
        "images": args.images,
        "captions": args.captions,
        "chunk": args.chunk,
        "text_batch": args.text_batch,
        "image_batch": args.image_batch,
        "setup_s": round(setup_s, 3),
        "results": results,
        "baseline_torchmetrics": baseline,
        "speedup_vs_torchmetrics": {
            p: round(r["captions_per_s"] / baseline["captions_per_s"], 2) for p, r in results.items()
        }
        if baseline
        else None,
        "target_captions_per_s": TARGET_CAPTIONS_PER_S,
        "target_met": None if args.tiny else best >= TARGET_CAPTIONS_PER_S,
        "note": "random weights: the scores mean nothing; captions/s with the image embeddings cached",
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.clip", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON report path")
    p.add_argument(
        "--tiny", action="store_true", help="the tiny test CLIP on the CPU, few inputs (smoke run)"
    )
    p.add_argument("--device", help="default: cuda (cpu with --tiny)")
    p.add_argument("--precisions", nargs="+", choices=["fp32", "fp16", "bf16"], help="default: fp16 fp32")
    p.add_argument("--images", type=int, help="JPEG files (default 1000; 8 with --tiny)")
    p.add_argument("--captions", type=int, help="distinct captions (default 20000; 40 with --tiny)")
    p.add_argument(
        "--workers", type=int, help="decoding processes (default: cores less two, at most 8; 0 tiny)"
    )
    p.add_argument("--chunk", type=int, help="captions per chunk (default 4096; 16 with --tiny)")
    p.add_argument("--text-batch", type=int, help="texts per text-tower call (default 512; 8 with --tiny)")
    p.add_argument("--image-batch", type=int, help="images per vision-tower call (default 64; 4 with --tiny)")
    p.add_argument("--baseline-captions", type=int, help="torchmetrics loop captions (default 2000; 16 tiny)")
    p.add_argument("--baseline-batch", type=int, default=64, help="captions per torchmetrics update")
    p.add_argument("--agreement-captions", type=int, default=16, help="captions compared one at a time")
    args = p.parse_args(argv)
    args.argv = argv
    tiny = args.tiny
    defaults = {"device": "cpu" if tiny else "cuda", "precisions": ["fp32"] if tiny else ["fp16", "fp32"],
                "images": 8 if tiny else 1000, "captions": 40 if tiny else 20_000,
                "chunk": 16 if tiny else 4096, "text_batch": 8 if tiny else 512,
                "image_batch": 4 if tiny else 64, "baseline_captions": 16 if tiny else 2000}  # fmt: skip
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.workers is None:
        import os

        args.workers = 0 if tiny else max(0, min(8, (os.cpu_count() or 2) - 2))
    args.side = 32 if tiny else 224
    if tiny:
        args.baseline_batch = min(args.baseline_batch, 4)
        args.agreement_captions = min(args.agreement_captions, 4)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("results", "baseline_torchmetrics", "target_met")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
