"""``qace vqa-train`` throughput: training samples per second and the projected epoch time for the
paper's 900k training triples, against the paper's 40 minutes an epoch on one RTX 2080 Ti.

    python -m benchmarks.vqa_train --out benchmarks/results/vqa_train_h100.json      # on a GPU
    python -m benchmarks.vqa_train --tiny --out /tmp/vqa-train-tiny.json             # CPU smoke run

Model: a T5-small-shaped Visual-T5 with random weights (vocabulary 32,128, as t5-small's) and the
workload tokenizer (`benchmarks.workload`). Triples: ``--triples`` questions made from distinct
PASCAL-50S captions (``"what is in the picture of " + caption + " ?"``), answers one or two of the
caption's words, a fifth ``unanswerable``, over the captions' images; region features: random, packed
into an HDF5 store that training reads in place (``--images`` images).

- ``engine``: `qace.vqa.train.train_visual_t5` as ``qace vqa-train`` runs it (bf16 autocast on a GPU
  that has it, ``--workers`` feature-reading processes, batch ``--batch-size``), one epoch.
- ``baseline``: the same trainer with the release's settings: fp32, features read in the training
  process, over ``--baseline-triples``.

``samples_per_s`` is the steady rate: samples over the wall between the end of step ``--skip-steps`` and
the last step (start-up, worker spawn and the first steps left out); ``trainer_samples_per_s`` is
Hugging Face's whole-run figure. ``epoch_900k_s``: 900,000 / samples_per_s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from benchmarks import run_info
from benchmarks.workload import RANDOM_T5, T5_SMALL, TINY_T5, pascal_workload

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PAPER_EPOCH_S = 40 * 60
"""The paper's Visual-T5 training time per epoch, on one RTX 2080 Ti."""
PAPER_TRAIN_TRIPLES = 900_000
"""The paper's 1M triples less the 1/10 validation split."""


def build_inputs(work: Path, args: argparse.Namespace) -> tuple[Path, Path, Path]:
    """The model directory, the triples file and the feature store of the run."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import T5Config

    from qace.data.features import RandomFeatureStore, pack_features
    from qace.models.visual_t5 import VisualT5ForConditionalGeneration
    from qace.testing.qace_models import build_tokenizer

    records = pascal_workload(DATA, 48_715, seed=args.seed)
    tokenizer = build_tokenizer([r.caption for r in records])
    images = sorted({str(r.image_id) for r in records})[: args.images]
    total = args.triples + args.val
    rows: dict[str, list[Any]] = {k: [] for k in ("question", "answer", "image_id", "split", "answerable")}
    for i in range(total):
        caption = records[i % len(records)].caption
        words = [w for w in caption.lower().split() if w.isalpha()] or ["thing"]
        answerable = i % 5 != 0
        rows["question"].append(f"what is in the picture of {caption} ?")
        rows["answer"].append(
            " ".join(words[i % len(words) :][: 1 + i % 2]) if answerable else "unanswerable"
        )
        rows["image_id"].append(images[i % len(images)])
        rows["split"].append("train" if i < args.triples else "val")
        rows["answerable"].append(answerable)
    triples = work / "triples.parquet"
    pq.write_table(pa.table(rows), triples)
    features = work / "features.h5"
    store = RandomFeatureStore(seed=args.seed)
    pack_features(((image, store.get(image)) for image in images), features)
    shape = TINY_T5 | {"vocab_size": len(tokenizer)} if args.tiny else T5_SMALL
    prefix = [tokenizer.convert_tokens_to_ids("▁image"), tokenizer.convert_tokens_to_ids(":")]
    torch.manual_seed(args.seed)
    config = T5Config(**(RANDOM_T5 | shape), image_prefix_ids=prefix)
    model_dir = work / "init"
    VisualT5ForConditionalGeneration(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir, triples, features


class StepClock(TrainerCallback):
    """A Trainer callback keeping the wall time at the end of every step (the device synchronised)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.stamps.append(time.perf_counter())


