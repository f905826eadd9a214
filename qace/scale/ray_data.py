"""Score a data set on many machines with Ray Data: ``map_batches`` over a GPU actor pool, Parquet out.

Why Ray Data and not our own cluster code: it already streams blocks from shared storage, keeps
one model-holding actor per GPU busy (``ActorPoolStrategy``), retries lost tasks and writes
Parquet in parallel. What it adds here is small: `BatchScorer` (a callable class, so each actor
loads the models once, of any registered metric: `qace.scorers`) and a fixed output schema per metric,
so every Parquet file of a run, and of its resumed runs, reads back as one table.

Input files are read by `qace.data.records.read_records` inside Ray tasks, one task per file, so
every format of ``qace score`` (JSONL, CSV, COCO, Parquet) is read with the same checks: a malformed
record becomes an output row with ``error`` set and its ``source`` file and ``line``, never a failed
job or a lost row. Every input record gets exactly one output row. The records are then cut into blocks
of one actor call (`call_sized_blocks`), so one large file still reaches every actor.

Resume by input position (our own manifest: the output directory itself): each run writes new
Parquet files next to the old ones; a resumed run reads the ``source`` and ``line`` columns of every
readable file, deletes unreadable ones (a write killed mid-file has no footer) and scores only the
other records.

Entry points: `score_dataset` (a lazy ``Dataset`` in, a lazy ``Dataset`` out) and
`score_to_parquet` (paths in, Parquet directory out, resumable). Needs the ``ray`` extra.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qace import scorers
from qace.data.records import Record, RecordError
from qace.errors import BackendUnavailableError, ConfigError, InputError

if TYPE_CHECKING:
    from qace.scorers import ScorerEntry

log = logging.getLogger(__name__)

SCORE_FIELDS = scorers.get("qace-ref").columns
"""QACE's score columns, the output columns of a run without another metric."""


def output_schema(columns: Sequence[str] = SCORE_FIELDS) -> Any:
    """The Arrow schema of every output file of a metric with score ``columns`` (`ScorerEntry.columns`):
    scores are null (and ``error`` set) for rejected records; ``n_questions`` and ``n_references`` are
    QACE's (null for other metrics)."""
    import pyarrow as pa

    return pa.schema(
        [("id", pa.string()), ("source", pa.string()), ("line", pa.int64()), ("image_id", pa.string())]
        + [(name, pa.float64()) for name in columns]
        + [
            ("n_questions", pa.int64()),
            ("n_references", pa.int64()),
            ("flags", pa.list_(pa.string())),
            ("error", pa.string()),
            ("signature", pa.string()),
            ("explanation", pa.string()),  # JSON, only with explain=True
        ]
    )


GPU_ACTOR_BATCH = 8192
"""Records a GPU actor takes a call: four of the engine's 2,048-caption chunks, so a call keeps the
actor's host processes and GPU busy together (the setting `benchmarks/scaling.py` measures, docs/scale.md).
A call ends with its last chunk alone on the GPU, so much smaller calls leave the GPU idle more often."""
CPU_ACTOR_BATCH = 512
"""Records a CPU actor takes a call (a CPU scores a few captions a second to a few hundred)."""
GPU_ACTOR_CALLS = 2
"""Calls a GPU actor scores at once, each on its own thread (QACE's callers in several threads share its
device, `QACE.score_records`): the next call's parsing and first chunk start while the last one's final
chunk is alone on the GPU, as the service's concurrent batches do (`qace.serve.batcher`). CPU actors
take one call at a time."""


def default_batch_size(gpus_per_actor: float) -> int:
    """Records an actor call when none are given: `GPU_ACTOR_BATCH` with GPUs, else `CPU_ACTOR_BATCH`."""
    return GPU_ACTOR_BATCH if gpus_per_actor > 0 else CPU_ACTOR_BATCH


def concurrent_calls_for(concurrent_calls: int | None, gpus_per_actor: float) -> int:
    """Calls an actor scores at once: ``concurrent_calls``, or when None `GPU_ACTOR_CALLS` with GPUs and 1
    without; `ConfigError` below 1."""
    if concurrent_calls is None:
        return GPU_ACTOR_CALLS if gpus_per_actor > 0 else 1
    if concurrent_calls < 1:
        raise ConfigError(f"concurrent_calls (--concurrent-calls) must be at least 1, got {concurrent_calls}")
    return concurrent_calls


