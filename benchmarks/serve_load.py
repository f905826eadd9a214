"""The reward service under concurrent clients: one batch at a time against several at once.

    python -m benchmarks.serve_load --out benchmarks/results/serve_load_h200.json   # one GPU, minutes
    python -m benchmarks.serve_load --tiny --out /tmp/serve-load-tiny.json          # CPU smoke run

An RL trainer's ranks (or several rollout workers) send their reward requests at the same time. The
service micro-batches what arrives together and scores up to ``--concurrent-batches`` batches at once
(`qace.serve.batcher.MicroBatcher`), so one batch's host work (spaCy, tokenising, comparing answers)
can run while another is on the device. This benchmark measures what that buys:

- engine and workload as ``benchmarks.latency``'s (random paper-shaped models, forced seeded outputs,
  Flickr8k-Expert records, features preloaded, one warmed-up `QACEReward`);
- for each ``--concurrency`` value, the real app (``qace.serve.app.create_app``) on uvicorn on loopback,
  in a thread of this process, with that many concurrent batches; ``--clients`` threads, each with its
  own `qace.serve.client.RewardClient`, send ``--requests`` requests of ``--batch`` captions back to
  back, all starting together after ``--warmup`` untimed rounds of other draws; before each
  setting the engine's caches are emptied (`reset_caches`), so no setting meets captions another one
  left parsed or tokenised;
- per setting: every request's latency (p50, p99), the wall time of the timed rounds and the captions
  per second over it, and the service's counters (batches scored, items in them; untimed rounds
  included).

``max_batch`` is ``--batch``, so each request is a batch of its own and the settings differ only in how
many batches run at once. Rewards must equal across settings (each request scores the same captions).
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.latency import DEFAULT_DATA, context_columns, draw, make_scorer, serving, summarize
from benchmarks.run_info import record
from benchmarks.workload import (
    add_engine_arguments,
    engine_defaults,
    flickr_workload,
    preload_features,
    reset_caches,
    workload_models,
)
from qace.data.records import Record
from qace.reward import QACEReward

log = logging.getLogger(__name__)


def run_setting(
    reward: QACEReward,
    concurrency: int,
    untimed: list[list[list[Record]]],
    requests: list[list[list[Record]]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Serve ``reward`` with ``concurrency`` batches at once; each client sends its untimed requests
    (``untimed[client]``), then its timed ones (``requests[client]``) back to back, all clients together.
    Returns the setting's cell."""
    from qace.serve.app import ServeSettings
    from qace.serve.client import RewardClient

    token = secrets.token_hex(16)
    items = args.batch * args.clients
    settings = ServeSettings(
        max_batch=args.batch,
        max_items=args.batch,
        max_queue=max(1024, 2 * items),
        timeout_s=600.0,
        concurrent_batches=concurrency,
    )
    with serving(reward, settings, token) as url:
        clients = [RewardClient(url, token, timeout_s=600.0, retries=0) for _ in range(args.clients)]
        try:
            rewards: list[list[list[float]]] = [[] for _ in clients]
            seconds: list[list[float]] = [[] for _ in clients]
            barrier = threading.Barrier(len(clients) + 1)

            def client(n: int, timed: bool) -> None:
                barrier.wait()
                rounds = requests[n] if timed else untimed[n]
                for batch in rounds:
                    start = time.perf_counter()
                    values = clients[n].rewards(
                        [r.caption for r in batch], **context_columns(batch, reward.variant)
                    )
                    if timed:
                        seconds[n].append(time.perf_counter() - start)
                        rewards[n].append([float(v) for v in values])

            for timed in (False, True):
                threads = [threading.Thread(target=client, args=(n, timed)) for n in range(len(clients))]
                for thread in threads:
                    thread.start()
                barrier.wait()
                started = time.perf_counter()
                for thread in threads:
                    thread.join()
                wall = time.perf_counter() - started
            stats = _service_stats(url, token)
        finally:
            for c in clients:
                c.close()
    flat = [s for per_client in seconds for s in per_client]
    captions = args.batch * len(flat)
    return {
        "concurrent_batches": concurrency,
        "serve_settings": asdict(settings),
        **summarize(flat),
        "requests": len(flat),
        "wall_seconds": wall,
        "captions_per_s": captions / wall,
        "service": stats,
        "rewards": rewards,
    }