def train_run(
    model_dir: Path, triples: Path, features: Path, out: Path, *, bf16: bool, workers: int, max_train: int,
    args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    from qace.vqa.train import TrainSettings, train_visual_t5

    settings = TrainSettings(
        init=str(model_dir),
        epochs=1,
        batch_size=args.batch_size,
        save_steps=10**9,
        logging_steps=10,
        bf16=bf16,
        workers=workers,
        max_train=max_train,
    )
    clock = StepClock()
    record = train_visual_t5(
        triples, str(features), out, settings=settings, device=args.device, callbacks=[clock]
    )
    stamps = clock.stamps
    skip = min(args.skip_steps, len(stamps) - 2)
    steady = (len(stamps) - 1 - skip) * args.batch_size / (stamps[-1] - stamps[skip])
    return {
        "bf16": record["settings"]["bf16"],
        "workers": workers,
        "triples": record["train_triples"],
        "steps": record["steps"],
        "samples_per_s": steady,
        "trainer_samples_per_s": record["train_samples_per_second"],
        "train_seconds": record["train_seconds"],
        "first_loss": record["losses"][0],
        "last_loss": record["losses"][-1],
        "epoch_900k_s": PAPER_TRAIN_TRIPLES / steady,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="default: benchmarks/results/vqa_train_<gpu>.json")
    parser.add_argument("--triples", type=int, default=None, help="training triples (default 64,000)")
    parser.add_argument("--baseline-triples", type=int, default=None, help="default 16,000")
    parser.add_argument("--val", type=int, default=None, help="validation triples (default 512)")
    parser.add_argument("--images", type=int, default=1000, help="images the triples ask about")
    parser.add_argument("--batch-size", type=int, default=128, help="the paper's 128")
    parser.add_argument("--workers", type=int, default=4, help="feature-reading processes (engine run)")
    parser.add_argument("--skip-steps", type=int, default=None, help="steps left out of the rate (20)")
    parser.add_argument("--device", default=None, help="default: cuda if any")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="tiny model on the CPU: a smoke run")
    args = parser.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    args.triples = args.triples or (48 if args.tiny else 64_000)
    args.baseline_triples = args.baseline_triples or (24 if args.tiny else 16_000)
    args.val = args.val or (8 if args.tiny else 512)
    args.skip_steps = args.skip_steps if args.skip_steps is not None else (2 if args.tiny else 20)
    if args.tiny:
        args.batch_size, args.images, args.workers = min(args.batch_size, 8), min(args.images, 16), 0
    if not DATA.is_dir():
        parser.error(f"shared data not found at {DATA}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qace-vqa-train-") as tmp:
        work = Path(tmp)
        model_dir, triples, features = build_inputs(work, args)
        common = {"args": args}
        engine = train_run(
            model_dir, triples, features, work / "engine", bf16=True, workers=args.workers,
            max_train=args.triples, **common,
        )  # fmt: skip
        baseline = train_run(
            model_dir, triples, features, work / "baseline", bf16=False, workers=0,
            max_train=args.baseline_triples, **common,
        )  # fmt: skip
    report = {
        **run_info.record(
            "benchmarks.vqa_train", argv, device=args.device, packages=("transformers", "accelerate")
        ),
        "settings": {
            k: getattr(args, k) for k in ("device", "batch_size", "images", "val", "skip_steps", "tiny")
        },
        "engine": engine,
        "baseline": baseline,
        "speedup_vs_baseline": engine["samples_per_s"] / baseline["samples_per_s"],
        "paper_epoch_s": PAPER_EPOCH_S,
        "paper_hardware": "one RTX 2080 Ti",
        "speedup_vs_paper_epoch": PAPER_EPOCH_S / engine["epoch_900k_s"],
    }
    out = Path(args.out or run_info.default_result("vqa_train", report["gpu"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("engine", "baseline", "speedup_vs_paper_epoch")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
