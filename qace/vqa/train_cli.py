"""``qace vqa-train TRIPLES --features STORE -o DIR``: the command line of `qace.vqa.train`."""

from __future__ import annotations

import argparse

from qace.vqa.train import TrainSettings

_DEFAULTS = TrainSettings()


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``qace vqa-train`` (`qace.cli` imports this module only when it runs)."""
    p = subparsers.add_parser(
        "vqa-train",
        help="train Visual-T5 on vqa-data triples (Hugging Face Seq2SeqTrainer; paper defaults)",
        description="T5-small plus a 2054->d_model projection on the spec's input layout; the output "
        "directory is what `qace score --variant img --vqa DIR` loads.",
    )
    p.add_argument("triples", help="a `qace vqa-data` .parquet file (its train and val splits)")
    p.add_argument("--features", required=True, help="region features: .h5 (qace or VL-T5), .tsv, npz folder")
    p.add_argument("--output", "-o", required=True, help="output directory (the model; checkpoints inside)")
    p.add_argument(
        "--init", default=_DEFAULTS.init, help="T5 or Visual-T5 to start from (hub id or directory)"
    )
    p.add_argument("--epochs", type=float, default=_DEFAULTS.epochs)
    p.add_argument("--batch-size", type=int, default=_DEFAULTS.batch_size)
    p.add_argument("--learning-rate", type=float, default=_DEFAULTS.learning_rate)
    p.add_argument("--save-steps", type=int, default=_DEFAULTS.save_steps, help="checkpoint every N steps")
    p.add_argument("--logging-steps", type=int, default=_DEFAULTS.logging_steps)
    p.add_argument("--seed", type=int, default=_DEFAULTS.seed)
    p.add_argument(
        "--workers", type=int, default=None, help="feature-reading processes (default 4 on a GPU, 0)"
    )
    p.add_argument("--max-train", type=int, default=None, help="use only the first N training triples")
    p.add_argument("--device", default="cpu", help="cpu or cuda (bf16 autocast on a GPU that has it)")
    p.add_argument("--no-bf16", action="store_true", help="train in fp32 on a GPU too")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in DIR")
    p.set_defaults(func=cmd_vqa_train)


def cmd_vqa_train(args: argparse.Namespace) -> int:
    from qace.checks import check_device
    from qace.progress import summary
    from qace.vqa.train import train_visual_t5

    check_device(args.device)
    workers = args.workers if args.workers is not None else (4 if args.device.startswith("cuda") else 0)
    settings = TrainSettings(
        init=args.init,
        epochs=args.epochs,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        save_steps=args.save_steps,
        logging_steps=args.logging_steps,
        seed=args.seed,
        bf16=not args.no_bf16,
        workers=workers,
        max_train=args.max_train,
    )
    record = train_visual_t5(
        args.triples, args.features, args.output, settings=settings, device=args.device, resume=args.resume
    )
    val = record["validation"]
    shown = (
        ", ".join(f"{k} {v:.3f}" for k, v in val.items() if k != "triples" and v is not None)
        or "no val split"
    )
    resumed = f"resumed from {record['resumed_from']}, " if record["resumed_from"] else ""
    summary(
        f"Visual-T5 written to {args.output} ({record['checkpoint']}): {resumed}{record['steps']} steps, "
        f"{record['train_samples_per_second']:.1f} samples/s; validation ({val['triples']} triples): {shown}",
        output=args.output,
        **{k: v for k, v in record.items() if k != "settings"},
    )
    return 0
