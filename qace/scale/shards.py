"""Score one file on several GPUs of one host: split into shards, one engine process per device, merge.

Layout under ``<output>.shards/``:

- ``plan.json``: the input it was made from, the record count and the shard boundaries;
- ``input-i.jsonl``: shard ``i``'s slice of the input, contiguous and in input order, as
  normalized records with their input ``line`` (reader errors travel as ``{"id", "error", "line"}``
  lines so they keep their place); a resumed run reads its input again and refuses it, naming the
  first record that differs, unless it equals these files;
- ``shard-i.jsonl``: shard ``i``'s crash-safe, resumable `ResultWriter` output.

Why contiguous slices: concatenating the shard outputs in shard order *is* input order, so the
merge streams files and needs no sort. Each worker is a fresh interpreter (`qace.engine.launch`:
CUDA cannot survive ``fork``, and the caller's main module is never run again) that builds its own
scorer on its device; all start at once, before the plan is written, so they load their models while
the parent reads and splits the input, and each reads its shard input only once the plan is complete
(a go message). Each dies with the parent, so a killed run leaves no worker writing; each shard output
is locked while it is written (`qace.data.output.ResultWriter`), so a rerun cannot write a shard an
old worker holds.
A killed run resumes per shard: each shard skips the ids its writer has committed. The merge writes
the final output through a `ResultWriter` as well (tmp + replace, errors file, Parquet if asked), so
a killed merge resumes too; the shard directory is removed only after the final output exists.

``scorer_factory`` (``"package.module:function"``, default `QACE`) builds each worker's scorer from
``device=`` and ``scorer_kwargs``: ``qace score --gpus`` names a registered metric's factory
(`qace.scorers`), benchmarks their own to set up the same scorer in every worker.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from qace.config import auto_host_workers, auto_spacy_workers
from qace.data.output import errors_path
from qace.data.records import References
from qace.errors import BackendUnavailableError, ConfigError, QACEError, ResumeError
from qace.progress import track
from qace.scorers import load_callable as load_factory
from qace.scoring import Summary

if TYPE_CHECKING:
    from qace.engine.launch import Child

log = logging.getLogger(__name__)

PLAN_VERSION = 1
MERGE_CHUNK = 4096


@dataclass(frozen=True)
class ShardJob:
    """What one worker process does (plain values only: it crosses a process boundary)."""

    index: int
    device: str
    input: str
    output: str
    scorer_kwargs: dict[str, Any]
    resume: bool
    threads: int | None = None
    scorer_factory: str | None = None
    """``"package.module:function"`` called as ``f(device=..., **scorer_kwargs)`` instead of `QACE`."""
    force: bool = False
    """Resume a shard output that has no input fingerprint (`qace.data.output.ResultWriter`)."""


def resolve_devices(gpus: str | int) -> list[str]:
    """``--gpus N`` or ``--gpus all`` -> ``["cuda:0", ...]``; refuses more GPUs than are visible."""
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if str(gpus) == "all":
        count = visible
    else:
        try:
            count = int(gpus)
        except ValueError:
            raise ConfigError(f"--gpus takes a number or 'all', got {gpus!r}") from None
    if count < 1:
        raise BackendUnavailableError("no CUDA GPU is visible; drop --gpus to score on one device")
    if count > visible:
        raise BackendUnavailableError(f"--gpus {count} asked for more GPUs than the {visible} visible ones")
    return [f"cuda:{i}" for i in range(count)]


def score_file_sharded(
    input_path: str | Path,
    output_path: str | Path,
    *,
    devices: list[str],
    scorer_kwargs: dict[str, Any] | None = None,
    references: References | None = None,
    fmt: str = "auto",
    resume: bool = False,
    keep_shards: bool = False,
    scorer_factory: str | None = None,
    score_key: str = "qace",
    force: bool = False,
    cpu_pool: str | None = None,
) -> Summary:
    """Score ``input_path`` into ``output_path`` with one worker per entry of ``devices``.

    ``scorer_kwargs`` are the scorer's keyword arguments (`QACE`'s: ``models=``, ``variant=``, ...; not
    ``device``). The output equals what one `score_file` run of the scorer writes, byte for byte for JSONL.
    ``scorer_factory`` names a callable (``"package.module:function"``, or a class such as
    ``"qace.judges.visce2:VisCE2"``) that each worker calls as ``f(device=..., **scorer_kwargs)``
    instead of `QACE`; it must return a `qace.scorers.Scorer` and be importable in a fresh
    process. ``score_key`` is that scorer's main score column (for the summary's mean). ``force`` is
    `FileScorer.score_file`'s: resume outputs that cannot be checked. ``cpu_pool`` names the factory's
    setting that sizes its CPU worker processes (`qace.scorers.ScorerEntry.cpu_pool`; `QACE`'s
    ``spacy_workers`` without a factory): on GPUs, each shard gets its share of the host's cores.
    """
    if not devices:
        raise ConfigError("devices must name at least one torch device")
    if scorer_factory is not None:
        load_factory(scorer_factory)  # fail here, before any work, on a wrong name
    from qace.data.records import check_readable

    check_readable(input_path, references=references, fmt=fmt)  # before the shard folder exists
    kwargs = shard_settings(scorer_kwargs or {}, devices, scorer_factory, cpu_pool)
    output = Path(output_path)
    work = output.with_name(output.name + ".shards")
    start = time.perf_counter()
    partial = output.with_name(output.name + ".partial")
    if not resume and (output.exists() or work.exists() or partial.exists()):
        raise ResumeError(f"{output} (or its .shards/.partial) already exists; pass resume=True or remove it")
    threads = torch_threads(devices)
    jobs = [
        ShardJob(
            i,
            device,
            str(work / f"input-{i}.jsonl"),
            str(work / f"shard-{i}.jsonl"),
            kwargs,
            resume,
            threads,
            scorer_factory,
            force,
        )
        for i, device in enumerate(devices)
    ]
    complete = output.exists()
    children: dict[int, Child] = {} if complete else _start_workers(jobs)  # they load meanwhile
    try:
        bounds = _plan(Path(input_path), work, len(devices), references=references, fmt=fmt)
    except BaseException:
        _stop_workers(children)
        raise
    with track("scoring", total=bounds[-1][1] if bounds else 0, enabled=not complete) as bar:
        outcomes = _run_workers(jobs, bar.update, children) if not complete else {}
    failed = {i: out for i, out in outcomes.items() if "error" in out}
    for i, out in sorted(failed.items()):
        log.error("shard %d on %s failed:\n%s", i, jobs[i].device, out.get("traceback", out["error"]))
    if failed:
        detail = "; ".join(
            f"shard {i} on {jobs[i].device}: {out['error']}" for i, out in sorted(failed.items())
        )
        raise QACEError(
            f"{len(failed)} shard(s) failed ({detail}); fix it and rerun with resume=True (--resume)"
        )
    signatures = {out["signature"] for out in outcomes.values()}
    if len(signatures) > 1:
        raise QACEError(f"shards produced different signatures {sorted(signatures)}; the devices disagree")
    signature = signatures.pop() if signatures else None
    rows, errors, mean = _merge(
        work, output, len(bounds), signature, resume=resume, force=force, score_key=score_key
    )
    if not keep_shards:
        shutil.rmtree(work, ignore_errors=True)
    if not outcomes:  # the final output was already complete
        return Summary(0, 0, rows + errors, mean, time.perf_counter() - start, score_key)
    return Summary(
        _count(outcomes, "scored"),
        _count(outcomes, "errors"),
        _count(outcomes, "skipped"),
        mean,
        time.perf_counter() - start,
        score_key,
    )


def _plan(
    input_path: Path, work: Path, shards: int, *, references: References | None, fmt: str
) -> list[tuple[int, int]]:
    """Write (or, on resume, check and reuse) the shard inputs; returns each shard's [start, end)."""
    from qace.data.records import read_records

    plan_path = work / "plan.json"
    stat = input_path.stat() if input_path.is_file() else None
    source = {
        "input": str(input_path.resolve()),
        "size": stat.st_size if stat else None,
        "references": _references_key(references),
        "format": fmt,
    }
    if plan_path.exists():
        plan = json.loads(plan_path.read_text("utf-8"))
        planned = {key: value for key, value in (plan.get("source") or {}).items() if key != "size"}
        if plan.get("version") != PLAN_VERSION or planned != {k: v for k, v in source.items() if k != "size"}:
            raise ResumeError(f"{work} was planned for another input ({plan.get('source')}); remove it")
        if len(plan["bounds"]) != shards:
            raise ResumeError(
                f"{work} has {len(plan['bounds'])} shards, not {shards}; resume with that many devices"
            )
        _check_same_input(read_records(input_path, references=references, fmt=fmt), work, shards)
        return [tuple(b) for b in plan["bounds"]]  # type: ignore[misc]
    if work.exists():
        shutil.rmtree(work)  # killed before the plan was written: nothing was scored
    work.mkdir(parents=True)
    total = sum(1 for _ in read_records(input_path, references=references, fmt=fmt))
    size, extra = divmod(total, shards)
    bounds, at = [], 0
    for i in range(shards):
        bounds.append((at, at + size + (1 if i < extra else 0)))
        at = bounds[-1][1]
    records = iter(read_records(input_path, references=references, fmt=fmt))
    for i, (lo, hi) in enumerate(bounds):
        lines = [_shard_line(next(records)) for _ in range(hi - lo)]
        _write_atomic(work / f"input-{i}.jsonl", "".join(lines))
    _write_atomic(
        plan_path,
        json.dumps({"version": PLAN_VERSION, "source": source, "records": total, "bounds": bounds}, indent=1),
    )
    log.info("split %d records into %d shards under %s", total, shards, work)
    return bounds


