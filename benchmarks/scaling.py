"""Scaling from 1 to 2 GPUs: the throughput workload through the real multi-GPU path.

    python -m benchmarks.scaling --out benchmarks/results/scaling.json [--variants img ref] [--repeat 2]
    python -m benchmarks.scaling --tiny --out /tmp/scaling-tiny.json     # CPU smoke run, devices cpu, cpu

Each run is one ``qace.scale.shards.score_file_sharded(input, output, devices=[...])`` call on the same
JSONL input: the 5,664 Flickr8k-Expert records, ``--repeat`` times (copies keep their order and get
new ids, so no copy shares a model batch with another), scored with ``devices=["cuda:0"]`` and then
``["cuda:0", "cuda:1"]``. Models, features, batch settings and the benchmark-only output control are those
of ``benchmarks/throughput.py``, bf16: every shard worker builds its scorer through `forced_scorer`
(``score_file_sharded(scorer_factory="benchmarks.scaling:forced_scorer")``), which also warms the
engine up on the first ``--warmup`` records (default one full chunk, so the decoders' CUDA graphs of
full-size batches are captured before the timing) and writes when scoring started and ended.

Reported per run: wall seconds of the whole call (planning the shards, spawning the workers, loading the
models, the warm-up, scoring and the merge) and steady-state seconds (from the moment every worker is
loaded and warm, when all start scoring together, to the last worker's end), captions/s for both,
then speedup and efficiency (speedup / devices) against the first run. The rows of every run are
compared with the first run's (bf16: shards batch other captions together, so a few answers may
differ). Each worker also records its peak memory on every visible GPU, which shows if a worker ever
touched another worker's GPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.latency import DEFAULT_DATA
from benchmarks.run_info import record
from benchmarks.workload import (
    add_engine_arguments,
    engine_defaults,
    flickr_workload,
    force_lengths,
    workload_models,
)
from qace.api import QACE
from qace.data.features import RandomFeatureStore
from qace.data.records import Record

log = logging.getLogger(__name__)

FACTORY = "benchmarks.scaling:forced_scorer"
TARGET_SPEEDUP = 1.8
"""The issue's goal for 2 GPUs over 1."""


def forced_scorer(
    *,
    device: str,
    warmup: Sequence[dict[str, Any]] = (),
    timings_dir: str | None = None,
    workers: int = 1,
    candidate_cache: bool = True,
    **kwargs: Any,
) -> QACE:
    """Shard-worker scorer factory: ``QACE(device=device, **kwargs)`` with the workload's forced output
    lengths, warmed up on ``warmup`` records; with ``timings_dir`` its ``score_records`` writes
    ``<pid>.json`` there when the stream ends (load, warm-up, start and end times, rows, GPU memory).

    With ``timings_dir``, scoring starts only once all ``workers`` of the run are loaded and warm (a
    barrier on ``ready-<pid>`` files), so the steady-state window times parallel scoring, not one
    worker waiting for another to finish loading."""
    started = time.time()
    scorer = QACE(device=device, **kwargs)
    force_lengths(scorer)
    if not candidate_cache:
        scorer.candidates.cache_size = 0
    loaded = time.time()
    if warmup:
        list(scorer.score_records([_record(r) for r in warmup]))
        _sync(device)
    warmed = time.time()
    if timings_dir is None:
        return scorer
    score_records = scorer.score_records

    def timed(records: Any) -> Iterator[Any]:
        ready = time.time()
        _wait_for_all(Path(timings_dir), workers)
        start, rows = time.time(), 0
        for row in score_records(records):
            rows += 1
            yield row
        _sync(device)
        info = {
            "device": device,
            "pid": os.getpid(),
            "load_seconds": loaded - started,
            "warmup_seconds": warmed - loaded,
            "ready": ready,
            "start": start,
            "end": time.time(),
            "rows": rows,
            "peak_bytes_by_gpu": _peak_bytes(),
        }
        Path(timings_dir, f"{os.getpid()}.json").write_text(json.dumps(info))

    scorer.score_records = timed  # type: ignore[method-assign]
    return scorer


def _wait_for_all(folder: Path, workers: int, timeout: float = 900.0) -> None:
    """Announce this worker ready and wait until ``workers`` workers are (a start barrier)."""
    (folder / f"ready-{os.getpid()}").touch()
    deadline = time.time() + timeout
    while len(list(folder.glob("ready-*"))) < workers:
        if time.time() > deadline:
            raise TimeoutError(f"only {len(list(folder.glob('ready-*')))} of {workers} workers got ready")
        time.sleep(0.01)