def actor_pool(actors: int | tuple[int, int], concurrent_calls: int) -> Any:
    """Ray Data's ``ActorPoolStrategy`` of ``actors`` (a size or ``(min, max)``) whose actors each run up
    to ``concurrent_calls`` calls at once on their own threads (``max_concurrent_calls_per_actor`` with
    ``enable_true_multi_threading``); `ConfigError` where this Ray has no such settings and more than one
    call is asked for."""
    import inspect

    from ray.data import ActorPoolStrategy

    sizes: dict[str, Any] = (
        {"min_size": actors[0], "max_size": actors[1]} if isinstance(actors, tuple) else {"size": actors}
    )
    if concurrent_calls == 1:
        return ActorPoolStrategy(**sizes)
    names = inspect.signature(ActorPoolStrategy).parameters
    if "max_concurrent_calls_per_actor" not in names or "enable_true_multi_threading" not in names:
        import ray

        raise ConfigError(
            f"Ray {ray.__version__} cannot run {concurrent_calls} calls at once in an actor (needs "
            "ActorPoolStrategy's max_concurrent_calls_per_actor, Ray 2.60): upgrade Ray, or pass "
            "concurrent_calls=1 (--concurrent-calls 1)"
        )
    return ActorPoolStrategy(
        **sizes,
        max_concurrent_calls_per_actor=concurrent_calls,
        max_tasks_in_flight_per_actor=concurrent_calls,
        enable_true_multi_threading=True,
    )


def call_sized_blocks(ds: Any, batch_size: int) -> Any:
    """``ds`` cut into blocks of at most ``batch_size`` rows (Ray Data's streaming ``repartition``), so that
    an actor task is one call and the pool can spread the calls over every actor. A read task's output is
    merged into blocks of up to ``DataContext.target_max_block_size`` bytes (128 MiB): uncut, one input file
    of a few hundred thousand captions is one block, one task, and one actor scores all of it. Where this
    Ray has no streaming repartition (before ``target_num_rows_per_block``), ``ds`` as it is, with a
    warning."""
    import inspect

    if "target_num_rows_per_block" not in inspect.signature(ds.repartition).parameters:
        log.warning("this Ray cannot cut blocks to %d rows: a task may hold a whole input file", batch_size)
        return ds
    return ds.repartition(target_num_rows_per_block=batch_size)


class BatchScorer:
    """Callable class for ``Dataset.map_batches``: one scorer per actor, built from a registry entry
    (`qace.scorers`; default QACE), and one Arrow table per batch.

    Input columns: ``id`` and ``caption``, plus what the metric reads: ``references`` (list of strings,
    or a JSON list string), ``image_id`` (QACE-Img) or ``image`` (a file path every node can read);
    optional ``error`` (a row the reader rejected: passed through as an error row), ``source`` and
    ``line`` (copied to the output). Under Ray each GPU actor sees only its GPU, so the default device
    is ``cuda`` when one is visible, else ``cpu``. A scorer with host processes (QACE's engine core)
    starts them when the actor is built; its CPU pool (QACE's spaCy processes) is 0 unless given.
    """

    def __init__(
        self,
        scorer_kwargs: dict[str, Any] | None = None,
        torch_threads: int | None = None,
        entry: ScorerEntry | None = None,
    ) -> None:
        import torch

        if torch_threads:
            torch.set_num_threads(torch_threads)
        entry = entry or scorers.get("qace-ref")
        kwargs = dict(scorer_kwargs or {})
        device = kwargs.pop("device", "cuda" if torch.cuda.is_available() else "cpu")
        kwargs.setdefault("progress", False)
        if entry.cpu_pool is not None:
            # work in the actor's own process: Ray reserves CPUs per actor (``cpus_per_actor``), and a GPU
            # engine's default pool would take the host's cores (`qace.config.speed_defaults`)
            kwargs.setdefault(entry.cpu_pool, 0)
        self.columns = entry.columns
        self.scorer = entry.build(device, **kwargs)
        self.signature = self.scorer.signature
        start = getattr(self.scorer, "start_host_processes", None)
        if start is not None:
            # an actor lives for the whole job, but each batch is too short to start a scorer's host
            # processes by itself (QACE: `qace.api.HOST_MIN_CHUNKS`): start them now, in the background
            start()

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        rows = batch.to_pylist() if hasattr(batch, "to_pylist") else _rows_of(batch)
        if rows and "id" not in rows[0]:
            raise InputError("the data set needs an 'id' column (unique per caption; resume relies on it)")
        # a batch is a piece of one long stream: whole chunks, as a file's (`score_committed`); the ramp of
        # `score_records` (small first chunks, to start a single long input early) would be paid again
        # on every batch, and rows would depend on where Ray cut the batches inside a chunk's ramp
        results = list(self.scorer.score_committed([_record(row) for row in rows]))
        schema = output_schema(self.columns)
        out: dict[str, list[Any]] = {name: [] for name in schema.names}
        for row, result in zip(rows, results, strict=True):
            scored = {"id": result.id, "error": result.reason} if isinstance(result, RecordError) else result
            out["id"].append(scored["id"])
            out["source"].append(row.get("source"))
            out["line"].append(row.get("line"))
            out["image_id"].append(None if row.get("image_id") is None else str(row["image_id"]))
            for name in (*self.columns, "n_questions", "n_references", "flags", "error"):
                out[name].append(scored.get(name))
            out["signature"].append(self.signature)
            explanation = scored.get("explanation")
            out["explanation"].append(
                None if explanation is None else json.dumps(explanation, ensure_ascii=False)
            )
        return pa.Table.from_pydict(out, schema=schema)


