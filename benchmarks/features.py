"""Region-feature extraction: the batched pipeline against a one-image-at-a-time loop, in one run.

    python -m benchmarks.features --device cuda            # writes benchmarks/results/features_<gpu>.json
    python -m benchmarks.features --tiny --out /tmp/features-tiny.json   # CPU smoke run, seconds
    python -m benchmarks.features --profile               # adds "stage_ms" and "pipeline_parts"

Workload: ``--images`` random 640x480 JPEG files (blocky noise, written to a temporary folder first,
so decoding is part of the work), the full-size detector (`qace.features.detector.DetectorConfig`)
with random weights (batch-norm scales damped so that 33 random residual blocks keep activations in
the range of real features). Nothing is compared with real weights.

- ``batched``: `qace.features.extract.extract_features` as ``qace features extract`` runs it: decode
  and resize in ``--workers`` processes with prefetch, ``--batch-size`` images a detector call,
  ``--precision`` (bf16 on a GPU by default), a writer thread filling an HDF5 store;
  ``input_wait_ms_per_batch`` is how long the detector's thread waited for its next uploaded batch
  (after the first): near zero while the detector is the limit, the loader's shortfall otherwise;
  ``images_per_s`` is over the whole call, ``steady_images_per_s`` leaves out its first ``start_s``
  (starting the loader's processes and decoding the first batch, paid once a run);
- ``loop``: the same detector and precision, one image at a time in the main thread (open, resize,
  detect, write), over ``--loop-images`` images; ``speedup`` (whole call) and the target, and
  ``speedup_steady``, compare with this loop;
- ``loop_fp32`` (when ``--precision`` is not fp32): the same loop in fp32, as the LXMERT demo runs, for
  reference only.

Untimed: one warm-up batch and one warm-up loop image (cuDNN autotuning, CUDA context). The targets
(`TARGETS`) are the issue's: at least 100 images/s batched and 10x the loop on one H100 or H200.

``--profile`` then times `BottomUpDetector.detect_resized` on the warm-up batch (decoded and resized
beforehand) with a device synchronisation after each stage (`stage_times`), so each stage's time is its own,
without the overlap of host and device work that the timed runs have: the median of three calls. It
also times the pipeline's two other parts alone (`pipeline_parts`): the loader (decode and resize in
``--workers`` processes, no detector) over the batched run's images, and the HDF5 writer's ``add`` per
image (the batched run's stored regions written again to a scratch store, a batch a call).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.run_info import default_result, gpu_name, record
from qace.data.features import HDF5Store
from qace.features import ops
from qace.features.detector import BottomUpDetector, DetectorConfig, resize_for_detector
from qace.features.extract import (
    ImageItem,
    RegionWriter,
    decode_batches,
    default_precision,
    extract_features,
)
from qace.precision import TORCH_PRECISIONS, torch_dtype

TARGETS = {"images_per_s": 100.0, "speedup": 10.0}


def make_images(folder: Path, count: int, size: tuple[int, int], seed: int = 0) -> list[ImageItem]:
    """``count`` random JPEG files of ``size`` (width, height): 8x8-pixel blocks of noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = size
    items = []
    for i in range(count):
        blocks = rng.integers(0, 255, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
        pixels = np.kron(blocks, np.ones((8, 8, 1), np.uint8))[:h, :w]
        path = folder / f"{i:06d}.jpg"
        Image.fromarray(pixels).save(path, quality=90)
        items.append(ImageItem(path.stem, str(path)))
    return items


def random_detector(config: DetectorConfig, device: str, seed: int = 0) -> BottomUpDetector:
    """The architecture with random weights; each block's last batch-norm scale is damped (0.2) so that
    residual sums stay bounded, as trained weights keep them."""
    torch.manual_seed(seed)
    model = BottomUpDetector(config)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.BatchNorm2d) and name.endswith("conv3.norm"):
                module.weight.fill_(0.2)
    return model.placed(device)


