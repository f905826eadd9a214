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

from qace import __version__
from qace.checks import check_device, check_img_features, check_output_file
from qace.errors import BackendUnavailableError, QACEError
from qace.extras import require_extra
from qace.progress import add_output_options, configure, summary

if TYPE_CHECKING:
    from qace.scoring import Summary

log = logging.getLogger("qace")


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
        ("fastapi", "uvicorn"),
        "serve QACE rewards over HTTP (own API and OpenRLHF's /get_reward)",
    ),
    "score-ray": OptionalCommand(
        "qace.scale.cli", "ray", ("ray",), "score Parquet/JSONL on a Ray cluster into a Parquet directory"
    ),
    "report": OptionalCommand(
        "qace.report.cli", "", (), "write a self-contained HTML report of score output (two files: compare)"
    ),
}

QACE_METRICS = {"qace-ref": "ref", "qace-img": "img"}
JUDGE_MODULES = {"visce2": "qace.judges.visce2", "regen": "qace.judges.regen"}
"""Judges of ``--metric``: each module has ``add_cli_arguments(parser)``, ``cli_settings(args)`` (the
scorer's keyword arguments), ``from_cli(args)``, ``demo_scorer(...)``, ``SCORER``, the name of its
scorer class (so ``--gpus`` workers can build it from those keyword arguments), and ``NEEDS``, the
modules of the ``judges`` extra it runs with. Importing one must stay light (no torch)."""
METRICS = (*QACE_METRICS, *JUDGE_MODULES)

TEST_MODEL_WARNING = """
!!! WARNING: scoring with qace's TINY TEST MODELS (random weights, trained for seconds on a toy task).
!!! These scores MEAN NOTHING. They only show that the pipeline runs.
!!! For real QACE scores, give the paper's models: either let qace download them once
!!!   (huggingface-cli download mrm8488/t5-base-finetuned-question-generation-ap / valhalla/t5-base-qa-qg-hl)
!!! or pass --models DIR with qg/, tqa/ and vqa/ checkpoints (see README, "Real models").
"""


