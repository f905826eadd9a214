"""Scaling from one GPU to several of one host: distinct captions through ``qace score --gpus``' code path
and through Ray Data on a real local cluster, each worker an engine core with its share of the host.

    python -m benchmarks.scaling --variants img --counts 1 2 --paths shards ray --n 200000
    python -m benchmarks.scaling --workload flickr --repeat 8 --variants img     # the repeats workload
    python -m benchmarks.scaling --tiny --paths shards ray --out /tmp/scaling-tiny.json   # CPU smoke run

Workload (``--workload``): ``distinct`` (default), ``--n`` PASCAL-50S records
(`benchmarks.workload.pascal_workload`: its 48,715 distinct human captions first, then the same captions
again with other images and references), every worker parsing every caption (no candidate cache unless
``--candidate-cache``); ``flickr``, the 5,664 Flickr8k-Expert records ``--repeat`` times (copies keep their
order and get new ids ``<id>~k``; candidates cached by default). The record says which, and how many
candidates are distinct. Models, features and the benchmark-only output control are
``benchmarks/throughput.py``'s (random T5-base QG/TQA, T5-small Visual-T5, bf16, random region
features, seeded forced outputs); every worker builds its scorer through `forced_scorer`.

Each worker is an engine core (`qace.engine.core`): ``host_workers`` host processes and ``spacy_workers``
spaCy processes, by default its share of the host's cores (`qace.scale.shards.shard_settings`, the rule of
``qace score --gpus``: `qace.config.auto_host_workers` and `auto_spacy_workers` of the worker count; 16
cores a GPU give 4 and 10), or ``--host-workers`` / ``--spacy-workers`` each. Before it reports ready a
worker loads the models, starts those processes, with ``--capture all`` captures every batch shape's CUDA
graphs (``QACE.warm_up``; by default, as ``qace score``, each shape when first met) and scores ``--warmup``
records (default one chunk); then it waits at a start barrier until every worker of the run is ready, so
all start scoring together. With ``--start scoring`` a worker is ready once loaded and its scoring starts
its processes, as ``qace score``'s workers do: the wall time of the path users run.

Paths (``--paths``), each on the same input for every device count of ``--counts``:

- ``shards``: ``qace.scale.shards.score_file_sharded(input, output, devices=["cuda:0", ...],
  scorer_factory="benchmarks.scaling:forced_scorer", cpu_pool="spacy_workers")``.
- ``ray``: `qace.scale.ray_data.score_to_parquet` on a one-node cluster this benchmark starts and stops
  (`benchmarks.local_ray`: ``ray start --head --num-gpus N --num-cpus C``), one actor per GPU
  (``gpus_per_actor=1``; 0 on the CPU) reserving as many CPUs as it runs processes (``cpus_per_actor``:
  2 + host + spaCy processes), built by the same factory (the QACE registry entry with ``factory``
  replaced). Its input is the same records cut into ``--ray-files`` JSONL files (one read task each),
  scored in batches of ``--ray-batch-size`` records per actor call, ``--ray-concurrent-calls`` calls at once
  per actor (`qace score-ray`'s defaults unless given). The record lists these settings with
  the cluster's CPUs, object store memory and Ray Data's context.

Reported per run: wall seconds of the whole call (shards: planning, spawning, start-up, scoring, the
merge; Ray: the job from submission to the last Parquet file, actors' start-up included) and steady-state
seconds (from the moment every worker is ready and all start scoring, to the last worker's last row),
captions/s for both, speedup and efficiency against the same path's first run, and the share of the host's
logical CPUs busy over the steady window (`HostCpu`; the record's settings give the threads per core). Per
worker: its settings;
its start-up relative to the call (``begun``: the call, or its process's start if later, as Ray may start
a worker process ahead; imports, load, host processes, warm-up, ready) and the run's ``concurrent``
(every worker begun before the first was ready: they start up side by side, not one after another); its
rows, rate and peak memory on every GPU it sees. Every run's scores are compared with the same path's
first run, and a Ray run's with the shards run on as many devices (bf16: other batches, so a few scores
may differ in the last digits); a run that gives a record no row, or two, or an error row fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.latency import DEFAULT_DATA
from benchmarks.run_info import gpu_name, gpu_tag, record
from benchmarks.workload import (
    PASCAL_DISTINCT,
    add_engine_arguments,
    distinct_captions,
    engine_defaults,
    flickr_workload,
    force_lengths,
    pascal_workload,
    workload_models,
)
from qace.api import QACE
from qace.data.features import RandomFeatureStore
from qace.data.records import Record
from qace.scale.ray_data import GPU_ACTOR_BATCH, concurrent_calls_for

log = logging.getLogger(__name__)

FACTORY = "benchmarks.scaling:forced_scorer"
TARGET_SPEEDUP = 1.8
"""The issue's goal for 2 GPUs over 1."""
CPU_POOL = "spacy_workers"
"""QACE's setting that sizes its CPU worker processes (`qace.scorers.ScorerEntry.cpu_pool`)."""


