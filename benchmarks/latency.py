"""Reward latency: p50/p99 of one call for batches of 64, 256 and 1,024 captions, in process and over HTTP.

    python -m benchmarks.latency --out benchmarks/results/latency.json [--variants img ref]
    python -m benchmarks.latency --tiny --out /tmp/latency-tiny.json     # CPU smoke run, about a minute

Same workload and benchmark-only length control as ``benchmarks/throughput.py`` (Flickr8k-Expert
captions, random T5-base QG/TQA and T5-small Visual-T5, random region features, forced seeded outputs),
bf16. Paths, all on one engine (models loaded once):

- ``in-process``: ``QACEReward.__call__`` (captions in, a float32 tensor on the device out);
- ``in-process:worker-thread`` (``--worker-thread``): the same call made on one long-lived thread other
  than the one that warmed the reward up, as the service's batcher makes it: what the service pays for
  the thread apart from HTTP;
- ``service:/v1/reward``: the real FastAPI app (``qace.serve.app.create_app``) on uvicorn on loopback,
  in a thread of this process, called with ``qace.serve.client.RewardClient``;
- ``service:/get_reward``: the same server through OpenRLHF's remote-reward protocol (plain httpx, as
  OpenRLHF posts it), by default only for the 256 batch (``--openrlhf-batches``).

Each timed iteration draws a fresh batch of workload records (seeded; the same batches for every path).
Not timed: ``QACEReward.warm_up`` per variant (every batch shape's CUDA graphs for prompts of up to
``--graph-warm-up-length`` tokens, spaCy's workers, BERTScore; 0 skips it), three calls of the smallest
batch (timed apart as ``first_calls_ms``: what a fresh service's first requests wait), one full chunk of
records, then, per cell, the engine's caches emptied (`reset_caches`: the paths time the same batches,
which an earlier cell would otherwise have left tokenised) and ``--warmup`` calls. A batch size's
paths take turns ``--rounds`` times (default 2), each with its share of the calls (its caches emptied
and ``--warmup`` calls before each share), so a drift of the machine over the run does not fall on the path
timed last; ``p50_ms_by_round`` gives each share's p50. Graphs still
captured during timed calls (a batch shape first seen there) are counted in the cell's
``graph_captures_in_timed_calls``, the garbage collector's collections and pauses in
``garbage_collections_in_timed_calls``. Where a call's time goes:
``benchmarks.profile`` (same scorer, `make_scorer`).

A call of one chunk (every batch timed here) is scored in the caller's process, with the engine core's
host processes running or not (`qace.api.QACE._choose_design`), so they are not started.

Answer-candidate caching across calls is off by default (``cache_size 0``: an RL policy writes new
captions every step, while this workload repeats its 977 distinct captions), and the region features of
the workload's 1,000 images are preloaded into the host's feature cache. Their uploads to the device's
feature cache (`qace.engine.device_features`) then fall on the first calls after a cell's caches are
emptied, and later calls find most images there, as an RL run does whose images fit that cache (8,192
images). ``--new-images`` gives every call images the device has not seen, as an RL step over a larger
image set meets them: each call's image ids are renamed for that call (`draw`), and the store answers
a renamed id with the image's own features from host memory (`NewImageIds`), so each call pays the
stacking and upload of its images' features and nothing else changes (the same rewards).
``--features-from h5`` reads the features from an HDF5 store packed from the same random features
(`pack_features`: float16, so the rewards differ from the default's by its rounding); with
``--new-images`` every renamed id is read from that store when a call asks for it, so each call also
pays the reads (inflating each image's chunk) of images new to the host, as an RL step whose images are
not in the host's feature cache (4,096 images) does.
``--tiny``: tiny random models on the CPU, batches of 4 and 8, 2 iterations: a smoke run, not a number.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.run_info import record
from benchmarks.workload import (
    add_engine_arguments,
    engine_defaults,
    flickr_workload,
    graph_captures,
    preload_features,
    reset_caches,
    workload_models,
    workload_scorer,
)
from qace.api import QACE
from qace.data.features import HDF5Store, RandomFeatureStore, pack_features
from qace.data.records import Record
from qace.engine.instrument import CollectorPauses, cuda_sync
from qace.reward import QACEReward

log = logging.getLogger(__name__)

TARGET = {"variant": "img", "path": "in-process", "batch": 256, "p50_ms": 100.0}
"""The issue's goal: 256 QACE-Img captions under 100 ms p50 on one H100/H200."""

