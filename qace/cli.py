"""Command line: ``qace score``, ``demo``, ``make-test-models``, ``features`` and the optional commands."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from qace import __version__
from qace.errors import BackendUnavailableError, QACEError

if TYPE_CHECKING:
    from qace.data.run import Summary

log = logging.getLogger("qace")

OPTIONAL_COMMANDS = ("qace.meta.cli", "qace.export.cli", "qace.serve.cli", "qace.scale.cli")
"""Modules whose ``register(subparsers)`` adds commands; each may need an optional extra."""

QACE_METRICS = {"qace-ref": "ref", "qace-img": "img"}
JUDGE_MODULES = {"visce2": "qace.judges.visce2", "regen": "qace.judges.regen"}
"""Judges of ``--metric``: each module has ``add_cli_arguments(parser)``, ``cli_settings(args)`` (the
scorer's keyword arguments), ``from_cli(args)``, ``demo_scorer(...)`` and ``SCORER``, the name of its
scorer class (so ``--gpus`` workers can build it from those keyword arguments)."""
METRICS = (*QACE_METRICS, *JUDGE_MODULES)

TEST_MODEL_WARNING = """
!!! WARNING: scoring with qace's TINY TEST MODELS (random weights, trained for seconds on a toy task).
!!! These scores MEAN NOTHING. They only show that the pipeline runs.
!!! For real QACE scores, give the paper's models: either let qace download them once
!!!   (huggingface-cli download mrm8488/t5-base-finetuned-question-generation-ap / valhalla/t5-base-qa-qg-hl)
!!! or pass --models DIR with qg/, tqa/ and vqa/ checkpoints (see README, "Real models").
"""


def _add_score(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("score", help="score captions from a JSONL/CSV/COCO file")
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
    for module in JUDGE_MODULES.values():
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
    p.add_argument("--features", help="region features: directory of per-image .npz files or an HDF5 store")
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
    if hint is None:
        print(TEST_MODEL_WARNING, file=sys.stderr)
    else:
        print(JUDGE_TEST_MODEL_WARNING.format(metric=scorer.score_key, hint=hint), file=sys.stderr)  # type: ignore[attr-defined]


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
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"--metric {metric} needs {module}, which cannot be imported here ({exc}); "
            "install the judges extra: pip install 'qace[judges]'"
        ) from exc


def judge_demo_scorer(metric: str, *, device: str, download: bool):  # noqa: ANN201
    """The scorer ``qace demo --metric <judge>`` runs: each judge module's ``demo_scorer``."""
    return _judge(metric).demo_scorer(device=device, download=download)


def cmd_score(args: argparse.Namespace) -> int:
    metric = _resolve_metric(args)
    judge = _judge(metric) if metric in JUDGE_MODULES else None
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


def _report(signature: str, summary: Summary, output: str) -> int:
    print(f"signature: {signature}")
    print(summary.line())
    if summary.errors:
        print(f"{summary.errors} record(s) could not be scored; see the .errors.jsonl file next to {output}")
    return 0


def cmd_make_test_models(args: argparse.Namespace) -> int:
    from qace.models.testing import make_test_models

    out = make_test_models(args.dir, seed=args.seed, force=args.force)
    print(f"test models written to {out} (qg/, tqa/, vqa/): for tests and demos only, scores mean nothing")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from qace.demo import run_demo

    return run_demo(
        Path(args.output_dir),
        models=args.models,
        device=args.device,
        download=args.download,
        metric=args.metric,
    )


def cmd_features_pack(args: argparse.Namespace) -> int:
    from qace.data.features import open_feature_store, pack_features

    count = pack_features(open_feature_store(args.source), args.output)
    print(f"packed {count} images into {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
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
    pack = fsub.add_parser("pack", help="pack per-image .npz files into one HDF5 store")
    pack.add_argument("source", help="directory of <image_id>.npz files (or another store)")
    pack.add_argument("output", help="output .h5 file")
    pack.set_defaults(func=cmd_features_pack)

    for module in OPTIONAL_COMMANDS:
        try:  # a register may import its extra itself (score-ray imports ray)
            importlib.import_module(module).register(sub)
        except ImportError as exc:  # an optional extra is not installed
            log.debug("commands of %s unavailable: %s", module, exc)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except QACEError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