def forced_scorer(
    *,
    device: str,
    warmup: Sequence[dict[str, Any]] = (),
    timings_dir: str | None = None,
    workers: int = 1,
    candidate_cache: bool = True,
    capture: bool = True,
    start: str = "ready",
    **kwargs: Any,
) -> QACE:
    """Worker scorer factory (shards and Ray actors): ``QACE(device=device, **kwargs)`` with the workload's
    forced output lengths; with ``start="ready"`` also its host and spaCy processes started, every batch
    shape's CUDA graphs captured (``capture``; nothing to capture on the CPU) and warmed up on ``warmup``
    records. With ``start="scoring"`` it is ready once loaded, as ``qace score``'s workers are: scoring
    starts the host processes and scores in this process until they are ready (`QACE.start_host_processes`).

    With ``timings_dir`` it then writes ``ready-<pid>`` there, and its ``score_records`` and
    ``score_committed`` (a Ray actor's batches) wait, at the first call, until ``workers`` workers are
    ready (a start barrier: the steady-state window times parallel scoring, not one worker waiting for
    another to load). It writes ``<pid>.json`` when ready and again after every call (Ray calls it once a
    batch): start-up times, settings, the first call's start and the last one's end, rows and calls so
    far, peak GPU memory (`_workers` reads them)."""
    if start not in ("ready", "scoring"):
        raise ValueError(f"start must be 'ready' or 'scoring', got {start!r}")
    started = time.time()
    scorer = QACE(device=device, **kwargs)
    force_lengths(scorer)
    if not candidate_cache:
        scorer.candidates.cache_size = 0
    loaded = time.time()
    shapes = 0
    if start == "ready":
        scorer.start_host_processes(wait=True)  # the engine core's processes, before the timing (or none)
        scorer.candidates.start(wait=True)
    hosts = time.time()
    if start == "ready":
        shapes = scorer.warm_up() if capture else 0
        if warmup:
            list(scorer.score_records([_record(r) for r in warmup]))
    _sync(device)
    warmed = time.time()
    if timings_dir is None:
        return scorer
    folder = Path(timings_dir)
    info: dict[str, Any] = {
        "device": device,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
        "host_workers": scorer.config.host_workers,
        "spacy_workers": scorer.config.spacy_workers,
        "process_started": _process_start_time(),
        "factory_called": started,
        "loaded": loaded,
        "hosts_ready": hosts,
        "ready": warmed,
        "graph_shapes_captured": shapes,
        "start": None,
        "end": None,
        "rows": 0,
        "calls": 0,
    }
    _write_atomic(folder / f"{os.getpid()}.json", json.dumps(info))  # a Ray actor may get no batch
    (folder / f"ready-{os.getpid()}").touch()

    lock = threading.Lock()  # a Ray actor may score several calls at once (``concurrent_calls``)

    def timed(score: Any) -> Any:
        def run(records: Any) -> Iterator[Any]:
            with lock:
                if info["start"] is None:
                    _wait_for_all(folder, workers)
                    info["start"] = time.time()
            rows = 0
            for row in score(records):
                rows += 1
                yield row
            _sync(device)
            with lock:
                info.update(
                    end=max(info["end"] or 0.0, time.time()),
                    rows=info["rows"] + rows,
                    calls=info["calls"] + 1,
                    engine_core=scorer.host is not None and scorer.host.ready(),
                    peak_bytes_by_gpu=_peak_bytes(),
                )
                _write_atomic(folder / f"{os.getpid()}.json", json.dumps(info))

        return run

    for name in ("score_records", "score_committed"):  # shard workers use the first, Ray actors the second
        setattr(scorer, name, timed(getattr(scorer, name)))
    return scorer