OPENRLHF_PROMPT = "<image> Describe the image in one sentence: "
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def make_scorer(
    models_dir: Path, variant: str, device: str, args: argparse.Namespace, features: Any = None
) -> QACE:
    """The benchmark engine (`workload_scorer`, ``features`` its store: default random), candidate cache
    as ``--candidate-cache`` says, without the engine core's host processes, which a call of one chunk
    never uses."""
    return workload_scorer(
        models_dir,
        variant,
        device=device,
        precision=args.precision,
        args=args,
        candidate_cache=args.candidate_cache,
        features=features,
        host_processes=False,
    )


def timed(call: Callable[..., object], *args: Any, **kwargs: Any) -> float:
    """Seconds ``call(*args, **kwargs)`` takes, its GPU work included."""
    start = time.perf_counter()
    call(*args, **kwargs)
    cuda_sync()
    return time.perf_counter() - start


def gpu_reserved_gib() -> float:
    """GPU memory the caching allocator holds (0 without CUDA)."""
    return torch.cuda.memory_reserved() / 2**30 if torch.cuda.is_available() else 0.0


def draw(
    records: Sequence[Record], batch: int, seed: int, iteration: int, new_images: bool = False
) -> list[Record]:
    """Iteration ``iteration``'s batch (negative: warm-up), the same for every path; with
    ``new_images`` each record's image id is renamed for the iteration (`NewImageIds`)."""
    rng = np.random.default_rng([seed, batch, iteration + 1_000_000])
    picked = [records[i] for i in rng.choice(len(records), size=batch, replace=False)]
    if not new_images:
        return picked
    return [replace(r, image_id=f"{r.image_id}{NewImageIds.MARK}{iteration}") for r in picked]


class NewImageIds:
    """A feature store answering ``"<image id>@<anything>"`` with that image's features from ``store``:
    ids that no cache has seen, for the features of ``image_ids``. ``held`` (the default): each image
    read once into host memory, so a renamed id costs a lookup; else every renamed id is read from
    ``store`` when asked, as an image new to the host is (and several at once where ``store`` reads so,
    its ``get_many``). Its identity is ``store``'s (the same features)."""

    MARK = "@"

    def __init__(self, store: Any, image_ids: Sequence[str], held: bool = True) -> None:
        self.signature, self.identity = store.signature, store.identity
        self._store, self._ids = store, set(image_ids)
        self._held = {image_id: store.get(image_id) for image_id in image_ids} if held else None
        if not held and hasattr(store, "get_many"):
            self.get_many = lambda ids, pool: store.get_many([self._own(i) for i in ids], pool)

    def _own(self, image_id: str) -> str:
        return image_id.rpartition(self.MARK)[0] if self.MARK in image_id else image_id

    def __contains__(self, image_id: object) -> bool:
        return isinstance(image_id, str) and self._own(image_id) in self._ids

    def ids(self) -> list[str]:
        return sorted(self._ids)

    def get(self, image_id: str) -> np.ndarray:
        own = self._own(image_id)
        return self._held[own] if self._held is not None else self._store.get(own)


