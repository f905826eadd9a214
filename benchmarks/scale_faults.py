"""Faults on the Ray Data path, on a real local cluster: every input record must come out exactly once.

    python -m benchmarks.scale_faults --gpus 2          # benchmarks/results/scale_faults_<gpu>x2.json
    python -m benchmarks.scale_faults --tiny --out /tmp/scale-faults-tiny.json   # CPU smoke run

Setup: a one-node cluster (`benchmarks.local_ray`, ``--gpus`` GPUs) and `qace.scale.ray_data.score_to_parquet`
with one actor per GPU (``gpus_per_actor=1``; with ``--tiny`` two CPU actors, ``gpus_per_actor=0``), each
built by `fault_scorer`: the scaling benchmark's scorer (`benchmarks.scaling.forced_scorer`: the
throughput workload's random models and forced outputs, its engine core sized as there) that also writes
a progress file per actor process at every batch's start and end. Input: ``--n`` PASCAL-50S records cut
into ``--files`` JSONL files, scored in batches of ``--batch-size``. Three cases, each on a fresh output
directory:

- ``actor_killed``: once an actor has finished a batch and is inside another, ``kill -9`` of its
  process. Ray restarts the actor and runs the batches it held again (Ray Data's defaults for actor
  pools: ``max_restarts=-1, max_task_retries=-1``); the job goes on.
- ``driver_killed``: the job's driver (a subprocess calling ``score_to_parquet``) gets ``kill -9`` once
  the output directory holds rows (or, should Ray hold its writes back, once the actors have scored half
  the records); when the cluster is idle again (the dead job's actors and tasks gone),
  ``score_to_parquet(..., resume=True)`` runs: the records already written are skipped, unreadable files
  (writes cut short) removed and their records scored again.
- ``bad_records``: one input file also holds a line that is not JSON and a record whose caption is a
  number; each must become an error row naming its file and line, and the job goes on.

Reported per case: what was killed and when (seconds after submission, rows done by then, for an actor
its child processes and whether any outlived it, the actor processes seen), records in, rows out,
distinct records out (by input file and line), duplicates, missing, error rows, ``exactly_once``,
``fault_injected`` (the kill came mid-run; the bad lines became error rows naming their file and line) and
``passed`` (both); the record's ``all_passed`` is every case's, and the exit status is 1 without it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from benchmarks.latency import DEFAULT_DATA
from benchmarks.run_info import gpu_name, gpu_tag, record
from benchmarks.scaling import (
    PASCAL_DISTINCT,
    forced_scorer,
    per_worker_settings,
    scorer_settings,
    split_input,
)
from benchmarks.workload import (
    add_engine_arguments,
    engine_defaults,
    flickr_workload,
    pascal_workload,
    workload_models,
    write_jsonl,
)
from qace import scorers
from qace.api import QACE
from qace.scale.ray_data import concurrent_calls_for

log = logging.getLogger(__name__)

FACTORY = "benchmarks.scale_faults:fault_scorer"
ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.01
BAD_LINES = ('{"id": "bad-json", "caption": "a dog runs", \n', '{"id": "bad-caption", "caption": 42}\n')
"""The ``bad_records`` case's lines: not JSON (cut short), and a caption that is no string."""


def fault_scorer(*, progress_dir: str, **kwargs: Any) -> QACE:
    """`forced_scorer` (no timings) whose ``score_records`` and ``score_committed`` write
    ``<progress_dir>/<pid>.json`` (`_write`) when the actor is built and at the start and end of every
    batch: ``{"pid", "born", "started", "done", "rows"}`` (batches started and finished, rows scored)."""
    scorer = forced_scorer(**kwargs)
    state = {"pid": os.getpid(), "born": time.time(), "started": 0, "done": 0, "rows": 0}
    path = Path(progress_dir, f"{os.getpid()}.json")
    _write(path, state)
    lock = threading.Lock()  # an actor scores up to ``concurrent_calls`` batches at once

    def counted(score: Any) -> Any:
        def run(records: Any) -> Iterator[Any]:
            with lock:
                state["started"] += 1
                _write(path, state)
            rows = list(score(records))
            with lock:
                state["done"] += 1
                state["rows"] += len(rows)
                _write(path, state)
            yield from rows

        return run

    for name in ("score_records", "score_committed"):  # a Ray actor's batches: score_committed
        setattr(scorer, name, counted(getattr(scorer, name)))
    return scorer