def _wait_for_all(folder: Path, workers: int, timeout: float = 900.0) -> None:
    """Wait until ``workers`` workers have written their ``ready-<pid>`` file (a start barrier)."""
    deadline = time.time() + timeout
    while len(list(folder.glob("ready-*"))) < workers:
        if time.time() > deadline:
            raise TimeoutError(f"only {len(list(folder.glob('ready-*')))} of {workers} workers got ready")
        time.sleep(0.01)


def _process_start_time() -> float | None:
    """When this process started (epoch seconds, from ``/proc``; None off Linux)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class HostCpu:
    """The host's CPU time, sampled from ``/proc/stat`` every ``interval`` seconds on a thread while the
    block runs (Linux; elsewhere no samples): `busy` gives the share of all logical CPUs busy over a window
    of that time, widened to the samples around it."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.samples: list[tuple[float, int, int]] = []
        """(epoch seconds, busy jiffies, all jiffies) of every logical CPU together."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-cpu", daemon=True)

    def __enter__(self) -> HostCpu:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self) -> None:
        try:
            times = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        except (OSError, ValueError):
            return
        idle = times[3] + times[4]  # idle and iowait; guest time is inside user time already
        self.samples.append((time.time(), sum(times) - idle, sum(times)))

    def busy(self, start: float, end: float) -> float | None:
        """Share of the logical CPUs busy from the last sample at or before ``start`` to the first at or
        after ``end``; None without both."""
        before = [s for s in self.samples if s[0] <= start]
        after = [s for s in self.samples if s[0] >= end]
        if not before or not after or after[0][2] == before[-1][2]:
            return None
        return (after[0][1] - before[-1][1]) / (after[0][2] - before[-1][2])


def threads_per_core() -> int | None:
    """Logical CPUs per physical core (SMT), from CPU 0's siblings in sysfs; None off Linux."""
    try:
        siblings = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return None
    count = 0
    for part in siblings.split(","):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1
    return count


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


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
    names = [field.name for field in fields(Record)]
    with path.open("w", encoding="utf-8") as f:
        for k in range(repeat):
            for r in records:
                row = {name: getattr(r, name) for name in names}  # asdict's deep copies cost seconds
                row["id"] = r.id if k == 0 else f"{r.id}~{k}"
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(records) * repeat