def feature_store(args: argparse.Namespace, records: Sequence[Record]) -> Any:
    """QACE-Img's features for ``--features-from`` and ``--new-images`` (module docstring; an HDF5 store
    is packed in a new temporary directory); None: the default random store."""
    if args.features_from == "memory" and not args.new_images:
        return None
    images = sorted({r.image_id or "" for r in records})
    store: Any = RandomFeatureStore(seed=0)
    if args.features_from == "h5":
        path = Path(tempfile.mkdtemp(prefix="qace-latency-features-")) / "features.h5"
        pack_features(((i, store.get(i)) for i in images), path, progress=False)
        store = HDF5Store(path)
    return NewImageIds(store, images, held=args.features_from == "memory") if args.new_images else store


@contextmanager
def serving(reward: QACEReward, settings: Any, token: str) -> Iterator[str]:
    """The real reward app on uvicorn, loopback, a free port, in a daemon thread; yields its URL."""
    from qace.serve.app import create_app
    from qace.serve.local import serving as serve_in_thread

    with serve_in_thread(create_app(reward, token=token, settings=settings), start_timeout_s=30) as url:
        yield url


def context_columns(batch: Sequence[Record], variant: str) -> dict[str, Any]:
    """The reward call's context keywords for ``batch``: references (Ref) or image ids (Img)."""
    if variant == "ref":
        return {"references": [list(r.references or ()) for r in batch]}
    return {"image_ids": [r.image_id for r in batch]}


@contextmanager
def callers(
    reward: QACEReward, url: str | None, token: str, worker_thread: bool = False
) -> Iterator[dict[str, Callable[[list[Record]], list]]]:
    """path name -> call(batch) -> rewards (floats), for every path this run can take."""
    variant = reward.variant

    def in_process(batch: list[Record]) -> list[float]:
        values = reward([r.caption for r in batch], **context_columns(batch, variant))
        cuda_sync()
        return values.tolist()

    with ExitStack() as stack:
        paths: dict[str, Callable[[list[Record]], list]] = {"in-process": in_process}
        if worker_thread:
            worker = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="qace-latency-worker"))
            paths["in-process:worker-thread"] = lambda batch: worker.submit(in_process, batch).result()
        if url is not None:
            import httpx

            from qace.serve.client import RewardClient

            client = stack.enter_context(RewardClient(url, token, timeout_s=600.0, retries=0))
            headers = {"Authorization": f"Bearer {token}"}
            http = stack.enter_context(httpx.Client(base_url=url, timeout=600.0, headers=headers))

            def v1(batch: list[Record]) -> list[float]:
                return client.rewards([r.caption for r in batch], **context_columns(batch, variant))

            def openrlhf(batch: list[Record]) -> list[float]:
                labels = [
                    json.dumps(list(r.references or ())) if variant == "ref" else r.image_id for r in batch
                ]
                payload = {
                    "query": [f"{OPENRLHF_PROMPT}{r.caption}</s>" for r in batch],
                    "prompts": [OPENRLHF_PROMPT] * len(batch),
                    "labels": labels,
                }
                response = http.post("/get_reward", json=payload)
                response.raise_for_status()
                return [float(x) for x in response.json()["rewards"]]

            paths["service:/v1/reward"] = v1
            paths["service:/get_reward"] = openrlhf
        yield paths


