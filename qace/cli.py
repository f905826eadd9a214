"""Command line: ``qace score``, ``demo``, ``make-test-models``, ``features`` and the optional commands.

Building the parser imports nothing heavy (no torch, no model code) and only the module of the command
being run, so a wrong flag answers at once; arguments and paths are checked (`qace.checks`) before any
model loads. An optional command whose extra is not installed stays listed and answers with the line
that installs it.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from qace import scorers
from qace._version import __version__
from qace.checks import check_device, check_exists, check_output_file
from qace.data.output import chunk_size_mismatch, errors_path, partial_chunk_size, partial_path
from qace.errors import BackendUnavailableError, QACEError, ResumeError
from qace.extras import require_extra
from qace.options import add_metric_option, add_scorer_options, entry_for
from qace.progress import add_output_options, configure, summary

if TYPE_CHECKING:
    from qace.scorers import Scorer
    from qace.scoring import Summary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OptionalCommand:
    """A command whose module (``register(subparsers)`` adds it) is imported only when it runs."""

    module: str
    extra: str
    """The ``qace[extra]`` that installs what it needs (empty: the core install has it all)."""
    needs: tuple[str, ...]
    """Top-level modules of that extra the command imports."""
    help: str


OPTIONAL_COMMANDS = {
    "meta": OptionalCommand(
        "qace.meta.cli", "meta", (), "meta-evaluation: metric vs human correlation, judge agreement"
    ),
    "export": OptionalCommand(
        "qace.export.cli",
        "onnx",
        ("onnx", "onnxruntime"),
        "export QG/TQA/Visual-T5 to ONNX (validated against PyTorch)",
    ),
    "serve": OptionalCommand(
        "qace.serve.cli",
        "serve",
        ("fastapi", "uvicorn", "orjson"),
        "serve a registered scorer as rewards over HTTP (own API and OpenRLHF's /get_reward)",
    ),
    "health": OptionalCommand(
        "qace.serve.health",
        "serve",
        ("httpx", "orjson"),
        "check a reward service's /health, or --wait until it is ready",
    ),
    "score-ray": OptionalCommand(
        "qace.scale.cli", "ray", ("ray",), "score Parquet/JSONL on a Ray cluster into a Parquet directory"
    ),
    "models": OptionalCommand(
        "qace.vqa.check", "", (), "models check: do your models reproduce the authors' demo outputs?"
    ),
    "vqa-data": OptionalCommand(
        "qace.vqa.data_cli", "", (), "build the paper's synthetic VQA triples from captions, on the engine"
    ),
    "vqa-train": OptionalCommand(
        "qace.vqa.train_cli", "train", ("accelerate",), "train Visual-T5 on vqa-data triples (Seq2SeqTrainer)"
    ),
    "report": OptionalCommand(
        "qace.report.cli", "", (), "write a self-contained HTML report of score output (two files: compare)"
    ),
}


def _add_score(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score captions from a JSONL/CSV/COCO/Parquet file")
    p.add_argument(
        "input", help="JSONL (id, image_id, image, caption, references), CSV, or COCO results JSON"
    )
    add_metric_option(p, "the metric (judges read each record's image file)")
    p.add_argument("--output", "-o", required=True, help="output .jsonl or .parquet")
    p.add_argument("--references", help="references file for COCO-style results")
    p.add_argument(
        "--references-format",
        default="auto",
        choices=["auto", "json", "jsonl"],
        help="the references file's layout: one JSON document or JSON lines (default: told by content)",
    )
    p.add_argument(
        "--format", default="auto", choices=["auto", "jsonl", "csv", "coco", "parquet"], help="input format"
    )
    add_scorer_options(p)
    p.add_argument(
        "--resume", action="store_true", help="continue a killed run (same settings and input required)"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --resume: continue an output that cannot be checked (no input fingerprint or signature)",
    )
    p.add_argument(
        "--gpus",
        help="score on N GPUs of this host (or 'all'): one engine per GPU, "
        "output merged in input order, resumable per shard",
    )
    _add_detector_args(p, device=False)
    scorers.add_options(p)  # light: a metric's extra loads with its scorer


def _scorer(args: argparse.Namespace, models: str | None = None) -> Scorer:
    """The scorer of the metric ``args`` name, built through its registry entry; ``models`` overrides
    ``--models`` (QACE). `benchmarks.forced_cli` wraps this function."""
    entry = entry_for(args)
    settings = entry.settings_from(args)
    if models:
        settings["models"] = models
    return entry.build(args.device, **settings)


def cmd_score(args: argparse.Namespace) -> int:
    entry = entry_for(args)
    entry.require()
    check_output_file(args.output)
    if not args.gpus:  # --gpus checks its devices in resolve_devices
        check_device(args.device)
    if args.references is not None and args.references_format != "auto":  # read as said, not as sniffed
        from qace.data.records import load_references

        args.references = load_references(args.references, args.references_format)
    _check_paths(args)
    _resumed_chunk_size(args)
    _features_on_demand(args)
    if args.gpus:
        from qace.scale.cli import cmd_score_sharded

        return cmd_score_sharded(args, entry)
    from qace.scoring import score_file

    scorer = _scorer(args)
    scorers.warn_if_test_models(scorer, entry)
    summary = score_file(
        scorer,
        args.input,
        args.output,
        references=args.references,
        fmt=args.format,
        resume=args.resume,
        force=args.force,
    )
    return _report(scorer.signature, summary, args.output)


def _check_paths(args: argparse.Namespace) -> None:
    """Every path a ``qace score`` run reads, checked before any model loads and before any output
    exists: the input and references files up to their first record (`check_readable`), and the
    features and local model locations QACE is given."""
    from qace.data.records import check_readable

    check_readable(args.input, references=args.references, fmt=args.format)
    features = getattr(args, "features", None)
    if features and not str(features).startswith("random:"):
        check_exists("--features", features)
    for flag in ("--models", "--vqa"):  # local only (--qg and --tqa may name hub ids)
        check_exists(flag, getattr(args, flag[2:], None))


def _resumed_chunk_size(args: argparse.Namespace) -> None:
    """``--resume`` of a killed run's partial output goes on in the chunks it was written in (in others,
    scores move by float rounding): a ``--chunk-size`` that differs is refused here, before any model
    loads, and none given takes the partial output's."""
    written = partial_chunk_size(args.output) if args.resume and not args.gpus else None
    if written is None:
        return
    if args.chunk_size is None:
        args.chunk_size = written
        log.info("resuming %s in its chunks of %d captions", args.output, written)
    elif args.chunk_size != written:
        raise ResumeError(chunk_size_mismatch(partial_path(args.output), written, args.chunk_size))