def _write(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _states(folder: Path) -> list[dict[str, Any]]:
    """Every actor process's latest progress (`fault_scorer`)."""
    states = []
    for path in folder.glob("*.json"):
        try:
            states.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # replaced while read: the next poll sees it
            continue
    return states


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children, theirs, ...), from ``/proc``."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _rows_written(output: Path) -> int:
    """Rows in the readable Parquet files of ``output`` (a file still being written has no footer)."""
    import pyarrow.parquet as pq

    rows = 0
    for path in output.glob("*.parquet"):
        try:
            rows += pq.ParquetFile(path).metadata.num_rows
        except Exception:  # noqa: BLE001 (pyarrow raises several types for a torn file)
            continue
    return rows


def tally(output: Path, records_in: int) -> dict[str, Any]:
    """What ``output`` holds against ``records_in`` input records: rows, distinct records (by file and
    line), duplicates, missing, error rows, and whether every record came out exactly once."""
    from qace.scale.ray_data import read_scores

    rows = read_scores(output).to_pylist()
    keys = [(row["source"], row["line"]) for row in rows]
    distinct = len(set(keys))
    errors = [row for row in rows if row["error"] is not None]
    return {
        "records_in": records_in,
        "rows_out": len(rows),
        "distinct_records_out": distinct,
        "duplicates": len(rows) - distinct,
        "missing": records_in - distinct,
        "error_rows": len(errors),
        "errors": [
            {"source": Path(r["source"]).name, "line": r["line"], "error": r["error"]} for r in errors
        ],
        "exactly_once": len(rows) == distinct == records_in,
    }


def actor_killed(job: dict[str, Any], work: Path, records_in: int) -> dict[str, Any]:
    """The ``actor_killed`` case (module docstring): the job runs in a thread of this driver while this
    thread waits for an actor inside its second batch or later, and kills it."""
    from qace.scale.ray_data import score_to_parquet

    progress, output = work / "progress-actor", work / "out-actor"
    progress.mkdir()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome.update(score_to_parquet(output_dir=output, **_job(job, progress)))
        except Exception as exc:  # noqa: BLE001 (reported in the record)
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    started = time.time()
    thread = threading.Thread(target=run, name="fault-job")
    thread.start()
    killed: dict[str, Any] | None = None
    while thread.is_alive() and killed is None:
        states = _states(progress)
        victim = next((s for s in states if s["done"] >= 1 and s["started"] > s["done"]), None)
        if victim is not None and sum(s["rows"] for s in states) < records_in:
            children = _descendants(victim["pid"])
            os.kill(victim["pid"], signal.SIGKILL)
            killed = {
                "pid": victim["pid"],
                "after_seconds": time.time() - started,
                "in_batch": victim["started"],
                "batches_done_by_it": victim["done"],
                "rows_done_by_it": victim["rows"],
                "rows_done_by_all": sum(s["rows"] for s in states),
                "child_processes": len(children),
            }
        time.sleep(POLL_S)
    thread.join()
    states = _states(progress)
    if killed is not None:
        time.sleep(2.0)  # a child watching its parent ends within a fraction of a second
        killed["child_processes_outliving_it"] = sum(map(_running, children))
        reborn = [s for s in states if s["born"] > started + killed["after_seconds"]]
        killed["restarted_actor_ready_after_kill_seconds"] = (
            min(s["born"] for s in reborn) - started - killed["after_seconds"] if reborn else None
        )
    result = {"killed": killed, "job": outcome, "seconds": time.time() - started}
    result["actor_processes_seen"] = len(states)
    return _verdict({**result, **tally(output, records_in)}, killed is not None and "error" not in outcome)


def driver_killed(job: dict[str, Any], work: Path, records_in: int, address: str) -> dict[str, Any]:
    """The ``driver_killed`` case (module docstring): the driver is a subprocess of this one
    (``--driver``), killed mid-run; then this process resumes the job."""
    from benchmarks.local_ray import wait_idle
    from qace.scale.ray_data import score_to_parquet

    progress, output = work / "progress-driver", work / "out-driver"
    progress.mkdir()
    spec = work / "driver.pkl"
    spec.write_bytes(pickle.dumps({"address": address, "output_dir": output, **_job(job, progress)}))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    started = time.time()
    driver = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.scale_faults", "--driver", str(spec)], cwd=ROOT, env=env
    )
    killed: dict[str, Any] | None = None
    while driver.poll() is None:
        written = _rows_written(output) if output.is_dir() else 0
        done = sum(s["rows"] for s in _states(progress))
        if killed is None and written < records_in and (written > 0 or 2 * done >= records_in):
            driver.kill()
            killed = {
                "pid": driver.pid,
                "after_seconds": time.time() - started,
                "rows_written_then": written,
                "rows_done_by_actors_then": done,
            }
        time.sleep(POLL_S)
    driver.wait()
    result: dict[str, Any] = {"killed": killed, "driver_exit_code": driver.returncode}
    result["seconds_until_cluster_idle"] = wait_idle()
    files = sorted(output.glob("*.parquet")) if output.is_dir() else []
    result["files_before_resume"] = len(files)
    result["rows_readable_before_resume"] = _rows_written(output) if files else 0
    resume_start = time.time()
    resumed = score_to_parquet(output_dir=output, resume=True, **_job(job, progress))
    result["resume"] = {**resumed, "seconds": time.time() - resume_start}
    result["unreadable_files_removed"] = len([f for f in files if not f.exists()])
    result["seconds"] = time.time() - started
    return _verdict({**result, **tally(output, records_in)}, killed is not None)