def loop(model: BottomUpDetector, items: list[ImageItem], out: Path, precision: str, name: str) -> float:
    """One image at a time: open, resize, detect, write; returns seconds."""
    from PIL import Image

    dtype = torch_dtype(precision)
    writer = RegionWriter(out, f"{name}|{precision}")
    start = time.perf_counter()
    for item in items:
        with Image.open(item.path) as image:
            pixels, width, height = resize_for_detector(image, model.config)
        (found,) = model.detect_resized([pixels], [(width, height)], dtype=dtype)
        if not isinstance(found, str):
            writer.add([(item.key, found.regions())])
    writer.close()
    return time.perf_counter() - start


def stage_times(
    model: BottomUpDetector, items: list[ImageItem], precision: str, device: str, repeats: int = 3
) -> dict[str, float]:
    """Milliseconds of each stage of `BottomUpDetector.detect_resized` on ``items`` as one batch (upload,
    backbone, rpn, roi_pool, res5, select, host, and their total), each the median of ``repeats`` calls
    with a synchronisation after every stage."""
    (decoded,) = decode_batches(items, model.config, len(items), 0)
    resized = [(d.pixels, *d.size) for d in decoded]
    runs = [_stage_ms(model, resized, torch_dtype(precision), device) for _ in range(repeats)]
    return {stage: round(float(np.median([run[stage] for run in runs])), 3) for stage in runs[0]}


def pipeline_parts(
    items: list[ImageItem], folder: Path, config: DetectorConfig, args: argparse.Namespace
) -> dict[str, float]:
    """The batched pipeline's parts besides the detector, each alone: the loader's images/s over ``items``
    (``args.workers`` processes, ``args.batch_size`` a batch) and the writer's milliseconds an image
    (the regions ``folder/batched.h5`` holds, written again to a scratch store a batch at a time)."""
    start = time.perf_counter()
    decoded = sum(len(batch) for batch in decode_batches(items, config, args.batch_size, args.workers))
    loader_s = time.perf_counter() - start
    store = HDF5Store(folder / "batched.h5")
    ids = store.ids()[:256]
    regions = [store.get(key) for key in ids]
    store.close()
    writer = RegionWriter(folder / "rewrite.h5", "rewrite")
    start = time.perf_counter()
    images = list(zip(ids, regions, strict=True))
    for first in range(0, len(images), args.batch_size):
        writer.add(images[first : first + args.batch_size])
    writer.close()
    writer_s = time.perf_counter() - start
    return {
        "loader_images_per_s": round(decoded / loader_s, 2),
        "writer_ms_per_image": round(1000 * writer_s / max(len(ids), 1), 3),
        "writer_images": len(ids),
    }


