"""CLI for scaling out: ``qace score --gpus N|all`` (sharded) and ``qace score-ray`` (Ray Data).

Both build any registered metric (`qace.scorers`) from its entry: the workers and actors call the entry's
factory with the settings of the command line.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING

from qace import scorers
from qace.data.output import errors_path
from qace.errors import ConfigError
from qace.options import add_metric_option, add_scorer_options, entry_for
from qace.progress import summary as say

if TYPE_CHECKING:
    from qace.scorers import ScorerEntry

log = logging.getLogger(__name__)


def cmd_score_sharded(
    args: argparse.Namespace, entry: ScorerEntry | None = None, devices: list[str] | None = None
) -> int:
    """``qace score --gpus``: one scorer per GPU, output merged in input order, resumable per shard.

    ``entry`` is the metric's registry entry (default: the one ``args`` name); every worker builds the
    entry's factory from its settings of ``args``, on its own device.
    """
    from qace.scale.shards import resolve_devices, score_file_sharded

    entry = entry or entry_for(args)
    kwargs = {**entry.settings_from(args), "progress": False}
    devices = devices or resolve_devices(args.gpus)
    log.info("scoring %s on %d devices: %s", entry.name, len(devices), ", ".join(devices))
    summary = score_file_sharded(
        args.input, args.output, devices=devices, scorer_kwargs=kwargs, scorer_factory=entry.factory,
        cpu_pool=entry.cpu_pool, score_key=entry.score_key, references=args.references, fmt=args.format,
        resume=args.resume, force=args.force,
    )  # fmt: skip
    lines = [summary.line()]
    if summary.errors:
        lines.append(f"{summary.errors} record(s) not scored; see {errors_path(args.output)}")
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
    add_metric_option(p, "the metric; models, features and images must be visible to every node")
    add_scorer_options(p, device=False)  # an actor runs on its GPU, or on the CPU with --gpus-per-actor 0
    scorers.add_options(p)
    p.add_argument("--actors", default="1", help="actor pool size N, or MIN,MAX to autoscale")
    p.add_argument("--gpus-per-actor", type=float, default=1.0, help="0 runs the actors on CPU")
    p.add_argument(
        "--batch-size", type=int, default=None,
        help="records per actor call (default: 8,192 with GPU actors, 512 on CPU)",
    )  # fmt: skip
    p.add_argument(
        "--concurrent-calls", type=int, default=None,
        help="calls an actor scores at once, on threads (default: 2 with GPU actors, 1 on CPU)",
    )  # fmt: skip
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS or a local Ray)")
    p.add_argument("--resume", action="store_true", help="skip records already in the output directory")
    p.set_defaults(func=cmd_score_ray)


AUTH_HINT = (
    "If the cluster uses token authentication (Ray 2.60's `ray start` turns it on where a token exists, "
    "~/.ray/auth_token), set RAY_AUTH_MODE=token here too, with the cluster's token in RAY_AUTH_TOKEN or "
    "~/.ray/auth_token; else check --address and that the cluster runs"
)
"""Why a connection to a running cluster fails without saying so: Ray logs only "InvalidAuthToken"."""


def cmd_score_ray(args: argparse.Namespace) -> int:
    entry = entry_for(args)
    entry.require()
    kwargs = {**entry.settings_from(args), "progress": False}
    import ray

    from qace.scale.ray_data import score_to_parquet

    sizes = [int(x) for x in args.actors.split(",")]
    actors: int | tuple[int, int] = sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1])
    try:
        ray.init(address=args.address, ignore_reinit_error=True)
    except ConnectionError as exc:
        raise ConfigError(f"{exc}. {AUTH_HINT}") from exc
    result = score_to_parquet(
        args.inputs, args.output, scorer_kwargs=kwargs, entry=entry, fmt=args.format, resume=args.resume,
        actors=actors, gpus_per_actor=args.gpus_per_actor, batch_size=args.batch_size,
        concurrent_calls=args.concurrent_calls,
    )  # fmt: skip
    print(f"wrote {result['scored']} rows to {args.output} ({result['skipped']} already done) "
          f"in {result['seconds']:.1f}s")  # fmt: skip
    return 0