def _service_stats(url: str, token: str) -> dict[str, float]:
    """The service's batch counters (``/metrics``): batches scored, items in them, seconds scoring."""
    import httpx

    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    wanted = {"qace_batches_total", "qace_batched_items_total", "qace_score_seconds_total"}
    stats = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            stats[name] = float(value)
    return stats


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/serve_load.json")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA))
    parser.add_argument("--variant", choices=["img", "ref"], default="img")
    parser.add_argument("--batch", type=int, default=None, help="captions per request (default 256)")
    parser.add_argument("--clients", type=int, default=4, help="clients sending at once")
    parser.add_argument("--requests", type=int, default=None, help="timed requests per client (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed requests per client first")
    parser.add_argument(
        "--concurrency", nargs="+", type=int, default=[1, 2], help="--concurrent-batches values to compare"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--candidate-cache", action="store_true", help="keep spaCy candidates across calls (off by default)"
    )
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    engine_defaults(args)
    args.batch = args.batch or (4 if args.tiny else 256)
    args.requests = args.requests or (2 if args.tiny else 10)
    if min(args.concurrency) < 1 or args.clients < 1 or args.batch < 1:
        parser.error("--concurrency, --clients and --batch must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    records = flickr_workload(Path(args.data_dir))
    models_dir = workload_models(args, records, "qace-serve-load-", Path(args.data_dir))
    scorer = make_scorer(models_dir, args.variant, args.device, args)
    preload_features(scorer, records)
    reward = QACEReward(scorer)
    warm = time.perf_counter()
    shapes = reward.warm_up()
    report: dict[str, Any] = {
        **record("benchmarks.serve_load", argv, device=args.device, packages=("transformers", "fastapi")),
        "device": args.device,
        "precision": args.precision,
        "tiny": args.tiny,
        "variant": args.variant,
        "signature": reward.signature,
        "workload": (
            f"{args.clients} clients at once, each {args.requests} requests of {args.batch} captions back "
            f"to back (after {args.warmup} untimed), drawn without replacement from the {len(records)} "
            f"Flickr8k-Expert records (seed {args.seed}); the same requests for every setting, each setting "
            "after emptying the engine's caches; "
            + (
                "tiny random T5s (a smoke run: the numbers mean nothing)"
                if args.tiny
                else "random T5-base QG/TQA and T5-small Visual-T5, random features, forced seeded outputs"
            )
        ),  # fmt: skip
        "warm_up_seconds": time.perf_counter() - warm,
        "graph_shapes_warmed_up": shapes,
        "cells": [],
    }
    requests = [
        [draw(records, args.batch, args.seed, n * 1000 + i) for i in range(args.requests)]
        for n in range(args.clients)
    ]
    untimed = [
        [draw(records, args.batch, args.seed, -1 - n * 1000 - i) for i in range(args.warmup)]
        for n in range(args.clients)
    ]
    try:
        for concurrency in args.concurrency:
            reset_caches(scorer)
            cell = run_setting(reward, concurrency, untimed, requests, args)
            log.info(
                "concurrent batches %d: p50 %.1f ms, p99 %.1f ms, %.0f captions/s",
                concurrency, cell["p50_ms"], cell["p99_ms"], cell["captions_per_s"],
            )  # fmt: skip
            report["cells"].append(cell)
    finally:
        scorer.close()
    first = np.asarray(report["cells"][0]["rewards"])
    report["max_reward_difference_across_settings"] = max(
        float(np.abs(np.asarray(c["rewards"]) - first).max()) for c in report["cells"]
    )
    for cell in report["cells"]:
        del cell["rewards"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["cells"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