def bad_records(job: dict[str, Any], work: Path, inputs: list[Path], records_in: int) -> dict[str, Any]:
    """The ``bad_records`` case (module docstring): `BAD_LINES` go into the first input file after its
    first line; records in counts them."""
    from qace.scale.ray_data import score_to_parquet

    folder = work / "input-bad"
    folder.mkdir()
    bad_inputs = []
    for i, path in enumerate(inputs):
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        if i == 0:
            lines[1:1] = BAD_LINES
        bad_inputs.append(folder / path.name)
        bad_inputs[-1].write_text("".join(lines), encoding="utf-8")
    progress, output = work / "progress-bad", work / "out-bad"
    progress.mkdir()
    started = time.time()
    summary = score_to_parquet(
        output_dir=output, **_job({**job, "inputs": [str(p) for p in bad_inputs]}, progress)
    )
    result = tally(output, records_in + len(BAD_LINES))
    expected = [{"source": bad_inputs[0].name, "line": 2 + k} for k in range(len(BAD_LINES))]
    found = sorted(({"source": e["source"], "line": e["line"]} for e in result["errors"]), key=str)
    inserted = {"file": bad_inputs[0].name, "lines": [e["line"] for e in expected]}
    result = {"inserted": inserted, "job": summary, "seconds": time.time() - started, **result}
    return _verdict(result, found == sorted(expected, key=str))


def _verdict(result: dict[str, Any], injected: bool) -> dict[str, Any]:
    """``result`` with ``fault_injected`` (the fault happened as planned: the kill came mid-run, the bad
    lines became error rows where they are) and ``passed`` (that, and every record exactly once)."""
    return {**result, "fault_injected": injected, "passed": injected and result["exactly_once"]}


def _job(job: dict[str, Any], progress: Path) -> dict[str, Any]:
    """``score_to_parquet``'s keyword arguments (but ``output``) for one case: ``job`` with this case's
    progress folder in the scorer's settings."""
    kwargs = dict(job)
    kwargs["scorer_kwargs"] = {**job["scorer_kwargs"], "progress_dir": str(progress)}
    return kwargs