def _shard_line(item: Any) -> str:
    """One record of a shard input (a `Record` or `RecordError`) as a JSON line."""
    from qace.data.records import RecordError

    if isinstance(item, RecordError):
        obj = {"id": item.id, "error": item.reason, "line": item.line}
    else:
        obj = asdict(item)
    return json.dumps(obj, ensure_ascii=False) + "\n"


def _shard_item(line: str) -> Any:
    """The `Record` or `RecordError` of a shard input line (`_shard_line`)."""
    from qace.data.records import Record, RecordError

    obj = json.loads(line)
    if "error" in obj:
        return RecordError(obj["id"], obj["error"], obj.get("line"))
    refs = obj.get("references")
    return Record(
        obj["id"],
        obj["caption"],
        obj.get("image_id"),
        tuple(refs) if refs is not None else None,
        obj.get("image"),
        obj.get("line"),
    )


def _check_same_input(records: Any, work: Path, shards: int) -> None:
    """Refuse to resume when the input no longer holds the records the shard inputs were cut from,
    naming the first that differs."""
    planned = (line for i in range(shards) for line in _lines(work / f"input-{i}.jsonl"))
    advice = f"--resume continues {work} only with the same input; restore it or remove {work}"
    for count, item in enumerate(records, start=1):
        then = next(planned, None)
        if then is None:
            raise ResumeError(
                f"the input has more records than when {work} was planned (line {item.line} is new); {advice}"
            )
        if _shard_line(item) != then:
            old = json.loads(then)
            raise ResumeError(
                f"input record {count} (line {item.line}, id {item.id!r}) differs from when {work} was "
                f"planned (then line {old.get('line')}, id {old.get('id')!r}); {advice}"
            )
    if next(planned, None) is not None:
        raise ResumeError(f"the input has fewer records than when {work} was planned; {advice}")