def _add_score(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score captions from a JSONL/CSV/COCO/Parquet file")
    p.add_argument(
        "input", help="JSONL (id, image_id, image, caption, references), CSV, or COCO results JSON"
    )
    p.add_argument(
        "--metric",
        choices=METRICS,
        help="qace-ref / qace-img (same as --variant ref / img; default: --variant), visce2 (a VLM judge) "
        "or regen (image regeneration score); visce2 and regen read each record's image file",
    )
    p.add_argument("--output", "-o", required=True, help="output .jsonl or .parquet")
    p.add_argument("--references", help="references file for COCO-style results")
    p.add_argument(
        "--format", default="auto", choices=["auto", "jsonl", "csv", "coco", "parquet"], help="input format"
    )
    _add_model_args(p)
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
    for module in JUDGE_MODULES.values():  # light: a judge's extra loads with its scorer
        try:
            importlib.import_module(module).add_cli_arguments(p)
        except ImportError as exc:  # a judge not installed (or not written yet)
            log.debug("options of %s unavailable: %s", module, exc)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--variant", default="ref", choices=["ref", "img"], action=_Given, help="QACE-Ref or QACE-Img"
    )
    p.add_argument("--models", help="directory with qg/, tqa/, vqa/ (default: the paper's models)")
    p.add_argument("--qg", help="QG model (hub id or directory), overrides --models")
    p.add_argument("--tqa", help="text-QA model (hub id or directory), overrides --models")
    p.add_argument("--vqa", help="Visual-T5 model (directory or state-dict file), overrides --models")
    p.add_argument(
        "--features",
        help="region features: a directory of per-image .npz files, an HDF5 store (qace's or VL-T5's) or a "
        "bottom-up-attention .tsv; without it, QACE-Img extracts the records' images (see --detector)",
    )
    p.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "bf16", "fp16", "int8"],
        help="int8: ONNX backend on CPU only",
    )
    p.add_argument("--backend", default="torch", choices=["torch", "onnx"])
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:1")
    p.add_argument("--bertscore-model", help="BERTScore encoder (default: offline all-MiniLM-L6-v2)")
    p.add_argument("--bertscore-layer", type=int)
    p.add_argument("--explain", action="store_true", help="attach per-question evidence to every row")
    gpu = "on a GPU by its memory"
    p.add_argument("--batch-tokens", type=int, help=f"padded tokens per model batch (CPU 16384; {gpu})")
    p.add_argument("--batch-rows", type=int, help=f"sequences per model batch (CPU 256; {gpu})")
    p.add_argument("--chunk-size", type=int, help="captions per committed output chunk (CPU 512, GPU 2048)")
    p.add_argument(
        "--spacy-workers",
        type=int,
        help="processes parsing captions ahead of the models (CPU 0; GPU: the cores less two, at most 14)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _scorer(args: argparse.Namespace, models: str | None = None):  # noqa: ANN202
    from qace.api import QACE
    from qace.config import given_speed_settings

    return QACE(
        models=models or args.models,
        qg=args.qg,
        tqa=args.tqa,
        vqa=args.vqa,
        features=args.features,
        variant=args.variant,
        precision=args.precision,
        backend=args.backend,
        device=args.device,
        bertscore_model=args.bertscore_model,
        bertscore_layer=args.bertscore_layer,
        explain=args.explain,
        progress=not args.no_progress,
        **given_speed_settings(args),
    )


JUDGE_TEST_MODEL_WARNING = """
!!! WARNING: scoring with qace's TINY TEST MODELS (random weights, built locally in a second).
!!! These {metric} scores MEAN NOTHING. They only show that the pipeline runs.
!!! {hint}
"""


def _warn_if_test_models(scorer: object) -> None:
    if not getattr(scorer, "uses_test_models", False):
        return
    hint = getattr(scorer, "real_model_hint", None)
    if hint is None:  # logged, so that it is a JSON record with --log-format json
        log.warning(TEST_MODEL_WARNING)
    else:
        log.warning(JUDGE_TEST_MODEL_WARNING.format(metric=scorer.score_key, hint=hint))  # type: ignore[attr-defined]


class _Given(argparse.Action):
    """Store the value and remember that it was given, so defaults can be told from choices."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001, ANN204
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def _resolve_metric(args: argparse.Namespace) -> str:
    """The metric to run; ``--metric qace-ref|qace-img`` and ``--variant`` are one setting."""
    metric = getattr(args, "metric", None)
    given = getattr(args, "variant_given", False)
    if metric is None:
        return f"qace-{args.variant}"
    if metric in QACE_METRICS:
        if given and args.variant != QACE_METRICS[metric]:
            raise QACEError(f"--metric {metric} contradicts --variant {args.variant}; pass one of them")
        args.variant = QACE_METRICS[metric]
    elif given:
        raise QACEError(f"--variant is a QACE option; it has no meaning for --metric {metric}")
    return metric


def _judge(metric: str):  # noqa: ANN202
    """The module of judge ``metric`` (a clear error when its extra is not installed)."""
    module = JUDGE_MODULES[metric]
    try:
        judge = importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"--metric {metric} needs {module}, which cannot be imported here ({exc}); "
            "install the judges extra: pip install 'qace[judges]'"
        ) from exc
    require_extra("judges", judge.NEEDS, f"--metric {metric}")
    return judge


def judge_demo_scorer(metric: str, *, device: str, download: bool):  # noqa: ANN201
    """The scorer ``qace demo --metric <judge>`` runs: each judge module's ``demo_scorer``."""
    return _judge(metric).demo_scorer(device=device, download=download)


def cmd_score(args: argparse.Namespace) -> int:
    metric = _resolve_metric(args)
    judge = _judge(metric) if metric in JUDGE_MODULES else None
    check_output_file(args.output)
    if not args.gpus:  # --gpus checks its devices in resolve_devices
        check_device(args.device)
    if judge is None:
        _features_on_demand(args)
        check_img_features(args.variant, args.features)
    if args.gpus:
        from qace.scale.cli import cmd_score_sharded

        return cmd_score_sharded(args, judge)
    scorer = _scorer(args) if judge is None else judge.from_cli(args)
    _warn_if_test_models(scorer)
    summary = scorer.score_file(
        args.input,
        args.output,
        references=args.references,
        fmt=args.format,
        resume=args.resume,
        force=args.force,
    )
    return _report(scorer.signature, summary, args.output)


def _report(signature: str, result: Summary, output: str) -> int:
    lines = [f"signature: {signature}", result.line()]
    if result.errors:
        lines.append(
            f"{result.errors} record(s) could not be scored; see the .errors.jsonl file next to {output}"
        )
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
        choices=["qace", *JUDGE_MODULES],
        help="qace (QACE-Ref and QACE-Img), or a judge scoring the example's images",
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