def _record(d: dict[str, Any]) -> Record:
    refs = d.get("references")
    return Record(d["id"], d["caption"], d.get("image_id"), tuple(refs) if refs is not None else None)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _peak_bytes() -> dict[str, int]:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {f"cuda:{i}": torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())}


def write_input(records: Sequence[Record], repeat: int, path: Path) -> int:
    """``repeat`` copies of ``records`` in order as JSONL (copy ``k > 0`` gets ids ``<id>~k``)."""
    with path.open("w", encoding="utf-8") as f:
        for k in range(repeat):
            for r in records:
                row = asdict(r)
                row["id"] = r.id if k == 0 else f"{r.id}~{k}"
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(records) * repeat


def _scores(path: Path) -> dict[str, float]:
    with path.open(encoding="utf-8") as f:
        return {row["id"]: row["qace"] for row in map(json.loads, f)}


def run(
    input_path: Path, work: Path, devices: list[str], scorer_kwargs: dict[str, Any], captions: int
) -> tuple[dict[str, Any], dict[str, float]]:
    """One ``score_file_sharded`` call on ``devices``: its timings and the scores it wrote."""
    from qace.scale.shards import score_file_sharded

    tag = f"{len(devices)}x{devices[0].replace(':', '')}"
    output, timings = work / f"scores-{tag}.jsonl", work / f"timings-{tag}"
    timings.mkdir()
    called = time.time()
    start = time.perf_counter()
    summary = score_file_sharded(
        input_path,
        output,
        devices=devices,
        scorer_kwargs={**scorer_kwargs, "timings_dir": str(timings), "workers": len(devices)},
        scorer_factory=FACTORY,
    )
    wall = time.perf_counter() - start
    if summary.scored != captions or summary.errors:
        raise RuntimeError(f"{summary.scored} scored and {summary.errors} errors for {captions} captions")
    workers = sorted((json.loads(p.read_text()) for p in timings.glob("*.json")), key=lambda w: w["start"])
    if len(workers) != len(devices) or sum(w["rows"] for w in workers) != captions:
        raise RuntimeError(f"worker timings are incomplete: {workers}")
    steady = max(w["end"] for w in workers) - min(w["start"] for w in workers)
    for w in workers:  # each worker's own rate; their sum ignores how far apart the workers started
        w["captions_per_s"] = w["rows"] / (w["end"] - w["start"])
        w["ready_after_seconds"] = w.pop("ready") - called
        w["started_after_seconds"] = w.pop("start") - called
        w["ended_after_seconds"] = w.pop("end") - called
    scores = _scores(output)
    result = {
        "devices": devices,
        "captions": captions,
        "wall_seconds": wall,
        "captions_per_s_wall": captions / wall,
        "steady_seconds": steady,
        "captions_per_s_steady": captions / steady,
        "captions_per_s_sum_of_workers": sum(w["captions_per_s"] for w in workers),
        "mean_qace": float(np.mean(list(scores.values()))),
        "workers": workers,
    }
    shutil.rmtree(timings)
    output.unlink()
    return result, scores


def compare(base: dict[str, float], other: dict[str, float]) -> dict[str, Any]:
    """How far ``other``'s scores are from ``base``'s, over the same ids."""
    if base.keys() != other.keys():
        raise RuntimeError("the runs scored different ids")
    diffs = np.array([abs(base[k] - other[k]) for k in base])
    return {
        "max_abs_qace_diff": float(diffs.max()),
        "mean_abs_qace_diff": float(diffs.mean()),
        "share_identical": float(np.mean(diffs == 0.0)),
    }