def _start_workers(jobs: list[ShardJob]) -> dict[int, Child]:
    """One child process per job (`qace.engine.launch`: started all at once, each reading its job as
    soon as it runs, whatever the caller's main module), by job index. Each builds its scorer, then waits
    for `GO` before it opens its shard input or output."""
    from qace.engine.launch import start_child

    return {job.index: start_child(WORKER, job, name=f"qace-shard-{job.index}") for job in jobs}


def _stop_workers(children: dict[int, Child]) -> None:
    """Kill workers that were never sent `GO` (the plan failed): they have written nothing."""
    for child in children.values():
        child.kill()
        child.join()


def _run_workers(
    jobs: list[ShardJob],
    progress: Callable[[int], object] | None = None,
    children: dict[int, Child] | None = None,
) -> dict[int, dict[str, Any]]:
    """Send `GO` to the workers of ``jobs`` (``children`` from `_start_workers`, or started here) and wait
    for all, so one failure never discards the others' work.

    ``progress`` is called with the number of records the workers got through since its last call."""
    from multiprocessing.connection import Connection, wait

    if children is None:
        children = _start_workers(jobs)
    for child in children.values():
        try:
            child.control.send(GO)
        except OSError:  # it died at start: seen below as its ended connection and exit code
            pass
    outcomes: dict[int, dict[str, Any]] = {}
    talking: dict[Connection, int] = {child.control: index for index, child in children.items()}
    try:
        while talking:
            for ready in wait(list(talking)):
                conn = cast(Connection, ready)
                index = talking[conn]
                try:
                    message: int | dict[str, Any] = conn.recv()
                except (EOFError, OSError):  # it ended: after its outcome, or without a word
                    del talking[conn]
                    if index not in outcomes:
                        children[index].join(timeout=30)
                        outcomes[index] = {"error": f"worker exited with code {children[index].exitcode}"}
                    continue
                if isinstance(message, int):  # a worker's progress report
                    if progress is not None:
                        progress(message)
                else:
                    outcomes[index] = message
    finally:
        for child in children.values():
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
                child.join()
    return outcomes


