"""The reward service's own cost per call: ``/v1/reward`` against the same reward called in process.

    python -m benchmarks.service_overhead --out benchmarks/results/service_overhead_cpu.json   # seconds

No model runs: an instant QACE-Img-shaped reward (every caption valid, a reward and the five QACE
components, distinct float32 values as the engine's are) sits behind the real app
(`qace.serve.app.create_app`) on uvicorn on loopback, in a thread of this process, called with
`qace.serve.client.RewardClient`. So a call's time is what the service adds to scoring: the client's
request and the server's parse, the per-item checks, the micro-batcher's hand-over to its scoring
thread, the response and the client's parse of it. Per batch size (default 64, 256 and 1,024 captions),
the service and the in-process call take turns in ``--rounds`` rounds, each after ``--warmup`` untimed
calls.

``json`` times the part of a call the wire format decides, for the last batch size: the app's response
(`qace.serve.wire.dumps`) and the client's parse of it (`qace.serve.wire.loads`), against the standard
library's `json` doing the same (``ensure_ascii``, ``allow_nan=False``, compact separators: what the
app wrote before orjson), on the same body in the same run.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.run_info import default_result, record

WORDS = (
    "a man woman dog two riding horse on the beach near some blue water with small red ball in grass".split()
)


class InstantReward:
    """A QACE-Img-shaped reward that scores nothing: ``score`` returns at once (served like QACE's)."""

    variant = "img"
    signature = "instant|no models"

    def __init__(self, seed: int) -> None:
        from qace.reward import COMPONENTS

        self.components = COMPONENTS
        self.rng = np.random.default_rng(seed)

    def score(self, captions: list[Any], *, image_ids: Any = None, max_chars: int | None = None) -> list[Any]:
        from qace.reward import RewardResult

        values = self.rng.random((len(captions), len(self.components)), dtype=np.float32).tolist()
        return [
            RewardResult(row[0], True, None, dict(zip(self.components, row, strict=True))) for row in values
        ]


def workload(batch: int, seed: int) -> tuple[list[str], list[str]]:
    """``batch`` seeded captions of 8-14 words, and image ids shaped like COCO's."""
    rng = np.random.default_rng([seed, batch])
    captions = [" ".join(rng.choice(WORDS, size=int(rng.integers(8, 15)))) for _ in range(batch)]
    return captions, [f"COCO_val2014_{int(i):012d}" for i in rng.integers(0, 600_000, size=batch)]


def alternate(
    calls: dict[str, Callable[[], Any]], iterations: int, rounds: int, warmup: int
) -> dict[str, list]:
    """Seconds of each call's timed runs, the calls taking turns in ``rounds`` rounds of
    ``iterations // rounds`` timed runs each, after ``warmup`` untimed ones."""
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    per_round = iterations // rounds
    for _ in range(rounds):
        for name, call in calls.items():
            for _ in range(warmup):
                call()
            for _ in range(per_round):
                start = time.perf_counter()
                call()
                seconds[name].append(time.perf_counter() - start)
    return seconds


def json_section(body: dict[str, Any], iterations: int) -> dict[str, Any]:
    """Median ms to write and to read ``body`` with `qace.serve.wire` and with the standard library."""
    from qace.serve import wire

    def stdlib_dumps() -> bytes:
        return json.dumps(body, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()

    data, text = wire.dumps(body), stdlib_dumps()
    if wire.loads(data) != json.loads(text):
        raise RuntimeError("wire and json read different values from the same response")
    calls = {
        "wire_dumps": lambda: wire.dumps(body),
        "json_dumps": stdlib_dumps,
        "wire_loads": lambda: wire.loads(data),
        "json_loads": lambda: json.loads(text),
    }
    ms = {
        name: 1000 * statistics.median(s)
        for name, s in alternate(calls, iterations, min(5, iterations), 2).items()
    }
    return {
        "bytes": {"wire": len(data), "json": len(text)},
        "median_ms": ms,
        "write_and_read_ms": {
            "wire": ms["wire_dumps"] + ms["wire_loads"],
            "json": ms["json_dumps"] + ms["json_loads"],
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="default: benchmarks/results/service_overhead_cpu.json")
    parser.add_argument("--batches", nargs="+", type=int, default=[64, 256, 1024])
    parser.add_argument("--iterations", type=int, default=40, help="timed calls per path and batch size")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per path and round")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.iterations < args.rounds or min(args.batches) < 1:
        parser.error("give --rounds >= 1, --iterations >= --rounds and batches of at least one caption")
    logging.basicConfig(level=logging.WARNING)
    from qace.serve.app import ServeSettings, create_app
    from qace.serve.client import RewardClient
    from qace.serve.local import serving

    out = Path(args.out) if args.out else default_result("service_overhead", None)
    report: dict[str, Any] = {
        **record("benchmarks.service_overhead", argv, packages=("fastapi", "uvicorn", "httpx", "orjson")),
        "workload": "an instant QACE-Img-shaped reward (no models): seeded 8-14-word captions with "
        "COCO-style image ids; every caption valid, a reward and five components per caption",
        "settings": vars(args),
        "cells": [],
    }
    reward = InstantReward(args.seed)
    token = "benchmark-token-0123456789"
    settings = ServeSettings(max_items=max(args.batches), max_queue=max(1024, max(args.batches)))
    last_body: dict[str, Any] = {}
    with serving(create_app(reward, token=token, settings=settings), start_timeout_s=30) as url:
        with RewardClient(url, token, retries=0) as client:
            for batch in args.batches:
                captions, ids = workload(batch, args.seed)
                calls = {
                    "in-process": lambda c=captions, i=ids: [r.reward for r in reward.score(c, image_ids=i)],
                    "service:/v1/reward": lambda c=captions, i=ids: client.rewards(c, image_ids=i),
                }
                seconds = alternate(calls, args.iterations, args.rounds, args.warmup)
                cell: dict[str, Any] = {"batch": batch}
                for name, values in seconds.items():
                    ms = np.asarray(values) * 1000
                    cell[name] = {"p50_ms": float(np.median(ms)), "min_ms": float(ms.min()), "calls": len(ms)}
                cell["service_minus_in_process_p50_ms"] = (
                    cell["service:/v1/reward"]["p50_ms"] - cell["in-process"]["p50_ms"]
                )
                report["cells"].append(cell)
                print(
                    f"{batch} captions: service {cell['service:/v1/reward']['p50_ms']:.2f} ms, "
                    f"in process {cell['in-process']['p50_ms']:.2f} ms (p50)",
                    flush=True,
                )
            results = client.score(captions, image_ids=ids)
            last_body = {
                "request_id": "r",
                "signature": reward.signature,
                "component": "qace",
                "results": results,
            }
    report["json"] = {"batch": args.batches[-1], **json_section(last_body, args.iterations)}
    timing = report["json"]["write_and_read_ms"]
    print(
        f"response of {report['json']['batch']} results written and read: wire {timing['wire']:.2f} ms, "
        f"json {timing['json']:.2f} ms"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