def run_variant(
    variant: str,
    input_path: Path,
    captions: int,
    warmup: list[dict[str, Any]],
    models_dir: Path,
    args: argparse.Namespace,
    work: Path,
) -> dict[str, Any]:
    bertscore = models_dir / "bertscore"
    scorer_kwargs = {
        "models": str(models_dir),
        "variant": variant,
        "features": RandomFeatureStore(seed=0),
        "precision": args.precision,
        "bertscore_model": str(bertscore) if bertscore.is_dir() else None,
        "max_batch_rows": args.batch_rows,
        "max_batch_tokens": args.batch_tokens,
        "chunk_size": args.chunk_size,
        "spacy_workers": args.spacy_workers,
        "candidate_cache": args.candidate_cache,
        "warmup": warmup,
    }
    result: dict[str, Any] = {"variant": variant, "captions": captions, "runs": []}
    base: dict[str, float] | None = None
    for count in args.counts:
        devices = [args.device if args.device == "cpu" else f"{args.device}:{i}" for i in range(count)]
        run_result, scores = run(input_path, work, devices, scorer_kwargs, captions)
        if base is None:
            base = scores
        else:
            first = result["runs"][0]
            for kind in ("wall", "steady"):
                speedup = run_result[f"captions_per_s_{kind}"] / first[f"captions_per_s_{kind}"]
                run_result[f"speedup_{kind}"] = speedup
                run_result[f"efficiency_{kind}"] = speedup * len(first["devices"]) / count
            run_result["vs_first_run"] = compare(base, scores)
        result["runs"].append(run_result)
        log.info(
            "%s on %d device(s): %.0f captions/s steady, %.0f wall",
            variant,
            count,
            run_result["captions_per_s_steady"],
            run_result["captions_per_s_wall"],
        )
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/scaling.json")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA))
    parser.add_argument("--variants", nargs="+", default=["img", "ref"], choices=["img", "ref"])
    parser.add_argument("--counts", nargs="+", type=int, default=[1, 2], help="devices per run (first: base)")
    parser.add_argument("--n", type=int, default=None, help="workload records (default: all 5,664)")
    parser.add_argument("--repeat", type=int, default=None, help="copies of the workload (default 2)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="warm-up records per worker (default: one chunk, 2048)"
    )
    add_engine_arguments(parser, device_help="cuda (cuda:i per worker) or cpu; spaCy workers are per worker")
    parser.add_argument(
        "--no-candidate-cache",
        dest="candidate_cache",
        action="store_false",
        help="parse every caption (by default each worker caches candidates, as in benchmarks.throughput)",
    )
    parser.add_argument("--work-dir", default=None, help="input and outputs (default: a temporary directory)")
    args = parser.parse_args(argv)
    engine_defaults(args)
    if args.device not in ("cuda", "cpu"):
        parser.error(f"--device must be cuda or cpu (workers get cuda:i), got {args.device!r}")
    tiny = args.tiny
    args.n = args.n if args.n is not None else (24 if tiny else None)
    args.repeat = args.repeat or (1 if tiny else 2)
    args.warmup = args.warmup if args.warmup is not None else (4 if tiny else args.chunk_size)
    if args.device == "cuda" and max(args.counts) > torch.cuda.device_count():
        parser.error(f"--counts {max(args.counts)} needs that many GPUs; {torch.cuda.device_count()} visible")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    started = time.perf_counter()
    records = flickr_workload(Path(args.data_dir))[: args.n]
    models_dir = workload_models(args, records, "qace-scaling-models-")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="qace-scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    input_path = work / "input.jsonl"
    captions = write_input(records, args.repeat, input_path)
    warmup = [asdict(r) for r in records[: args.warmup]]
    cuda = args.device == "cuda"
    report: dict[str, Any] = {
        **record("benchmarks.scaling", argv, device=args.device, packages=("transformers",)),
        "gpus_visible": torch.cuda.device_count() if cuda else 0,
        "precision": args.precision,
        "tiny": args.tiny,
        "workload": (
            "tiny random T5s (a smoke run: the numbers mean nothing)"
            if args.tiny
            else "random T5-base QG/TQA and T5-small Visual-T5"
        )
        + f", random features, forced seeded outputs; {len(records)} Flickr8k-Expert records x {args.repeat}",
        "path": "qace.scale.shards.score_file_sharded, scorer_factory=" + FACTORY,
        "settings": {
            "batch_rows": args.batch_rows,
            "batch_tokens": args.batch_tokens,
            "chunk_size": args.chunk_size,
            "spacy_workers_per_worker": args.spacy_workers,
            "candidate_cache": args.candidate_cache,
            "warmup_records_per_worker": args.warmup,
        },
        "target_speedup": TARGET_SPEEDUP,
        "models_seconds": time.perf_counter() - started,
        "results": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for variant in args.variants:  # the report is rewritten after each variant
        report["results"].append(run_variant(variant, input_path, captions, warmup, models_dir, args, work))
        speedups = [
            run["speedup_steady"]
            for result in report["results"]
            for run in result["runs"]
            if len(run["devices"]) == 2 and len(result["runs"][0]["devices"]) == 1
        ]
        report["target_met_steady"] = min(speedups) >= TARGET_SPEEDUP if speedups else None
        out.write_text(json.dumps(report, indent=2))
    report["seconds_total"] = time.perf_counter() - started
    out.write_text(json.dumps(report, indent=2))
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report["results"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