def shard_settings(
    scorer_kwargs: dict[str, Any],
    devices: list[str],
    scorer_factory: str | None = None,
    cpu_pool: str | None = None,
) -> dict[str, Any]:
    """Every shard's scorer settings: no progress bars, and on GPUs the scorers' CPU worker pools (the
    ``cpu_pool`` setting; `QACE`'s spaCy pool without a factory) share the host's cores (on its own, each
    GPU engine would take them all: `qace.config.speed_defaults`), and so do QACE's host processes."""
    if "device" in scorer_kwargs:
        raise ConfigError("pass devices=[...] instead of a device in scorer_kwargs")
    kwargs = {"progress": False, **scorer_kwargs}
    pool = "spacy_workers" if scorer_factory is None else cpu_pool
    if pool is not None and any(d.startswith("cuda") for d in devices):
        hosts = 0
        if pool == "spacy_workers":  # QACE: its host processes share the cores too
            hosts = kwargs.setdefault("host_workers", auto_host_workers(len(devices)))
        kwargs.setdefault(pool, auto_spacy_workers(len(devices), hosts=hosts))
    return kwargs


PROGRESS_EVERY_S = 1.0
"""How often a shard worker reports its progress to the parent."""


WORKER = "qace.scale.shards:_worker"
"""The shard worker's target, for `qace.engine.launch.start_child`."""
GO = "go"
"""What the parent sends each worker once the plan and the shard inputs are written."""


def _worker(job: ShardJob, control: Any) -> None:
    """A shard process's work (`qace.engine.launch` child: it dies with its parent): send progress
    (record counts, at most every `PROGRESS_EVERY_S`), then a summary dict or an error; never raise."""
    unreported, last = 0, time.monotonic()

    def progress(n: int) -> None:
        nonlocal unreported, last
        unreported += n
        if time.monotonic() - last >= PROGRESS_EVERY_S:
            control.send(unreported)
            unreported, last = 0, time.monotonic()

    def wait_for_go() -> None:
        if control.recv() != GO:
            raise QACEError("the parent sent no go")

    try:
        outcome = run_shard(job, progress, ready=wait_for_go)
    except BaseException as exc:  # noqa: BLE001  (reported to the parent, which raises)
        outcome = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    if unreported:
        control.send(unreported)
    control.send(outcome)


def _references_key(references: References | None) -> str | None:
    """How the plan names the references: the file, or a digest of contents read beforehand."""
    if references is None or isinstance(references, str | Path):
        return str(references) if references else None
    digest = hashlib.sha256(json.dumps(references, sort_keys=True).encode()).hexdigest()[:16]
    return f"read:sha256-{digest}"