def _report(signature: str, result: Summary, output: str) -> int:
    lines = [f"signature: {signature}", result.line()]
    if result.errors:
        lines.append(f"{result.errors} record(s) could not be scored; see {errors_path(output)}")
    summary("\n".join(lines), signature=signature, output=output, **result.fields())
    return 0


def cmd_make_test_models(args: argparse.Namespace) -> int:
    from qace.testing.qace_models import make_test_models

    out = make_test_models(args.dir, seed=args.seed, force=args.force)
    print(f"test models written to {out} (qg/, tqa/, vqa/): for tests and demos only, scores mean nothing")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    check_device(args.device)
    from qace.demo import run_demo

    return run_demo(
        Path(args.output_dir),
        models=args.models,
        device=args.device,
        download=args.download,
        metric=args.metric,
    )


def cmd_features_pack(args: argparse.Namespace) -> int:
    from qace.data.features import pack_features
    from qace.features.stores import open_feature_store

    errors: list[tuple[str, str]] = []
    count = pack_features(open_feature_store(args.source), args.output, dtype=args.dtype, errors=errors)
    for _, reason in errors:
        print(f"not packed: {reason}", file=sys.stderr)
    left_out = f"; {len(errors)} image(s) left out, listed above" if errors else ""
    print(f"packed {count} images into {args.output} ({args.dtype}){left_out}")
    return 0


def cmd_features_extract(args: argparse.Namespace) -> int:
    from qace.features.extract import extract_features, gather_images

    images = gather_images(args.images)  # arguments and inputs are checked before the detector loads
    summary = extract_features(images, args.output, **_detector_settings(args))
    print(summary.line())
    return 0


def _add_detector_args(p: argparse.ArgumentParser, device: bool) -> None:
    from qace.features import DEFAULT_DETECTOR

    p.add_argument(
        "--detector",
        default=DEFAULT_DETECTOR,
        help="bottom-up-attention Faster R-CNN: hub id or directory with pytorch_model.bin "
        f"(default {DEFAULT_DETECTOR})",
    )
    p.add_argument(
        "--detector-precision",
        choices=["fp32", "bf16", "fp16"],
        help="detector precision (default: bf16 on a GPU, fp32, the exact mode, elsewhere)",
    )
    p.add_argument("--detector-batch", type=int, default=8, help="images per detector batch")
    p.add_argument("--detector-workers", type=int, default=4, help="CPU processes decoding and resizing")
    if device:
        p.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
        p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _detector_settings(args: argparse.Namespace) -> dict:
    """`extract_features` keyword arguments from the detector options (the detector is loaded here)."""
    from qace.features.extract import default_precision, load_detector

    if args.detector_batch < 1 or args.detector_workers < 0:
        raise QACEError("--detector-batch must be at least 1 and --detector-workers at least 0")
    return {
        "detector": load_detector(args.detector, args.device),
        "detector_name": str(args.detector),
        "precision": args.detector_precision or default_precision(args.device),
        "batch_size": args.detector_batch,
        "workers": args.detector_workers,
        "progress": not args.no_progress,
    }


