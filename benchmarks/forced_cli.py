"""``qace score`` with the benchmark workload's forced output lengths, stamping its progress.

    python -m benchmarks.forced_cli STAMPS.json -- score INPUT -o OUT.parquet --resume --models DIR ...

Runs ``qace.cli.main`` on the arguments after ``--``: the real file path (reading, scoring, committing
chunks, writing the output), with one change: the scorer the CLI builds gets the workload's output
control (`benchmarks.workload.force_lengths`; random weights never stop on their own). It writes
``STAMPS.json``: wall-clock times (``time.time()``) of the process start, of every chunk of rows the
file loop receives (``chunk_size`` rows), and of the CLI's return (output assembled), so the caller can
tell start-up (imports, model load, first chunk) from the steady state. With ``QACE_BENCH_WARM_UP=1``
the scorer captures every batch shape's CUDA graphs (`qace.api.QACE.warm_up`) before it scores, so
the steady state holds no capture. With ``QACE_BENCH_IN_PROCESS=1`` it builds the same scorer from the
same arguments but scores the input's records (read into memory first) through ``score_records``,
without the file loop: the in-process rate, in a process just as fresh as the CLI's.

Both write where the time went (``breakdown``): each scorer stage's wall and thread-CPU seconds
(`qace.engine.instrument.StageTimer`; ``prepare`` runs in the prefetch thread, the rest in the main
thread), the seconds the consumer of the results held the main thread (the file loop: writing rows and
committing chunks), the main thread's CPU seconds, and the cyclic garbage collector's collections and
seconds, over the whole run and (``breakdown.steady``) from the first stamp on, the steady window the
throughput benchmark's rate covers. ``QACE_BENCH_SWITCH_INTERVAL=S`` sets the interpreter's thread
switch interval first (an experiment: how much the threads' handing over of the interpreter lock costs).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

STARTED = time.time()


def stamped(
    rows: Iterable[Any],
    stamps: list[tuple[int, float]],
    every: int,
    held: dict[str, float] | None = None,
    on_stamp: Callable[[], None] | None = None,
) -> Iterator[Any]:
    """``rows`` unchanged, appending ``(rows so far, time.time())`` to ``stamps`` every ``every`` rows
    (then calling ``on_stamp``) and after the last one; ``held["consumer"]`` adds up the seconds the
    consumer kept each row."""
    count = 0
    for row in rows:
        count += 1
        if count % every == 0:
            stamps.append((count, time.time()))
            if on_stamp is not None:
                on_stamp()
        given = time.perf_counter()
        yield row
        if held is not None:
            held["consumer"] = held.get("consumer", 0.0) + time.perf_counter() - given
    if not stamps or stamps[-1][0] != count:
        stamps.append((count, time.time()))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2 or argv[1] != "--":
        usage = "usage: python -m benchmarks.forced_cli STAMPS.json -- score INPUT -o OUTPUT ..."
        print(usage, file=sys.stderr)
        return 2
    out, cli_args = Path(argv[0]), argv[2:]
    from benchmarks.workload import force_lengths
    from qace import cli
    from qace.engine import instrument
    from qace.engine.instrument import CollectorPauses, StageTimer

    stamps: list[tuple[int, float]] = []
    held: dict[str, float] = {}
    timer = StageTimer()
    collections = CollectorPauses()
    cpu = time.thread_time()
    if interval := os.environ.get("QACE_BENCH_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(interval))
    build = cli._scorer

    def totals() -> dict[str, Any]:  # where the time went so far (in the main thread)
        return {
            "stages": {k: {"wall": v, "cpu": timer.cpu_seconds[k]} for k, v in timer.seconds.items()},
            "consumer_seconds": held.get("consumer", 0.0),
            "main_thread_cpu_seconds": time.thread_time() - cpu,
            "gc": {"collections": collections.count, "seconds": collections.seconds},
        }

    first: dict[str, Any] = {}  # at the first stamp: where the steady window starts

    def on_stamp() -> None:
        if not first:
            first.update(totals())

    def forced_scorer(args: Any, models: str | None = None) -> Any:
        scorer = force_lengths(build(args, models))
        instrument.attach(scorer, timer=timer)
        if os.environ.get("QACE_BENCH_WARM_UP") == "1":
            scorer.warm_up()
        committed = scorer.score_committed
        every = scorer.config.chunk_size
        scorer.score_committed = lambda records: stamped(committed(records), stamps, every, held, on_stamp)
        return scorer

    cli._scorer = forced_scorer
    if os.environ.get("QACE_BENCH_IN_PROCESS") == "1":
        status = _in_process(cli, cli_args, stamps, on_stamp)
    else:
        status = cli.main(cli_args)
    done = time.time()
    breakdown = totals()
    breakdown["steady"] = _minus(breakdown, first) if first else None
    report = {"started": STARTED, "stamps": stamps, "done": done, "status": status, "breakdown": breakdown}
    out.write_text(json.dumps(report))
    return status


def _minus(end: dict[str, Any], start: dict[str, Any]) -> dict[str, Any]:
    """``end - start``, number by number (a stage ``start`` lacks counts from zero)."""
    out: dict[str, Any] = {}
    for key, value in end.items():
        before = start.get(key, {} if isinstance(value, dict) else 0)
        out[key] = _minus(value, before) if isinstance(value, dict) else value - before
    return out


def _in_process(
    cli: Any, cli_args: list[str], stamps: list[tuple[int, float]], on_stamp: Callable[[], None]
) -> int:
    """The same scorer (built from the same arguments) on the same records, read into memory first,
    through ``score_records``: no file loop, no output. The stamps come from ``score_records`` itself."""
    from qace.data.records import read_records

    args = cli.build_parser("score").parse_args(cli_args)
    scorer = cli._scorer(args)
    records = list(read_records(args.input, references=args.references, fmt=args.format))
    for _ in stamped(scorer.score_records(records), stamps, scorer.config.chunk_size, on_stamp=on_stamp):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