QACEBatchScorer = BatchScorer
"""The former name (a `BatchScorer` builds QACE unless given another entry)."""


def _record(row: dict[str, Any]) -> Record | RecordError:
    """A batch row as a record to score: the error the reader found, a caption that is no string or
    references that are not non-empty strings as errors naming the row, else the record."""
    if row.get("error") is not None:
        return RecordError(row["id"], row["error"])
    record_id, caption = str(row["id"]), row.get("caption")
    references = _references(row.get("references"))
    if not isinstance(caption, str):
        return RecordError(record_id, f"caption must be a string, got {type(caption).__name__}")
    if references is not None and not all(ref.strip() for ref in references):
        return RecordError(record_id, "references must be a list of non-empty strings")
    image_id, image = row.get("image_id"), row.get("image")
    refs = None if references is None else tuple(references)
    return Record(record_id, caption, None if image_id is None else str(image_id), refs, image)


def score_dataset(
    ds: Any,
    *,
    scorer_kwargs: dict[str, Any] | None = None,
    entry: ScorerEntry | None = None,
    actors: int | tuple[int, int] = 1,
    gpus_per_actor: float = 1.0,
    cpus_per_actor: float = 1.0,
    batch_size: int | None = None,
    torch_threads: int | None = None,
    concurrent_calls: int | None = None,
) -> Any:
    """Lazily score a Ray ``Dataset`` with the metric of ``entry`` (a `qace.scorers.ScorerEntry`; default
    QACE) built from ``scorer_kwargs``; ``actors`` is a fixed pool size or ``(min, max)`` for autoscaling;
    ``batch_size`` records an actor call (`default_batch_size` when None); ``concurrent_calls`` calls an
    actor scores at once, each on a thread (`concurrent_calls_for`, `actor_pool`).

    With ``gpus_per_actor=0`` the actors run on CPU (tests, CPU clusters). Each actor calls the entry's
    ``factory``: ``dataclasses.replace(entry, factory="module:function")`` builds the scorer another way
    (``benchmarks/scaling.py`` does). An actor that dies (``kill -9``, out of memory) is restarted and the
    batches it held run again, so every record still gives one row: Ray Data's defaults for actor pools
    (``max_restarts=-1, max_task_retries=-1`` in Ray 2.60; passing them to ``map_batches`` is deprecated),
    which ``benchmarks/scale_faults.py`` checks. A batch that raises fails the job.
    """
    pool = actor_pool(actors, concurrent_calls_for(concurrent_calls, gpus_per_actor))
    batch = default_batch_size(gpus_per_actor) if batch_size is None else batch_size
    return call_sized_blocks(ds, batch).map_batches(
        BatchScorer,
        fn_constructor_kwargs={
            "scorer_kwargs": scorer_kwargs or {},
            "torch_threads": torch_threads,
            "entry": entry,
        },
        batch_size=batch,
        batch_format="pyarrow",
        compute=pool,
        num_gpus=gpus_per_actor,
        num_cpus=cpus_per_actor,
    )


