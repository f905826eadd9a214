"""Command-line options of the scorers, shared by ``qace score``, ``serve`` and ``score-ray``: ``--metric``
and its resolution to a registry entry (`entry_for`), the options every scorer reads (precision, batch
and chunk sizes, ``--explain``, progress), and QACE's own options with `qace_settings`, the `QACE`
keyword arguments they give. Light: nothing here imports torch or a model.
"""

from __future__ import annotations

import argparse
from typing import Any

from qace import scorers
from qace.checks import check_img_features
from qace.config import given_speed_settings
from qace.errors import ConfigError


def add_metric_option(parser: argparse.ArgumentParser, what: str = "the metric to score with") -> None:
    """``--metric``: one registered scorer (`qace.scorers`), or several comma-separated, scored in one pass
    (`qace.combined`); without it, ``--variant`` picks QACE."""
    lines = "; ".join(f"{name}: {scorers.get(name).help}" for name in scorers.names())
    parser.add_argument(
        "--metric",
        metavar="METRIC[,METRIC...]",
        help=f"{what} (default: qace-<--variant>); several, comma-separated, are scored in one pass into "
        f"one row per record; {lines}".replace("%", "%%"),
    )


def entry_for(args: argparse.Namespace) -> scorers.ScorerEntry:
    """The registry entry that parsed arguments name: ``--metric`` (comma-separated names: their combined
    entry, `qace.combined.combined_entry`), or QACE's alias ``--variant V`` (``qace-V``). A metric that
    fixes ``--variant`` (``qace-img``) sets it on ``args``; a given ``--variant`` that contradicts
    ``--metric``, or that ``--metric`` has no use for, is a `ConfigError`."""
    from qace.combined import combined_entry, split_names

    metric = getattr(args, "metric", None)
    variant = getattr(args, "variant", None) or "ref"
    given = getattr(args, "variant_given", False)
    entry = combined_entry(metric) if metric else scorers.get(f"qace-{variant}")
    names = split_names(metric) if metric else [entry.name]
    fixed = next((v for n in names if (v := dict(scorers.get(n).preset).get("variant")) is not None), None)
    if given and fixed is None:
        raise ConfigError(f"--variant is a QACE option; it has no meaning for --metric {metric}")
    if given and variant != fixed:
        raise ConfigError(f"--metric {metric} contradicts --variant {variant}; pass one of them")
    if fixed is not None:
        args.variant = fixed
    return entry


class Given(argparse.Action):
    """Store the value and remember that it was given, so defaults can be told from choices."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001, ANN204
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def add_scorer_options(p: argparse.ArgumentParser, *, device: bool = True) -> None:
    """The options every scorer reads: precision, ``--explain``, batch and chunk sizes, progress, and
    (with ``device``) ``--device``."""
    p.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "bf16", "fp16", "int8"],
        help="int8: ONNX backend on CPU only",
    )
    if device:
        p.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:1")
    p.add_argument("--explain", action="store_true", help="attach per-question evidence to every row")
    gpu = "on a GPU by its memory"
    p.add_argument("--batch-tokens", type=int, help=f"padded tokens per model batch (CPU 16384; {gpu})")
    p.add_argument("--batch-rows", type=int, help=f"sequences per model batch (CPU 256; {gpu})")
    p.add_argument("--chunk-size", type=int, help="captions per committed output chunk (CPU 512, GPU 2048)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def add_qace_options(parser: argparse.ArgumentParser) -> None:
    """QACE's own options (the registry's ``qace-ref`` and ``qace-img`` entries)."""
    p = parser.add_argument_group("QACE (--metric qace-ref / qace-img, or --variant)")
    p.add_argument(
        "--variant", default="ref", choices=["ref", "img"], action=Given, help="QACE-Ref or QACE-Img"
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
    p.add_argument("--backend", default="torch", choices=["torch", "onnx"])
    p.add_argument("--bertscore-model", help="BERTScore encoder (default: offline all-MiniLM-L6-v2)")
    p.add_argument("--bertscore-layer", type=int)
    p.add_argument(
        "--spacy-workers",
        type=int,
        help="processes parsing captions ahead of the models (CPU 0; GPU: the cores less two and the "
        "host processes, at most 14)",
    )
    p.add_argument(
        "--host-workers",
        type=int,
        help="processes doing each chunk's host work while this process only feeds the GPU (CPU 0: all "
        "in one process; PyTorch on a GPU: a quarter of the cores, 1 to 4); 0 is the single-process design",
    )


def qace_settings(args: argparse.Namespace) -> dict[str, Any]:
    """`QACE` keyword arguments (all but ``device``) from parsed arguments; QACE-Img without features is
    a `ConfigError`. The speed settings not given are left to the device (`qace.config.speed_defaults`)."""
    check_img_features(args.variant, args.features)
    return {
        "models": args.models, "qg": args.qg, "tqa": args.tqa, "vqa": args.vqa, "features": args.features,
        "variant": args.variant, "precision": args.precision, "backend": args.backend,
        "bertscore_model": args.bertscore_model, "bertscore_layer": args.bertscore_layer,
        "explain": args.explain, "progress": not args.no_progress, **given_speed_settings(args),
    }  # fmt: skip