def _features_on_demand(args: argparse.Namespace) -> None:
    """QACE-Img on records with ``image`` paths and no ``--features``: extract their regions into
    ``<output stem>.features.h5`` beside the output (resumed on a rerun) and score from it."""
    from qace.features.extract import extract_features, gather_images

    if args.features or args.variant != "img" or args.format not in ("auto", "jsonl", "csv"):
        return
    images = gather_images(args.input, records=True, fmt=args.format)
    if not images:
        return
    output = Path(args.output)
    cache = output.with_name(output.stem + ".features.h5")
    print(f"extracting region features of {len(images)} images into {cache}", file=sys.stderr)
    summary = extract_features(images, cache, **_detector_settings(args))
    print(summary.line(), file=sys.stderr)
    args.features = str(cache)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``qace`` parser; of the optional commands, only ``command`` (the one being run) is built in
    full, the others are listed (and answer that their extra is missing, if it is)."""
    parser = argparse.ArgumentParser(prog="qace", description="QACE caption metric engine")
    parser.add_argument("--version", action="version", version=f"qace {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_score(sub)
    sub.choices["score"].set_defaults(func=cmd_score)

    p = sub.add_parser("make-test-models", help="build tiny trained test models (qg/, tqa/, vqa/)")
    p.add_argument("dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="rebuild even if complete")
    p.set_defaults(func=cmd_make_test_models)

    p = sub.add_parser(
        "demo", help="score the bundled example (paper's models if loadable, else test models)"
    )
    p.add_argument("--output-dir", default="qace-demo", help="where the demo writes its outputs")
    p.add_argument("--models", help="directory with qg/, tqa/, vqa/")
    p.add_argument(
        "--metric",
        default="qace",
        choices=["qace", *scorers.demo_names()],
        help="qace (QACE-Ref and QACE-Img), or another registered metric scoring the example's images",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--download", action="store_true", help="fetch the paper's models from the hub if not cached"
    )
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("features", help="region-feature stores")
    fsub = p.add_subparsers(dest="features_command", required=True)
    pack = fsub.add_parser(
        "pack", help="convert features (npz folder, VL-T5 .h5, BUTD .tsv) to one HDF5 store"
    )
    pack.add_argument(
        "source", help="directory of <image_id>.npz files, a VL-T5 .h5 or a bottom-up-attention .tsv"
    )
    pack.add_argument("output", help="output .h5 file")
    pack.add_argument(
        "--dtype",
        default="float16",
        choices=["float16", "float32"],
        help="stored precision: float16 is lossless for the release's features; float32 for values "
        "beyond float16's range (65504)",
    )
    pack.set_defaults(func=cmd_features_pack)
    extract = fsub.add_parser(
        "extract", help="extract 36 regions per image from raw images into an HDF5 store"
    )
    extract.add_argument("images", help="a folder of images, a list file (a path a line) or a records file")
    extract.add_argument("-o", "--output", required=True, help="output .h5 store (resumed if it exists)")
    _add_detector_args(extract, device=True)
    extract.set_defaults(func=cmd_features_extract)

    for name, spec in OPTIONAL_COMMANDS.items():
        try:
            require_extra(spec.extra, spec.needs, f"qace {name}")
        except BackendUnavailableError as missing:
            _add_unavailable(sub, name, spec, missing)
            continue
        if name == command:
            importlib.import_module(spec.module).register(sub)
        else:  # listed only: this run is another command
            sub.add_parser(name, help=spec.help)
    add_output_options(parser)
    return parser


def _add_unavailable(
    sub: argparse._SubParsersAction, name: str, spec: OptionalCommand, error: QACEError
) -> None:
    """List ``name``; running it, with any arguments (``--help`` too), raises ``error``."""

    def unavailable(args: argparse.Namespace) -> NoReturn:
        raise error

    needs = f"pip install 'qace[{spec.extra}]'"
    p = sub.add_parser(name, help=f"{spec.help} (not installed here: {needs})", add_help=False)
    p.set_defaults(func=unavailable, accepts_any_arguments=True)


def _command(argv: Sequence[str]) -> str | None:
    """The command of ``argv``: its first word that is neither an option nor the value of
    ``--log-format`` (the one top-level option that takes a value)."""
    words = iter(argv)
    for word in words:
        if word == "--log-format":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command(argv))
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "accepts_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    configure(quiet=args.quiet, verbose=args.verbose, log_format=args.log_format)
    try:
        return int(args.func(args) or 0)
    except QACEError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