def split_input(path: Path, files: int, folder: Path) -> list[Path]:
    """The lines of ``path`` cut into ``files`` contiguous JSONL files in ``folder`` (sizes differ by at
    most one line; none empty)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    files = max(1, min(files, len(lines)))
    size, extra = divmod(len(lines), files)
    folder.mkdir(parents=True, exist_ok=True)
    paths, at = [], 0
    for i in range(files):
        take = size + (1 if i < extra else 0)
        paths.append(folder / f"part-{i:03d}.jsonl")
        paths[-1].write_text("".join(lines[at : at + take]), encoding="utf-8")
        at += take
    return paths


def per_worker_settings(args: argparse.Namespace, devices: list[str]) -> dict[str, int]:
    """Each worker's ``host_workers`` and ``spacy_workers``: those given, else on GPUs its share of the
    host's cores by `shard_settings`' rule (on the CPU, QACE's own: none)."""
    from qace.scale.shards import shard_settings

    given = {
        name: getattr(args, name) for name in ("host_workers", CPU_POOL) if getattr(args, name) is not None
    }
    settings = shard_settings(given, devices, FACTORY, CPU_POOL)
    return {name: settings[name] for name in ("host_workers", CPU_POOL) if name in settings}


def _scores(path: Path) -> dict[str, float]:
    with path.open(encoding="utf-8") as f:
        return {row["id"]: row["qace"] for row in map(json.loads, f)}


def _workers(timings: Path, called: float, expected: int, captions: int) -> dict[str, Any]:
    """The run's worker records (`forced_scorer`), times made relative to ``called``, with the steady
    window (epoch seconds) and start-up summary; `RuntimeError` unless ``expected`` workers scored
    ``captions`` rows."""
    workers = sorted((json.loads(p.read_text()) for p in timings.glob("*.json")), key=lambda w: w["ready"])
    if len(workers) != expected or sum(w["rows"] for w in workers) != captions:
        raise RuntimeError(f"worker timings are incomplete: {workers}")
    busy = [w for w in workers if w["rows"]]
    window = (min(w["start"] for w in busy), max(w["end"] for w in busy))
    for w in workers:  # start-up begins with the call, or with the worker's process if that is later
        born = w.pop("process_started")
        w["begun"] = max(born, called) if born is not None else w["factory_called"]
    first_ready = min(w["ready"] for w in workers)
    concurrent = all(w["begun"] < first_ready for w in workers)
    for w in workers:  # each worker's own rate; their sum ignores how far apart the workers started
        w["captions_per_s"] = w["rows"] / (w["end"] - w["start"]) if w["rows"] else None
        begun = w.pop("begun")
        w["begun_after_seconds"] = begun - called
        w["imports_seconds"] = w["factory_called"] - begun
        w["load_seconds"] = w["loaded"] - w["factory_called"]
        w["host_processes_seconds"] = w["hosts_ready"] - w["loaded"]
        w["warmup_seconds"] = w["ready"] - w["hosts_ready"]
        for name in ("factory_called", "loaded", "hosts_ready"):
            del w[name]
        w["ready_after_seconds"] = w.pop("ready") - called
        start, end = w.pop("start"), w.pop("end")
        w["started_after_seconds"] = None if start is None else start - called
        w["ended_after_seconds"] = None if end is None else end - called
    ready = [w["ready_after_seconds"] for w in workers]
    return {
        "steady_seconds": window[1] - window[0],
        "window": window,
        "startup": {
            "concurrent": concurrent,
            "first_ready_after_seconds": min(ready),
            "last_ready_after_seconds": max(ready),
        },
        "workers": workers,
    }


def _rates(
    result: dict[str, Any],
    captions: int,
    wall: float,
    timing: dict[str, Any],
    cpu: HostCpu,
) -> dict[str, Any]:
    """A run's record: rates, start-up, workers and the host's busy CPU share over the steady window
    (`HostCpu.busy`)."""
    steady = timing["steady_seconds"]
    return {
        **result,
        "captions": captions,
        "wall_seconds": wall,
        "captions_per_s_wall": captions / wall,
        "steady_seconds": steady,
        "captions_per_s_steady": captions / steady,
        "captions_per_s_sum_of_workers": sum(w["captions_per_s"] or 0.0 for w in timing["workers"]),
        "host_cpu_busy_steady": cpu.busy(*timing["window"]),
        "startup": timing["startup"],
        "workers": timing["workers"],
    }


def run_shards(
    input_path: Path, work: Path, devices: list[str], scorer_kwargs: dict[str, Any], captions: int
) -> tuple[dict[str, Any], dict[str, float]]:
    """One ``score_file_sharded`` call on ``devices``: its timings and the scores it wrote."""
    from qace.scale.shards import score_file_sharded

    tag = f"{len(devices)}x{devices[0].replace(':', '')}"
    output, timings = work / f"scores-{tag}.jsonl", work / f"timings-{tag}"
    timings.mkdir()
    called = time.time()
    start = time.perf_counter()
    with HostCpu() as cpu:
        summary = score_file_sharded(
            input_path,
            output,
            devices=devices,
            scorer_kwargs={**scorer_kwargs, "timings_dir": str(timings), "workers": len(devices)},
            scorer_factory=FACTORY,
            cpu_pool=CPU_POOL,
        )
    wall = time.perf_counter() - start
    if summary.scored != captions or summary.errors:
        raise RuntimeError(f"{summary.scored} scored and {summary.errors} errors for {captions} captions")
    timing = _workers(timings, called, len(devices), captions)
    scores = _scores(output)
    if len(scores) != captions:
        raise RuntimeError(f"{len(scores)} distinct ids in {captions} rows")
    result = _rates({"path": "shards", "devices": devices}, captions, wall, timing, cpu)
    result["mean_qace"] = float(np.mean(list(scores.values())))
    shutil.rmtree(timings)
    output.unlink()
    return result, scores


def ray_actor_settings(args: argparse.Namespace, count: int, per_worker: dict[str, int]) -> dict[str, Any]:
    """How each Ray run places its actors: ``count`` actors, one GPU each (none on the CPU), as many
    CPUs as the actor runs processes on a GPU (itself and its engine core's threads, host and spaCy
    processes), one on the CPU; on the CPU the host's cores are split between the actors' torch threads."""
    cuda = args.device == "cuda"
    cores = len(os.sched_getaffinity(0))
    return {
        "actors": count,
        "gpus_per_actor": 1.0 if cuda else 0.0,
        "cpus_per_actor": float(2 + sum(per_worker.values())) if cuda else 1.0,
        "batch_size": args.ray_batch_size,
        "concurrent_calls": concurrent_calls_for(args.ray_concurrent_calls, 1.0 if cuda else 0.0),
        "torch_threads": None if cuda else max(1, cores // count),
    }


def run_ray(
    inputs: list[Path],
    work: Path,
    count: int,
    variant: str,
    scorer_kwargs: dict[str, Any],
    placement: dict[str, Any],
    captions: int,
) -> tuple[dict[str, Any], dict[str, float]]:
    """One `score_to_parquet` job on the connected cluster, ``count`` actors built by `forced_scorer`:
    its timings and the scores it wrote; `RuntimeError` unless every record gave exactly one row and
    none an error."""
    from qace import scorers
    from qace.scale.ray_data import read_scores, score_to_parquet

    output, timings = work / f"ray-{count}", work / f"ray-timings-{count}"
    timings.mkdir()
    entry = replace(scorers.get(f"qace-{variant}"), factory=FACTORY)
    called = time.time()
    start = time.perf_counter()
    with HostCpu() as cpu:
        score_to_parquet(
            [str(p) for p in inputs],
            output,
            scorer_kwargs={**scorer_kwargs, "timings_dir": str(timings), "workers": count},
            entry=entry,
            **placement,
        )
    wall = time.perf_counter() - start
    table = read_scores(output).to_pylist()
    errors = [row for row in table if row["error"] is not None]
    scores = {row["id"]: row["qace"] for row in table}
    if len(table) != captions or len(scores) != captions or errors:
        raise RuntimeError(
            f"Ray wrote {len(table)} rows, {len(scores)} distinct ids, {len(errors)} errors for {captions}"
        )
    timing = _workers(timings, called, count, captions)
    result = _rates({"path": "ray", **placement}, captions, wall, timing, cpu)
    result["mean_qace"] = float(np.mean(list(scores.values())))
    shutil.rmtree(timings)
    shutil.rmtree(output)
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


def _devices(args: argparse.Namespace, count: int) -> list[str]:
    return [args.device if args.device == "cpu" else f"{args.device}:{i}" for i in range(count)]


def scorer_settings(models_dir: Path, variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """The workers' scorer settings every scaling benchmark shares: the workload's models, random
    features, precision and batch settings (`forced_scorer` takes them)."""
    bertscore = models_dir / "bertscore"
    return {
        "models": str(models_dir),
        "variant": variant,
        "features": RandomFeatureStore(seed=0),
        "precision": args.precision,
        "bertscore_model": str(bertscore) if bertscore.is_dir() else None,
        "max_batch_rows": args.batch_rows,
        "max_batch_tokens": args.batch_tokens,
        "chunk_size": args.chunk_size,
    }


def run_variant(
    variant: str,
    input_path: Path,
    ray_inputs: list[Path],
    captions: int,
    warmup: list[dict[str, Any]],
    models_dir: Path,
    args: argparse.Namespace,
    work: Path,
    save: Callable[[dict[str, Any]], object],
) -> dict[str, Any]:
    """Every count of ``--counts`` on every path of ``--paths`` for ``variant``; speedups and score
    comparisons against each path's first run, and a Ray run's against the shards run of its count.
    ``save`` gets the variant's result after every run (a run cut short keeps the runs before it)."""
    scorer_kwargs = {
        **scorer_settings(models_dir, variant, args),
        "candidate_cache": args.candidate_cache,
        "capture": args.capture == "all",
        "warmup": warmup,
        "start": args.start,
    }
    result: dict[str, Any] = {"variant": variant, "captions": captions, "runs": []}
    first: dict[str, tuple[dict[str, Any], dict[str, float]]] = {}
    for count in args.counts:
        shards_scores: dict[str, float] | None = None
        for path in args.paths:
            devices = _devices(args, count)
            per_worker = per_worker_settings(args, devices)
            kwargs = {**scorer_kwargs, **per_worker}
            if path == "shards":
                run, scores = run_shards(input_path, work, devices, kwargs, captions)
                shards_scores = scores
            else:
                placement = ray_actor_settings(args, count, per_worker)
                run, scores = run_ray(ray_inputs, work, count, variant, kwargs, placement, captions)
                if shards_scores is not None:
                    run["vs_shards"] = compare(shards_scores, scores)
            run["settings_per_worker"] = per_worker
            if path in first:
                base, base_scores = first[path]
                for kind in ("wall", "steady"):
                    speedup = run[f"captions_per_s_{kind}"] / base[f"captions_per_s_{kind}"]
                    run[f"speedup_{kind}"] = speedup
                    run[f"efficiency_{kind}"] = speedup * base["device_count"] / count
                run["vs_first_run"] = compare(base_scores, scores)
            run["device_count"] = count
            first.setdefault(path, (run, scores))
            result["runs"].append(run)
            save(result)
            log.info(
                "%s %s on %d device(s): %.0f captions/s steady, %.0f wall",
                variant,
                path,
                count,
                run["captions_per_s_steady"],
                run["captions_per_s_wall"],
            )
    return result


def target_met(results: list[dict[str, Any]], path: str) -> bool | None:
    """Whether every 2-device run of ``path`` reached `TARGET_SPEEDUP` over its 1-device run (steady
    state); None without such a pair."""
    speedups = [
        run["speedup_steady"]
        for result in results
        for run in result["runs"]
        if run["path"] == path and run["device_count"] == 2 and "speedup_steady" in run
        and any(r["path"] == path and r["device_count"] == 1 for r in result["runs"])
    ]  # fmt: skip
    return min(speedups) >= TARGET_SPEEDUP if speedups else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="default: benchmarks/results/scaling_<gpu>x<N>.json")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA))
    parser.add_argument("--workload", default="distinct", choices=["distinct", "flickr"])
    parser.add_argument("--variants", nargs="+", default=["img", "ref"], choices=["img", "ref"])
    parser.add_argument("--counts", nargs="+", type=int, default=[1, 2], help="devices per run (first: base)")
    parser.add_argument("--paths", nargs="+", default=["shards"], choices=["shards", "ray"])
    parser.add_argument(
        "--n", type=int, default=None, help="records (distinct: default 200,000; flickr: all 5,664)"
    )
    parser.add_argument("--repeat", type=int, default=None, help="flickr: copies of the workload (default 2)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="warm-up records per worker (default: one chunk, 2048)"
    )
    add_engine_arguments(
        parser,
        device_help="cuda (cuda:i per worker) or cpu; --host-workers and --spacy-workers are per worker",
    )
    parser.add_argument(
        "--capture",
        choices=["all", "lazy"],
        default="lazy",
        help="each worker captures every batch shape's CUDA graphs before it is ready (all: about 30 s on "
        "an H200), or only those its warm-up and scoring meet, when first met (lazy, qace score's way)",
    )
    parser.add_argument(
        "--start",
        choices=["ready", "scoring"],
        default="ready",
        help="a worker starts its host and spaCy processes and scores a warm-up chunk before the start "
        "barrier, so the steady window times the engine core (ready); or, as qace score's workers, it "
        "starts scoring once loaded, in its own process until its host processes are ready (scoring)",
    )
    parser.add_argument(
        "--candidate-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="each worker caches parsed candidates (default: off for distinct, on for flickr)",
    )
    parser.add_argument(
        "--ray-batch-size", type=int, default=None, help="records per actor call (qace score-ray's: 8,192)"
    )
    parser.add_argument(
        "--ray-concurrent-calls", type=int, default=None,
        help="calls an actor scores at once (qace score-ray's default: 2 on a GPU, 1 on the CPU)",
    )  # fmt: skip
    parser.add_argument("--ray-files", type=int, default=None, help="Ray input files, one read task each (8)")
    parser.add_argument(
        "--ray-object-store-gb", type=float, default=None, help="the cluster's object store (default 2)"
    )
    parser.add_argument(
        "--ray-cpus", type=int, default=None, help="the cluster's logical CPUs (default: the cores + 4)"
    )
    parser.add_argument("--work-dir", default=None, help="input and outputs (default: a temporary directory)")
    args = parser.parse_args(argv)
    given = {name: getattr(args, name) for name in ("host_workers", CPU_POOL)}
    engine_defaults(args)
    args.host_workers, args.spacy_workers = given["host_workers"], given[CPU_POOL]  # None: per worker
    if args.device not in ("cuda", "cpu"):
        parser.error(f"--device must be cuda or cpu (workers get cuda:i), got {args.device!r}")
    tiny, distinct = args.tiny, args.workload == "distinct"
    if distinct and args.repeat is not None:
        parser.error("--repeat is for --workload flickr (distinct: --n records)")
    args.n = args.n if args.n is not None else (24 if tiny else 200_000 if distinct else None)
    args.repeat = 1 if distinct else args.repeat or (1 if tiny else 2)
    args.warmup = args.warmup if args.warmup is not None else (4 if tiny else args.chunk_size)
    args.candidate_cache = args.candidate_cache if args.candidate_cache is not None else not distinct
    args.ray_batch_size = args.ray_batch_size or (8 if tiny else GPU_ACTOR_BATCH)  # qace score-ray's default
    args.ray_files = args.ray_files or (2 if tiny else 8)
    args.ray_object_store_gb = args.ray_object_store_gb or (0.25 if tiny else 2.0)
    cores = len(os.sched_getaffinity(0))
    args.ray_cpus = args.ray_cpus or (max(args.counts) + 2 if args.device == "cpu" else cores + 4)
    if args.device == "cuda" and max(args.counts) > torch.cuda.device_count():
        parser.error(f"--counts {max(args.counts)} needs that many GPUs; {torch.cuda.device_count()} visible")
    return args


