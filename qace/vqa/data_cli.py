"""``qace vqa-data CAPTIONS -o triples.parquet``: the command line of `qace.vqa.data`."""

from __future__ import annotations

import argparse

from qace.vqa.captions import FORMATS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``qace vqa-data`` (`qace.cli` imports this module only when it runs)."""
    p = subparsers.add_parser(
        "vqa-data",
        help="build the paper's synthetic VQA triples from captions (QG + TQA on the engine)",
        description="Noun-phrase candidates, one QG question each, kept where the text-QA answer on the "
        "caption is that phrase; unanswerable questions from other images mixed in; a 9:1 split by image. "
        "Deterministic for a seed and resumable.",
    )
    p.add_argument("captions", help="COCO caption annotations (.json), COCO results (.json), JSONL or CSV")
    p.add_argument("--output", "-o", required=True, help="output .parquet")
    p.add_argument("--format", default="auto", choices=FORMATS, help="caption file format")
    p.add_argument("--unanswerable", type=float, default=0.2, help="unanswerable share of the output")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of the images in the val split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--chunk-size", type=int, default=2048, help="captions per chunk (part of the settings)")
    p.add_argument("--models", help="directory holding qg/ and tqa/ (default: the paper's models)")
    p.add_argument("--qg", help="question-generation model (hub id or directory)")
    p.add_argument("--tqa", help="text-QA model (hub id or directory)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="model precision")
    p.add_argument("--resume", action="store_true", help="continue a killed run (same input and settings)")
    p.set_defaults(func=cmd_vqa_data)


def cmd_vqa_data(args: argparse.Namespace) -> int:
    from pathlib import Path

    from qace.checks import check_device, check_output_file
    from qace.errors import ConfigError, InputError
    from qace.vqa.data import DataSettings

    settings = DataSettings(args.unanswerable, args.val_fraction, args.seed, args.chunk_size)
    check_output_file(args.output)
    if Path(args.output).suffix.lower() != ".parquet":
        raise ConfigError(f"output {args.output!r} must be a .parquet file")
    if not Path(args.captions).is_file():
        raise InputError(f"caption file {args.captions!r} does not exist")
    check_device(args.device)
    from qace.config import QACEConfig, speed_defaults
    from qace.engine.engine import BatchLimits
    from qace.metric.candidates import CandidateExtractor
    from qace.metric.runners import build_models
    from qace.progress import summary
    from qace.vqa.data import make_vqa_data

    config = QACEConfig().with_(device=args.device, precision=args.precision, **speed_defaults(args.device))
    models, fingerprints, test_models = build_models(config, models_dir=args.models, qg=args.qg, tqa=args.tqa)
    if test_models:
        print("warning: test models: the triples mean nothing")
    extractor = CandidateExtractor(config.spacy_model, workers=config.spacy_workers)
    try:
        result = make_vqa_data(
            args.captions,
            args.output,
            models=models,
            fingerprints=fingerprints | {"spacy": config.spacy_model, "precision": args.precision},
            extractor=extractor,
            settings=settings,
            fmt=args.format,
            limits=BatchLimits(config.max_batch_tokens, config.max_batch_rows),
            resume=args.resume,
        )
    finally:
        extractor.close()
    summary(f"{result.line()}; written to {args.output}", output=args.output, triples=result.triples)
    return 0