def score_to_parquet(
    inputs: str | list[str],
    output_dir: str | Path,
    *,
    scorer_kwargs: dict[str, Any] | None = None,
    entry: ScorerEntry | None = None,
    fmt: str = "auto",
    resume: bool = False,
    actors: int | tuple[int, int] = 1,
    gpus_per_actor: float = 1.0,
    cpus_per_actor: float = 1.0,
    batch_size: int | None = None,
    torch_threads: int | None = None,
    concurrent_calls: int | None = None,
) -> dict[str, Any]:
    """Read JSONL, CSV, COCO or Parquet ``inputs`` (files, or directories of ``.parquet`` files), score
    them with ``entry``'s metric (`score_dataset`), write Parquet files into ``output_dir``; ``fmt`` is
    `qace.data.records.read_records`'s.

    ``resume=True`` skips the records already in ``output_dir`` (see the module docstring); without
    it an existing non-empty ``output_dir`` is refused. Returns counts: ``scored`` (rows written by
    this run, errors included), ``skipped`` (records found done), ``seconds``.
    """
    try:
        import ray
    except ImportError as exc:
        raise BackendUnavailableError("Ray Data is not installed: pip install 'qace[ray]'") from exc
    start = time.perf_counter()
    concurrent_calls_for(concurrent_calls, gpus_per_actor)  # checked before the cluster is reached
    out = Path(output_dir)
    existing = sorted(out.glob("*.parquet")) if out.is_dir() else []
    if existing and not resume:
        raise ConfigError(
            f"{out} already holds Parquet files; pass resume=True (--resume) or pick another directory"
        )
    if not ray.is_initialized():
        ray.init()  # what Ray Data would do on first use (RAY_ADDRESS, else a local Ray)
    check_resources(ray.nodes(), actors, gpus_per_actor, cpus_per_actor)
    done = _done_keys(existing)
    ds = _read(ray, inputs, fmt)
    if done:
        ds = ds.map_batches(_drop_done, fn_kwargs={"done": sorted(done)}, batch_format="pyarrow")
    scored = score_dataset(
        ds,
        scorer_kwargs=scorer_kwargs,
        entry=entry,
        actors=actors,
        gpus_per_actor=gpus_per_actor,
        cpus_per_actor=cpus_per_actor,
        batch_size=batch_size,
        torch_threads=torch_threads,
        concurrent_calls=concurrent_calls,
    )
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.parquet"))
    scored.write_parquet(str(out))
    written = sum(_rows(path) for path in set(out.glob("*.parquet")) - before)
    log.info("wrote %d rows to %s (%d ids were already done)", written, out, len(done))
    return {"scored": written, "skipped": len(done), "seconds": time.perf_counter() - start}


def check_resources(
    nodes: Sequence[dict[str, Any]],
    actors: int | tuple[int, int],
    gpus_per_actor: float,
    cpus_per_actor: float,
) -> None:
    """`ConfigError` naming the flag to change when the cluster's live ``nodes`` (``ray.nodes()``) cannot
    place the pool's (smallest) number of actors: Ray would wait for them forever, saying only "No
    available node types can fulfill resource request". Counts the nodes alive now, not those an
    autoscaler could add."""
    need = actors if isinstance(actors, int) else actors[0]
    alive = [node.get("Resources", {}) for node in nodes if node.get("Alive")]

    def placed(gpus: float, cpus: float) -> int:
        """Actors the live nodes hold, each needing ``gpus`` GPUs and ``cpus`` CPUs on one node."""
        total = 0
        for res in alive:
            fits = [
                int(res.get(kind, 0.0) / each + 1e-9) for kind, each in (("GPU", gpus), ("CPU", cpus)) if each
            ]
            total += min(fits) if fits else need
        return total

    if placed(gpus_per_actor, cpus_per_actor) >= need:
        return
    have = {kind: sum(res.get(kind, 0.0) for res in alive) for kind in ("GPU", "CPU")}
    where = (
        f"the Ray cluster has {have['GPU']:g} GPU(s) and {have['CPU']:g} CPU(s) on {len(alive)} live node(s)"
    )
    fit = placed(gpus_per_actor, 0.0)
    if fit < need:
        raise ConfigError(
            f"{where}: {need} actor(s) with --gpus-per-actor {gpus_per_actor:g} cannot be placed ({fit} "
            "fit) and would wait forever; pass --gpus-per-actor 0 to score on CPUs, start fewer --actors, "
            "or add GPU nodes"
        )
    fit = placed(gpus_per_actor, cpus_per_actor)
    fewer = f"pass --actors {fit} (or a MIN of at most {fit}), or " if fit else ""
    raise ConfigError(
        f"{where}: {need} actor(s) of {cpus_per_actor:g} CPU(s) each cannot be placed ({fit} fit) and would "
        f"wait forever; {fewer}add nodes"
    )