def workload_records(args: argparse.Namespace) -> tuple[list[Record], list[Record]]:
    """The workload's records (before ``--repeat``) and the corpus the models' tokenizer is built from
    (every PASCAL-50S and Flickr8k-Expert caption, as ``benchmarks.throughput``'s)."""
    data = Path(args.data_dir)
    flickr = flickr_workload(data)
    pascal = pascal_workload(data, max(args.n or 0, PASCAL_DISTINCT))
    records = pascal[: args.n] if args.workload == "distinct" else flickr[: args.n]
    return records, [*pascal[:PASCAL_DISTINCT], *flickr]


def _ray_settings(cluster: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The Ray settings every Ray run shares: the cluster's, read parallelism, Ray Data's context."""
    import ray

    from qace.scale.ray_data import READ_BATCH

    ctx = ray.data.DataContext.get_current()
    return {
        "cluster": cluster.settings(),
        "ray_version": ray.__version__,
        "read_parallelism": f"{args.ray_files} input files, one read task each",
        "batch_size_per_actor": args.ray_batch_size,
        "concurrency": "one actor per device (ActorPoolStrategy(size=devices), each run's "
        "concurrent_calls as max_concurrent_calls_per_actor and max_tasks_in_flight_per_actor, with "
        "enable_true_multi_threading); Ray Data's actor defaults (max_restarts=-1, max_task_retries=-1)",
        "blocks": "the read's blocks cut to batch_size_per_actor rows (call_sized_blocks: "
        "repartition(target_num_rows_per_block)), one call a task",
        "data_context": {
            "target_max_block_size": ctx.target_max_block_size,
            "resource_limits": str(ctx.execution_options.resource_limits),
            "read_table_rows": READ_BATCH,
        },
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    started = time.perf_counter()
    records, corpus = workload_records(args)
    models_dir = workload_models(args, corpus, "qace-scaling-models-", Path(args.data_dir))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="qace-scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    input_path = work / "input.jsonl"
    captions = write_input(records, args.repeat, input_path)
    ray_inputs = split_input(input_path, args.ray_files, work / "ray-input") if "ray" in args.paths else []
    warmup = [asdict(r) for r in records[: args.warmup]]
    cuda = args.device == "cuda"
    packages = ("transformers", "ray") if "ray" in args.paths else ("transformers",)
    meta = record("benchmarks.scaling", argv, device=args.device, packages=packages)
    tag = f"{gpu_tag(gpu_name(args.device))}x{max(args.counts)}"
    out = Path(args.out or f"benchmarks/results/scaling_{tag}.json")
    report: dict[str, Any] = {
        **meta,
        "gpus_visible": torch.cuda.device_count() if cuda else 0,
        "precision": args.precision,
        "tiny": args.tiny,
        "models": "tiny random T5s (a smoke run: the numbers mean nothing)"
        if args.tiny
        else "random T5-base QG/TQA and T5-small Visual-T5, random features, forced seeded outputs",
        "workload": {
            "name": "PASCAL-50S human captions, 5 other captions of the image as references"
            if args.workload == "distinct"
            else "Flickr8k-Expert candidates with their references, repeated",
            "kind": args.workload,
            "records": captions,
            "distinct_captions": distinct_captions(records),
            "repeat": args.repeat,
        },
        "paths": {
            "shards": "qace.scale.shards.score_file_sharded, scorer_factory=" + FACTORY,
            "ray": "qace.scale.ray_data.score_to_parquet, entry factory=" + FACTORY,
        },
        "settings": {
            "batch_rows": args.batch_rows,
            "batch_tokens": args.batch_tokens,
            "chunk_size": args.chunk_size,
            "host_workers_per_worker": args.host_workers if args.host_workers is not None else "share",
            "spacy_workers_per_worker": args.spacy_workers if args.spacy_workers is not None else "share",
            "candidate_cache": args.candidate_cache,
            "capture": args.capture,
            "start": args.start,
            "warmup_records_per_worker": args.warmup,
            "host_cores": len(os.sched_getaffinity(0)),
            "host_threads_per_core": threads_per_core(),
        },
        "target_speedup": TARGET_SPEEDUP,
        "models_seconds": time.perf_counter() - started,
        "results": [],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        if "ray" in args.paths:
            from benchmarks.local_ray import local_cluster

            cluster = stack.enter_context(
                local_cluster(
                    gpus=max(args.counts) if cuda else 0,
                    cpus=args.ray_cpus,
                    object_store_bytes=int(args.ray_object_store_gb * 2**30),
                )
            )
            report["ray"] = _ray_settings(cluster, args)
        for variant in args.variants:

            def save(result: dict[str, Any]) -> None:  # the report is rewritten after every run
                report["results"] = [r for r in report["results"] if r is not result] + [result]
                report["target_met_steady"] = {p: target_met(report["results"], p) for p in args.paths}
                out.write_text(json.dumps(report, indent=2) + "\n")

            run_variant(variant, input_path, ray_inputs, captions, warmup, models_dir, args, work, save)
    report["seconds_total"] = time.perf_counter() - started
    out.write_text(json.dumps(report, indent=2) + "\n")
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(report["results"], indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