def driver_main(spec: Path) -> int:
    """``--driver SPEC``: connect to the cluster at the pickled ``address`` and run the pickled
    ``score_to_parquet`` call (the ``driver_killed`` case's driver)."""
    import ray

    from qace.scale.ray_data import score_to_parquet

    kwargs = pickle.loads(spec.read_bytes())
    ray.init(address=kwargs.pop("address"))
    ray.data.DataContext.get_current().enable_progress_bars = False
    score_to_parquet(**kwargs)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="default: benchmarks/results/scale_faults_<gpu>x<N>.json")
    parser.add_argument("--data-dir", default=str(DEFAULT_DATA))
    parser.add_argument("--gpus", type=int, default=None, help="GPUs, one actor each (default: all visible)")
    parser.add_argument("--variant", default="ref", choices=["img", "ref"])
    parser.add_argument("--n", type=int, default=None, help="records per case (default 20,000; tiny 64)")
    parser.add_argument("--files", type=int, default=8, help="input files, one read task each")
    parser.add_argument("--batch-size", type=int, default=None, help="records per actor call (1,024; tiny 8)")
    parser.add_argument(
        "--cases", nargs="+", default=["actor_killed", "driver_killed", "bad_records"],
        choices=["actor_killed", "driver_killed", "bad_records"],
    )  # fmt: skip
    add_engine_arguments(parser, device_help="cuda (one actor a GPU) or cpu (--tiny: two CPU actors)")
    parser.add_argument(
        "--work-dir", default=None, help="inputs and outputs (default: a temporary directory)"
    )
    parser.add_argument("--driver", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.driver:
        return args
    given = {name: getattr(args, name) for name in ("host_workers", "spacy_workers")}
    engine_defaults(args)
    args.host_workers, args.spacy_workers = given["host_workers"], given["spacy_workers"]  # None: share
    if args.device not in ("cuda", "cpu"):
        parser.error(f"--device must be cuda or cpu, got {args.device!r}")
    cuda = args.device == "cuda"
    visible = torch.cuda.device_count() if cuda else 0
    args.gpus = args.gpus or (visible if cuda else 0)
    if cuda and not 0 < args.gpus <= visible:
        parser.error(f"--gpus {args.gpus}: {visible} GPU(s) visible")
    args.n = args.n or (64 if args.tiny else 20_000)
    args.batch_size = args.batch_size or (8 if args.tiny else 1024)
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    if args.driver:
        return driver_main(Path(args.driver))
    from benchmarks.local_ray import local_cluster

    started = time.perf_counter()
    cuda = args.device == "cuda"
    actors = args.gpus if cuda else 2
    data = Path(args.data_dir)
    records = pascal_workload(data, max(args.n, PASCAL_DISTINCT))
    models_dir = workload_models(
        args, [*records[:PASCAL_DISTINCT], *flickr_workload(data)], "qace-faults-models-", data
    )
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="qace-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    write_jsonl(records[: args.n], work / "input.jsonl")
    inputs = split_input(work / "input.jsonl", args.files, work / "input")
    per_worker = per_worker_settings(args, [f"cuda:{i}" for i in range(actors)] if cuda else ["cpu"] * actors)
    job = {
        "inputs": [str(p) for p in inputs],
        "scorer_kwargs": {
            **scorer_settings(models_dir, args.variant, args),
            "capture": False,  # graphs are captured when first met: a restarted actor is back sooner
            **per_worker,
        },
        "entry": replace(scorers.get(f"qace-{args.variant}"), factory=FACTORY),
        "actors": actors,
        "gpus_per_actor": 1.0 if cuda else 0.0,
        "cpus_per_actor": float(2 + sum(per_worker.values())) if cuda else 1.0,
        "batch_size": args.batch_size,
        "concurrent_calls": concurrent_calls_for(None, 1.0 if cuda else 0.0),  # qace score-ray's default
        "torch_threads": None if cuda else 1,
    }
    tag = f"{gpu_tag(gpu_name(args.device))}x{args.gpus if cuda else actors}"
    out = Path(args.out or f"benchmarks/results/scale_faults_{tag}.json")
    report: dict[str, Any] = {
        **record("benchmarks.scale_faults", argv, device=args.device, packages=("transformers", "ray")),
        "tiny": args.tiny,
        "workload": f"{args.n} PASCAL-50S records in {len(inputs)} JSONL files, QACE-{args.variant}",
        "settings": {
            "actors": actors,
            "gpus_per_actor": job["gpus_per_actor"],
            "cpus_per_actor": job["cpus_per_actor"],
            "batch_size": args.batch_size,
            "concurrent_calls": job["concurrent_calls"],
            "per_actor": per_worker,
            "restarts": "Ray Data's defaults for actor pools: max_restarts=-1, max_task_retries=-1",
        },
        "cases": {},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    with local_cluster(
        gpus=args.gpus if cuda else 0,
        cpus=cores + 4 if cuda else actors + 2,
        object_store_bytes=int((2 if cuda else 0.25) * 2**30),
    ) as cluster:
        report["cluster"] = cluster.settings()
        for case in args.cases:
            log.info("case %s", case)
            if case == "actor_killed":
                result = actor_killed(job, work, args.n)
            elif case == "driver_killed":
                result = driver_killed(job, work, args.n, cluster.address)
            else:
                result = bad_records(job, work, inputs, args.n)
            report["cases"][case] = result
            log.info("%s: %s", case, {k: v for k, v in result.items() if k != "errors"})
            out.write_text(json.dumps(report, indent=2) + "\n")
    report["all_passed"] = all(c["passed"] for c in report["cases"].values())
    report["seconds_total"] = time.perf_counter() - started
    out.write_text(json.dumps(report, indent=2) + "\n")
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    print(
        json.dumps(
            {case: {k: v for k, v in c.items() if k != "errors"} for case, c in report["cases"].items()},
            indent=1,
        )
    )
    print(f"wrote {out}")
    return 0 if report["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