def summarize(seconds: Sequence[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000.0
    return {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
    }


def measure(
    call: Callable[[list[Record]], list],
    records: Sequence[Record],
    batch: int,
    timed: range,
    warmup: range,
    seed: int,
    captures: Callable[[], int] = lambda: 0,
    new_images: bool = False,
    uploads: Callable[[], int] = lambda: 0,
) -> tuple[list[float], list[list[float]], int, dict[str, Any], int]:
    """Seconds per timed call, the rewards each returned, the CUDA graphs captured during the timed
    calls (``captures`` counts them; warm-up calls are made, not timed), the garbage collector's
    pauses during them (this process: the caller, and the service's thread on the service paths) and
    the images uploaded to the device's feature cache during them (``uploads`` counts them);
    ``new_images``: `draw`'s."""
    for i in warmup:
        call(draw(records, batch, seed, -1 - i, new_images))
    captured, uploaded = captures(), uploads()
    seconds, rewards = [], []
    pauses = CollectorPauses()
    try:
        for i in timed:
            picked = draw(records, batch, seed, i, new_images)
            start = time.perf_counter()
            values = call(picked)
            seconds.append(time.perf_counter() - start)
            if len(values) != batch:
                raise RuntimeError(f"{len(values)} rewards for {batch} captions")
            rewards.append(values)
    finally:
        pauses.close()
    oldest = pauses.by_generation.get(2, [0, 0.0])
    collections = {
        "collections": pauses.count,
        "ms": 1000 * pauses.seconds,
        "oldest_generation_collections": int(oldest[0]),
        "oldest_generation_ms": 1000 * oldest[1],
    }
    return seconds, rewards, captures() - captured, collections, uploads() - uploaded


def rounds(iterations: int, count: int, warmup: int) -> list[tuple[range, range]]:
    """The timed calls' iteration indices and the warm-up calls' indices of each of ``count`` rounds:
    ``iterations`` split as evenly as they go (earlier rounds take the remainder), ``warmup`` calls
    before each round's, each round's warm-up batches its own."""
    cuts = np.cumsum([0] + [iterations // count + (r < iterations % count) for r in range(count)])
    return [
        (range(int(cuts[r]), int(cuts[r + 1])), range(r * warmup, (r + 1) * warmup)) for r in range(count)
    ]


def run_variant(
    variant: str,
    records: list[Record],
    models_dir: Path,
    args: argparse.Namespace,
    report: dict[str, Any],
    write: Callable[[], None],
    started: float,
) -> None:
    """Time every (batch, path) cell of ``variant`` into ``report["cells"]``, writing after each."""
    load = time.perf_counter()
    features = feature_store(args, records) if variant == "img" else None
    scorer = make_scorer(models_dir, variant, args.device, args, features)
    preload_features(scorer, records)
    reward = QACEReward(scorer)
    info: dict[str, Any] = {"signature": reward.signature, "load_seconds": time.perf_counter() - load}
    if args.graph_warm_up_length != 0:
        reserved = gpu_reserved_gib()
        warm = time.perf_counter()
        length = {} if args.graph_warm_up_length is None else {"max_length": args.graph_warm_up_length}
        info["graph_shapes_warmed_up"] = reward.warm_up(**length)
        info["graph_warm_up_seconds"] = time.perf_counter() - warm
        info["graph_warm_up_reserved_gib"] = gpu_reserved_gib() - reserved
    first = min(args.batches)  # what a service's first requests wait for after the warm-up (if any)
    batches = [draw(records, first, args.seed, -1000 - i) for i in range(3)]
    info["first_calls_ms"] = [
        1000 * timed(reward, [r.caption for r in b], **context_columns(b, variant)) for b in batches
    ]
    warm = time.perf_counter()  # one full chunk first (without a graph warm-up, the largest graphs)
    list(scorer.score_records(records[: args.warmup_records]))
    cuda_sync()
    info["warmup_records"] = min(args.warmup_records, len(records))
    info["warmup_seconds"] = time.perf_counter() - warm
    info["graph_captures_after_warmup"] = graph_captures(scorer)
    report["variants"][variant] = info
    token = secrets.token_hex(16)
    server: Any = _nothing()
    if args.service:
        from qace.serve.app import ServeSettings  # imports FastAPI; only the service paths need it

        biggest = max(args.batches)
        settings = ServeSettings(
            max_items=biggest, max_queue=max(1024, biggest), max_body_bytes=64 << 20, timeout_s=600.0
        )
        info["serve_settings"] = asdict(settings)
        server = serving(reward, settings, token)
    captures = functools.partial(graph_captures, scorer)

    def uploads() -> int:
        cache = getattr(scorer.models.vqa, "features", None)
        return 0 if cache is None else int(cache.uploads)

    with server as url, callers(reward, url, token, args.worker_thread) as paths:
        for batch, iterations in zip(args.batches, args.iterations, strict=True):
            live = {
                path: call
                for path, call in paths.items()
                if path != "service:/get_reward" or batch in args.openrlhf_batches
            }
            cells = {path: {"variant": variant, "path": path, "batch": batch} for path in live}
            report["cells"].extend(cells.values())
            if args.max_seconds and time.perf_counter() - started > args.max_seconds:
                for cell in cells.values():
                    cell["skipped"] = f"time budget of {args.max_seconds:g} s spent"
                continue
            measured: dict[str, list[tuple[list[float], list[list[float]], int, dict[str, Any], int]]] = {
                path: [] for path in live
            }
            for block, warmup in rounds(iterations, args.rounds, args.warmup):
                for path, call in live.items():
                    reset_caches(scorer)  # no path meets the captions another left parsed or tokenised
                    measured[path].append(
                        measure(
                            call, records, batch, block, warmup, args.seed, captures, args.new_images, uploads
                        )
                    )
            inproc_rewards: list[list[float]] | None = None
            for path, cell in cells.items():
                seconds = [x for one in measured[path] for x in one[0]]
                rewards = [x for one in measured[path] for x in one[1]]
                cell.update(summarize(seconds))
                cell["p50_ms_by_round"] = [summarize(one[0])["p50_ms"] for one in measured[path]]
                cell["graph_captures_in_timed_calls"] = sum(one[2] for one in measured[path])
                cell["garbage_collections_in_timed_calls"] = {
                    key: sum(one[3][key] for one in measured[path]) for key in measured[path][0][3]
                }
                cell["feature_uploads_in_timed_calls"] = sum(one[4] for one in measured[path])
                cell["iterations"] = iterations
                cell["warmup"] = args.warmup
                cell["rounds"] = args.rounds
                cell["mean_reward"] = float(np.mean(rewards))
                cell["distinct_captions_per_batch"] = float(
                    np.mean(
                        [
                            len({r.caption for r in draw(records, batch, args.seed, i)})
                            for i in range(iterations)
                        ]
                    )
                )
                if path == "in-process":
                    inproc_rewards = rewards
                elif inproc_rewards is not None:  # same batches: the service must give the same rewards
                    cell["max_abs_diff_vs_in_process"] = float(
                        np.max(np.abs(np.asarray(rewards) - np.asarray(inproc_rewards)))
                    )
                log.info("%s %s batch %d: p50 %.1f ms", variant, path, batch, cell["p50_ms"])
            write()
    scorer.candidates.close()


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/latency.json")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA))
    parser.add_argument("--variants", nargs="+", default=["img", "ref"], choices=["img", "ref"])
    parser.add_argument("--batches", nargs="+", type=int, default=None, help="default 64 256 1024")
    parser.add_argument(
        "--iterations",
        nargs="+",
        type=int,
        default=None,
        help="timed calls per batch size (default 20 20 10)",
    )
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per cell (default 5)")
    parser.add_argument(
        "--graph-warm-up-length",
        type=int,
        default=None,
        help="QACEReward.warm_up(max_length=...) before anything else (default: its default); 0: none "
        "(graphs are then captured when a shape is first met)",
    )
    parser.add_argument(
        "--warmup-records",
        type=int,
        default=None,
        help="records scored once per variant before any cell (default: one chunk, 2048; 8 with --tiny)",
    )
    parser.add_argument(
        "--openrlhf-batches",
        nargs="*",
        type=int,
        default=None,
        help="batch sizes that also time /get_reward (default 256; none given: all)",
    )
    parser.add_argument("--no-service", dest="service", action="store_false", help="in-process only")
    parser.add_argument(
        "--worker-thread",
        action="store_true",
        help="also time the in-process call made on a worker thread (path in-process:worker-thread)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="time a batch size's paths in this many alternating rounds, each path's calls split among "
        "them (default 2, or 1 where a batch size has one call; 1: each path's calls at once, one path "
        "after another)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--candidate-cache", action="store_true", help="keep spaCy candidates across calls (off by default)"
    )
    parser.add_argument(
        "--features-from",
        choices=["memory", "h5"],
        default="memory",
        help="QACE-Img: random features held in memory, or read from an HDF5 store of them (docstring)",
    )
    parser.add_argument(
        "--new-images",
        action="store_true",
        help="QACE-Img: every call's images are new to the device's feature cache (module docstring)",
    )
    parser.add_argument(
        "--max-seconds", type=float, default=0, help="skip the remaining cells after this long (0: no limit)"
    )
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    engine_defaults(args)
    tiny = args.tiny
    args.batches = args.batches or ([4, 8] if tiny else [64, 256, 1024])
    args.iterations = args.iterations or ([2] * len(args.batches) if tiny else [20, 20, 10])
    if len(args.iterations) == 1:
        args.iterations = args.iterations * len(args.batches)
    if len(args.iterations) != len(args.batches):
        parser.error("give one --iterations value, or one per --batches value")
    args.warmup = args.warmup if args.warmup is not None else (1 if tiny else 5)
    if args.warmup_records is None:
        args.warmup_records = 8 if tiny else args.chunk_size
    if args.openrlhf_batches is None:
        args.openrlhf_batches = args.batches if tiny else [256]
    if args.rounds is None:
        args.rounds = min(2, min(args.iterations))
    if not 1 <= args.rounds <= min(args.iterations):
        parser.error(f"--rounds {args.rounds}: give 1 to {min(args.iterations)} (the fewest --iterations)")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    started = time.perf_counter()
    records = flickr_workload(Path(args.data_dir))
    models_dir = workload_models(args, records, "qace-latency-", Path(args.data_dir))
    report: dict[str, Any] = {
        **record("benchmarks.latency", argv, device=args.device, packages=("transformers",)),
        "device": args.device,
        "precision": args.precision,
        "tiny": args.tiny,
        "workload": (
            "tiny random T5s (a smoke run: the numbers mean nothing)"
            if args.tiny
            else "random T5-base QG/TQA and T5-small Visual-T5"
        )
        + ", random features, forced seeded outputs (questions 8-16, answers 2-4 tokens); each batch drawn "
        f"without replacement from the {len(records)} Flickr8k-Expert records (seed {args.seed})",
        "settings": {
            "host_workers": "not started (a call of one chunk never uses them)",
            "batch_rows": args.batch_rows,
            "batch_tokens": args.batch_tokens,
            "chunk_size": args.chunk_size,
            "spacy_workers": args.spacy_workers,
            "candidate_cache": args.candidate_cache,
            "features_preloaded": not (args.new_images and args.features_from == "h5"),
            "new_images_each_call": args.new_images,
            "features_from": args.features_from,
            "graph_warm_up_length": args.graph_warm_up_length,
            "warmup_per_cell_and_round": args.warmup,
            "rounds": args.rounds,
            "warmup_records_per_variant": args.warmup_records,
        },
        "target": TARGET,
        "models_seconds": time.perf_counter() - started,
        "variants": {},
        "cells": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        met = [
            c
            for c in report["cells"]
            if all(c.get(k) == TARGET[k] for k in ("variant", "path", "batch")) and "p50_ms" in c
        ]
        report["target_met"] = (met[0]["p50_ms"] < TARGET["p50_ms"]) if met else None
        out.write_text(json.dumps(report, indent=2))

    for variant in args.variants:  # rewritten after every cell, so a late failure loses nothing
        run_variant(variant, records, models_dir, args, report, write, started)
    report["seconds_total"] = time.perf_counter() - started
    write()
    print(json.dumps(report["cells"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
