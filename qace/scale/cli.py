"""CLI for scaling out: ``qace score --gpus N|all`` (sharded) and ``qace score-ray`` (Ray Data)."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from qace.checks import check_img_features
from qace.config import given_speed_settings
from qace.progress import summary as say

log = logging.getLogger(__name__)


def scorer_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`QACE` keyword arguments from ``qace score``'s model options, minus the device (set per shard)."""
    return {
        "models": args.models, "qg": args.qg, "tqa": args.tqa, "vqa": args.vqa, "features": args.features,
        "variant": args.variant, "precision": args.precision, "backend": args.backend,
        "bertscore_model": args.bertscore_model, "bertscore_layer": args.bertscore_layer,
        "explain": args.explain, "progress": False, **given_speed_settings(args),
    }  # fmt: skip


def cmd_score_sharded(args: argparse.Namespace, judge: Any = None, devices: list[str] | None = None) -> int:
    """``qace score --gpus``: one scorer per GPU, output merged in input order, resumable per shard.

    ``judge`` is a ``qace.judges`` module (``--metric visce2|regen``): its workers build the module's
    ``SCORER`` class from ``cli_settings(args)``; without one, the workers run QACE.
    """
    from qace.scale.shards import resolve_devices, score_file_sharded

    devices = devices or resolve_devices(args.gpus)
    if judge is None:
        kwargs, factory, key = scorer_kwargs(args), None, "qace"
    else:
        kwargs = {**judge.cli_settings(args), "progress": False}
        kwargs.pop("device")
        factory = f"{judge.__name__}:{judge.SCORER}"
        key = getattr(judge, judge.SCORER).score_key
    log.info("scoring %s on %d devices: %s", key, len(devices), ", ".join(devices))
    summary = score_file_sharded(
        args.input, args.output, devices=devices, scorer_kwargs=kwargs, scorer_factory=factory,
        score_key=key, references=args.references, fmt=args.format, resume=args.resume, force=args.force,
    )  # fmt: skip
    lines = [summary.line()]
    if summary.errors:
        lines.append(
            f"{summary.errors} record(s) not scored; see the .errors.jsonl file next to {args.output}"
        )
    say("\n".join(lines), output=args.output, devices=devices, **summary.fields())
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``qace score-ray`` (`qace.cli` calls this only where the ``ray`` extra is installed)."""
    p = sub.add_parser(
        "score-ray", description="Score Parquet/JSONL on a Ray cluster into a Parquet directory."
    )
    p.add_argument("inputs", nargs="+", help="Parquet files/directories or JSONL files (shared storage)")
    p.add_argument("--output", "-o", required=True, help="output directory of Parquet files")
    p.add_argument("--format", default="auto", choices=["auto", "jsonl", "csv", "coco", "parquet"])
    p.add_argument("--models", help="directory with qg/, tqa/, vqa/ visible to every node")
    p.add_argument("--variant", default="ref", choices=["ref", "img"])
    p.add_argument("--features", help="region features visible to every node (QACE-Img)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--explain", action="store_true")
    p.add_argument("--actors", default="1", help="actor pool size N, or MIN,MAX to autoscale")
    p.add_argument("--gpus-per-actor", type=float, default=1.0, help="0 runs the actors on CPU")
    p.add_argument("--batch-size", type=int, default=512, help="captions per map_batches call")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a local Ray)")
    p.add_argument("--resume", action="store_true", help="skip records already in the output directory")
    p.set_defaults(func=cmd_score_ray)


def cmd_score_ray(args: argparse.Namespace) -> int:
    check_img_features(args.variant, args.features)
    import ray

    from qace.scale.ray_data import score_to_parquet

    sizes = [int(x) for x in args.actors.split(",")]
    actors: int | tuple[int, int] = sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1])
    ray.init(address=args.address, ignore_reinit_error=True)
    kwargs = {"models": args.models, "variant": args.variant, "features": args.features,
              "precision": args.precision, "explain": args.explain}  # fmt: skip
    result = score_to_parquet(
        args.inputs, args.output, scorer_kwargs=kwargs, fmt=args.format, resume=args.resume, actors=actors,
        gpus_per_actor=args.gpus_per_actor, batch_size=args.batch_size,
    )  # fmt: skip
    print(f"wrote {result['scored']} rows to {args.output} ({result['skipped']} already done) "
          f"in {result['seconds']:.1f}s")  # fmt: skip
    return 0