def _stage_ms(
    model: BottomUpDetector, resized: list[tuple[torch.Tensor, int, int]], dtype: torch.dtype, device: str
) -> dict[str, float]:
    """One `detect_resized` call's milliseconds per stage, with a synchronisation after each, and total."""
    times: dict[str, float] = {}
    sync(device)
    last = time.perf_counter()

    def mark(stage: str) -> None:
        nonlocal last
        sync(device)
        now = time.perf_counter()
        times[stage], last = 1000 * (now - last), now

    model.detect_resized([r[0] for r in resized], [(r[1], r[2]) for r in resized], dtype, on_stage=mark)
    return {**times, "total": sum(times.values())}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--precision", choices=sorted(TORCH_PRECISIONS), help="default: bf16 on a GPU, else fp32")
    p.add_argument("--images", type=int, default=1024, help="images through the batched pipeline")
    p.add_argument("--loop-images", type=int, default=96, help="images through the one-at-a-time loop")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=12, help="decode/resize processes")
    p.add_argument("--tiny", action="store_true", help="tiny detector on small images: a smoke run")
    p.add_argument(
        "--profile",
        action="store_true",
        help='add "stage_ms" (one batch, stage by stage) and "pipeline_parts"',
    )
    p.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/features_<gpu>.json)")
    args = p.parse_args(argv)
    args.precision = args.precision or default_precision(args.device)
    config, size = DetectorConfig(), (640, 480)
    if args.tiny:
        config, size = DetectorConfig.tiny(), (64, 48)
        args.images, args.loop_images, args.workers = min(args.images, 12), min(args.loop_images, 4), 0
        args.batch_size = min(args.batch_size, 4)
    if args.device.startswith("cuda"):
        torch.backends.cudnn.benchmark = True
        if ops.BACKEND != "torchvision":  # the per-region reference RoIPool: keep the run short
            print("torchvision's kernels do not load: timing the pure-PyTorch operators on few images")
            args.images, args.loop_images = min(args.images, 64), min(args.loop_images, 8)
    model = random_detector(config, args.device)
    name = "random-" + ("tiny" if args.tiny else "full")
    with tempfile.TemporaryDirectory(prefix="qace-features-bench-") as tmp:
        folder = Path(tmp)
        items = make_images(folder, args.images + args.loop_images + args.batch_size + 1, size)
        warm, batched_items = (
            items[: args.batch_size + 1],
            items[args.batch_size + 1 : args.batch_size + 1 + args.images],
        )
        loop_items = items[args.batch_size + 1 + args.images :]

        # warm-up, untimed: a batch through the pipeline, an image through the loop
        settings = {"detector": model, "detector_name": name, "precision": args.precision, "progress": False}
        extract_features(
            warm[:-1], folder / "warm.h5", batch_size=args.batch_size, workers=args.workers, **settings
        )
        loop(model, warm[-1:], folder / "warm-loop.h5", args.precision, name)

        sync(args.device)
        summary = extract_features(
            batched_items, folder / "batched.h5", batch_size=args.batch_size, workers=args.workers, **settings
        )
        sync(args.device)
        loop_s = loop(model, loop_items, folder / "loop.h5", args.precision, name)
        sync(args.device)
        fp32_s = None
        if args.precision != "fp32":  # how the LXMERT demo runs: fp32, one image at a time
            loop(model, warm[-1:], folder / "warm-fp32.h5", "fp32", name)
            sync(args.device)
            fp32_s = loop(model, loop_items, folder / "loop-fp32.h5", "fp32", name)
            sync(args.device)
        errors = [json.loads(line) for line in summary.errors_path.open()]
        stage_ms = stage_times(model, warm[:-1], args.precision, args.device) if args.profile else None
        parts = pipeline_parts(batched_items, folder, config, args) if args.profile else None

    batched_ips = summary.extracted / summary.seconds
    steady_ips = summary.extracted / max(summary.seconds - summary.start_s, 1e-9)
    loop_ips = len(loop_items) / loop_s
    speedup = batched_ips / loop_ips
    result = {
        **record("benchmarks.features", argv, device=args.device, packages=("torchvision",)),
        "ops_backend": ops.BACKEND,
        "weights": "random (nothing compared with the real detector)",
        "detector": asdict(config),
        "image_size": list(size),
        "precision": args.precision,
        "batched": {
            "images": args.images,
            "extracted": summary.extracted,
            "errors": len(errors),
            "first_errors": errors[:3],
            "batch_size": args.batch_size,
            "workers": args.workers,
            "seconds": round(summary.seconds, 4),
            "images_per_s": round(batched_ips, 2),
            "start_s": round(summary.start_s, 4),
            "steady_images_per_s": round(steady_ips, 2),
            "batches": summary.batches,
            "input_wait_ms_per_batch": round(1000 * summary.input_wait_s / max(summary.batches - 1, 1), 3),
        },
        "loop": {"images": len(loop_items), "seconds": round(loop_s, 4), "images_per_s": round(loop_ips, 2)},
        "loop_fp32": None
        if fp32_s is None
        else {
            "images": len(loop_items),
            "seconds": round(fp32_s, 4),
            "images_per_s": round(len(loop_items) / fp32_s, 2),
            "speedup_of_batched": round(batched_ips * fp32_s / len(loop_items), 2),
        },
        "speedup": round(speedup, 2),
        "speedup_steady": round(steady_ips / loop_ips, 2),
        "stage_ms": stage_ms,
        "pipeline_parts": parts,
        "targets": {
            **TARGETS,
            "met": bool(batched_ips >= TARGETS["images_per_s"] and speedup >= TARGETS["speedup"]),
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    out = args.out or default_result("features", gpu_name(args.device))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
