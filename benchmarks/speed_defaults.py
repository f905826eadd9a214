"""What the device's speed defaults give a GPU user who sets nothing: reward calls with the CPU's speed
settings (what a GPU engine got before `qace.config.speed_defaults`) against the device's, interleaved.

    python -m benchmarks.speed_defaults --out benchmarks/results/speed_defaults_h100.json
    python -m benchmarks.speed_defaults --tiny --out /tmp/speed-defaults-tiny.json   # CPU smoke run

Both engines are built in one process on the same models (the latency benchmark's workload: random T5-base
QG/TQA and T5-small Visual-T5, random features, forced seeded outputs, bf16), each warmed up on one chunk;
then every iteration draws a fresh batch and times one call of each engine on it, in alternating order, so
host drift hits both alike. The speed settings never change scores: the report gives the largest reward
difference between the two engines (fp32 rounding with other batch shapes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.latency import DEFAULT_DATA, context_columns, draw, summarize
from benchmarks.run_info import record
from benchmarks.workload import (
    add_engine_arguments,
    device_speed_settings,
    engine_defaults,
    flickr_workload,
    preload_features,
    workload_models,
    workload_scorer,
)
from qace.config import SPEED_OPTIONS
from qace.engine.instrument import cuda_sync
from qace.reward import QACEReward


def engine_settings(device: str) -> dict[str, dict[str, int]]:
    """The two engines' speed settings: the CPU's (the dataclass's) and the device's."""
    return {"cpu_defaults": device_speed_settings("cpu"), "device_defaults": device_speed_settings(device)}


def build(models: Path, variant: str, settings: dict[str, int], args: argparse.Namespace) -> QACEReward:
    options = argparse.Namespace(**{SPEED_OPTIONS[name]: value for name, value in settings.items()})
    scorer = workload_scorer(models, variant, device=args.device, precision=args.precision, args=options)
    return QACEReward(scorer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/speed_defaults.json")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA))
    parser.add_argument("--variant", default="img", choices=["img", "ref"])
    parser.add_argument("--batches", nargs="+", type=int, default=None, help="default 256 64 (4 with --tiny)")
    parser.add_argument("--iterations", type=int, default=None, help="timed calls per engine (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    engine_defaults(args)
    args.batches = args.batches or ([4] if args.tiny else [256, 64])
    args.iterations = args.iterations or (2 if args.tiny else 20)
    records = flickr_workload(Path(args.data_dir))
    models = workload_models(args, records, "qace-speed-defaults-", Path(args.data_dir))
    settings = engine_settings(args.device)
    rewards = {}
    for name, chosen in settings.items():
        reward = build(models, args.variant, chosen, args)
        preload_features(reward.scorer, records)
        list(reward.scorer.score_records(records[: 8 if args.tiny else 2048]))  # graphs of the big shapes
        rewards[name] = reward
    cells = []
    for batch in args.batches:
        seconds: dict[str, list[float]] = {name: [] for name in rewards}
        values: dict[str, list[list[float]]] = {name: [] for name in rewards}
        for i in range(-2, args.iterations):  # two untimed calls each first
            picked = draw(records, batch, args.seed, i)
            order = list(rewards) if i % 2 == 0 else list(reversed(rewards))
            for name in order:
                cuda_sync()
                start = time.perf_counter()
                out = rewards[name]([r.caption for r in picked], **context_columns(picked, args.variant))
                cuda_sync()
                if i >= 0:
                    seconds[name].append(time.perf_counter() - start)
                    values[name].append(out.tolist())
        cell: dict[str, Any] = {"variant": args.variant, "batch": batch, "iterations": args.iterations}
        for name in rewards:
            cell[name] = summarize(seconds[name])
        cell["speedup_p50"] = cell["cpu_defaults"]["p50_ms"] / cell["device_defaults"]["p50_ms"]
        cell["max_abs_reward_diff"] = float(
            np.max(np.abs(np.asarray(values["cpu_defaults"]) - np.asarray(values["device_defaults"])))
        )
        cells.append(cell)
        print(json.dumps(cell), flush=True)
    for reward in rewards.values():
        reward.scorer.candidates.close()
    report = {
        **record("benchmarks.speed_defaults", argv, device=args.device),
        "device": args.device,
        "precision": args.precision,
        "tiny": args.tiny,
        "workload": "the latency benchmark's (benchmarks/latency.py), fresh batches per iteration",
        "settings": settings,
        "cells": cells,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