def read_scores(output_dir: str | Path, columns: Sequence[str] = SCORE_FIELDS) -> Any:
    """All rows of a (possibly resumed) output directory of a metric with score ``columns`` (QACE's by
    default) as one Arrow table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = output_schema(columns)
    tables = [pq.read_table(path, schema=schema) for path in sorted(Path(output_dir).glob("*.parquet"))]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _read(ray: Any, inputs: str | list[str], fmt: str) -> Any:
    """A data set of every input record (`_read_file`'s rows), one read task per input file."""
    from qace.data.records import FORMATS

    if fmt not in FORMATS:
        raise ConfigError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    files: list[str] = []
    for given in [inputs] if isinstance(inputs, str) else list(inputs):
        path = Path(given)
        found = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
        if not found or not all(p.is_file() for p in found):
            raise InputError(f"input {given!r} is no file, nor a directory of .parquet files")
        files += [str(p) for p in found]
    items = ray.data.from_items([{"path": f} for f in files], override_num_blocks=len(files))
    return items.map_batches(_read_file, fn_kwargs={"fmt": fmt}, batch_size=1, batch_format="pyarrow")


READ_BATCH = 4096
"""Records per Arrow table that a read task yields (Ray Data merges them into blocks of up to its target
block size; `call_sized_blocks` cuts those for the actors)."""


def _read_file(batch: Any, fmt: str) -> Iterator[Any]:
    """The records of the file named in ``batch`` as Arrow tables of `READ_BATCH` rows: ``id, source,
    line, caption, references, image_id, image, error`` (``error`` set for a record the reader rejected)."""
    import pyarrow as pa

    from qace.data.records import RecordError, read_records

    schema = pa.schema(
        [("id", pa.string()), ("source", pa.string()), ("line", pa.int64()), ("caption", pa.string()),
         ("references", pa.list_(pa.string())), ("image_id", pa.string()), ("image", pa.string()),
         ("error", pa.string())]
    )  # fmt: skip
    for source in batch.column("path").to_pylist():
        rows: list[dict[str, Any]] = []
        for item in read_records(source, fmt=fmt):
            row: dict[str, Any] = {"id": item.id, "source": source, "line": item.line}
            if isinstance(item, RecordError):
                row["error"] = item.reason
            else:
                row.update(
                    caption=item.caption, references=item.references, image_id=item.image_id, image=item.image
                )
            rows.append(row)
            if len(rows) == READ_BATCH:
                yield pa.Table.from_pylist(rows, schema=schema)
                rows = []
        if rows:
            yield pa.Table.from_pylist(rows, schema=schema)


def _done_keys(files: list[Path]) -> set[str]:
    """`_key`s of the records in every readable output file; unreadable ones are leftovers of a
    killed write and go."""
    import pyarrow.parquet as pq

    done: set[str] = set()
    for path in files:
        try:
            table = pq.read_table(path, columns=["source", "line"])
            done.update(map(_key, table.column("source").to_pylist(), table.column("line").to_pylist()))
        except Exception as exc:  # noqa: BLE001  (pyarrow raises several types for a torn file)
            log.warning("removing unreadable %s (a write killed midway): %s", path, exc)
            path.unlink()
    return done


def _key(source: Any, line: Any) -> str:
    """An input record's place: its file and line."""
    return f"{line}:{source}"


def _drop_done(batch: Any, done: list[str]) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = pa.array(
        map(_key, batch.column("source").to_pylist(), batch.column("line").to_pylist()), pa.string()
    )
    return batch.filter(pc.invert(pc.is_in(keys, value_set=pa.array(done, pa.string()))))


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def _references(value: Any) -> list[str] | None:
    """References from a list column, a numpy array (pandas batches) or a JSON list string."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [value]
    return [str(v) for v in value] if not isinstance(value, str) else [value]


def _rows_of(batch: dict[str, Any]) -> list[dict[str, Any]]:
    names = list(batch)
    count = len(batch[names[0]]) if names else 0
    return [{name: batch[name][i] for name in names} for i in range(count)]