def run_shard(
    job: ShardJob,
    progress: Callable[[int], object] | None = None,
    ready: Callable[[], object] | None = None,
) -> dict[str, Any]:
    """Score one shard input into its resumable output; returns counts and the signature. ``progress`` is
    called with 1 for each record scored, failed or skipped (already done); ``ready`` once the scorer is
    built, before the shard's input and output are opened (a worker waits there for the plan)."""
    progress = progress or (lambda n: None)
    import torch

    from qace.api import QACE
    from qace.data.output import ResultWriter
    from qace.scoring import write_results

    if job.threads:
        torch.set_num_threads(job.threads)
    if job.device.startswith("cuda"):
        torch.cuda.set_device(job.device)  # streams, graphs and libraries default to the current device
    build: Callable[..., Any] = load_factory(job.scorer_factory) if job.scorer_factory else QACE
    scorer = build(device=job.device, **job.scorer_kwargs)
    with _closing_candidates(scorer):
        if ready is not None:
            ready()
        with (
            ResultWriter(
                job.output,
                signature=scorer.signature,
                resume=job.resume,
                chunk_size=scorer.chunk_size,
                input_log=True,
                force=job.force,
            ) as writer,
            open(job.input, encoding="utf-8") as f,
        ):
            # score_records: benchmarks time a shard by wrapping it (`benchmarks.scaling.forced_scorer`)
            items = (_shard_item(line) for line in f)
            scored, errors, skipped, _ = write_results(
                scorer, items, writer, committed=False, advance=progress
            )
    log.info(
        "shard %d on %s: %d scored, %d errors, %d skipped", job.index, job.device, scored, errors, skipped
    )
    return {"signature": scorer.signature, "scored": scored, "errors": errors, "skipped": skipped}


@contextmanager
def _closing_candidates(scorer: Any) -> Iterator[None]:
    """Shut the scorer's spaCy worker pool down at the end: a spawned process exits by joining its
    non-daemon children, so an open pool (``spacy_workers > 0``) would hang the shard worker."""
    try:
        yield
    finally:
        close = getattr(getattr(scorer, "candidates", None), "close", None)
        if callable(close):
            close()


def _merge(
    work: Path, output: Path, shards: int, signature: str | None, *, resume: bool, force: bool, score_key: str
) -> tuple[int, int, float | None]:
    """Concatenate the shard outputs in shard order into the final output; returns rows, errors, mean."""
    from qace.data.output import ResultWriter

    if signature is None:  # final output already complete: nothing was run
        signature = _first_signature(output)
    total, scored, errors = 0.0, 0, 0
    with ResultWriter(
        output, signature=signature or "", resume=resume, chunk_size=MERGE_CHUNK, force=force
    ) as writer:
        done, done_lines = writer.done_ids(), writer.done_lines()
        if output.exists():
            return _final_counts(output, score_key)
        for i in range(shards):
            shard = work / f"shard-{i}.jsonl"
            for line in _lines(shard):
                row = json.loads(line)
                scored += 1
                total += row[score_key]
                if row["id"] not in done:
                    writer.add(row)
            for line in _lines(errors_path(shard)):
                error = json.loads(line)
                errors += 1
                at = error.get("line")
                if (at not in done_lines) if at is not None else (error["id"] not in done):
                    writer.add_error(error["id"], error["reason"], line=at)
    return scored, errors, total / scored if scored else None


def _final_counts(output: Path, score_key: str) -> tuple[int, int, float | None]:
    import pyarrow.parquet as pq

    errors = sum(1 for _ in _lines(errors_path(output)))
    if output.suffix.lower() == ".parquet":
        values = pq.read_table(output, columns=[score_key]).column(score_key).to_pylist()
    else:
        values = [json.loads(line)[score_key] for line in _lines(output)]
    return len(values), errors, sum(values) / len(values) if values else None


def _first_signature(output: Path) -> str | None:
    """The signature a finished output records (Parquet metadata, else its first row)."""
    if output.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        value = (pq.read_schema(output).metadata or {}).get(b"qace.signature")
        return value.decode("utf-8") if value is not None else None
    for line in _lines(output):
        return json.loads(line).get("signature")
    return None


def _lines(path: Path) -> Any:
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield line


def _count(outcomes: dict[int, dict[str, Any]], key: str) -> int:
    return sum(int(out.get(key, 0)) for out in outcomes.values())


def torch_threads(devices: list[str]) -> int | None:
    """Torch threads per worker: the host's cores split between the workers, so they do not oversubscribe
    it (a CPU worker scores on them; a GPU worker's work on the host, its model loading first, runs on
    them while its host and spaCy processes start); None (torch's default, every core) for one GPU
    worker. A Ray actor gets the same from Ray (``OMP_NUM_THREADS``: its CPUs)."""
    if len(devices) == 1 and devices[0] != "cpu":
        return None
    return max(1, (os.cpu_count() or 1) // len(devices))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
