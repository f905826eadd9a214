"""Host cost of the file path per record: what `qace score FILE -o out.parquet --resume` spends around
the scorer.

    python -m benchmarks.file_path --out benchmarks/results/file_path.json [--records 50000] [--explain]

The scorer is a stand-in that answers at once with a fixed row of the shape of a QACE-Img row (``id``,
``image_id``, ``metric``, the five scores, ``n_questions``, ``flags``, ``signature``; with ``--explain``
also a per-question ``explanation``), so every second measured is host work: reading and parsing the
input, fingerprinting it (`qace.data.fingerprint`), the resume check, the writer's row encoding and its
chunk commits. The input is ``--records`` records of the PASCAL-50S workload (`benchmarks.workload`,
seed 1) written as JSONL the way ``benchmarks/throughput.py`` writes it; the output is Parquet with the
input log on, as `qace.scoring.score_file` writes it.

Two measurements, each the best of ``--repeats`` (CPU seconds of this process, microseconds per record):

- ``stages``: each stage alone (the garbage collector off), in the order the file loop runs them:
  ``read`` (`read_records` to a list), ``mark`` (the input marks), ``check`` (the resume check against a
  fresh output), ``add`` (`ResultWriter.add` less its commits), ``commit`` (the chunk commits,
  `ResultWriter.flush`) and ``close`` (assembling the final file, once a run);
- ``score_file``: the whole `score_file` call with the stand-in scorer, collector on: what the stages add
  up to, plus the loop itself and the collector's passes.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import run_info
from benchmarks.workload import pascal_workload, write_jsonl
from qace.data.fingerprint import InputCheck, input_mark
from qace.data.output import ResultWriter
from qace.data.records import Record, RecordError, read_records
from qace.scoring import score_file

SIGNATURE = "qace-img|v1|qg=t5-base-qg|tqa=t5-base-tqa|vqa=visual-t5|bs=roberta-large-L17|bf16|chunk=2048"
CHUNK = 2048  # the speed defaults' chunk (`qace.config.speed_defaults`)


def result_row(record: Record, explain: bool) -> dict[str, Any]:
    """A QACE-Img row for ``record`` (`qace.metric.pipeline._result_row`), with fixed numbers."""
    row: dict[str, Any] = {
        "id": record.id,
        "image_id": record.image_id,
        "metric": "QACE-Img",
        "qace": 0.61803398875,
        "qace_f1": 0.5432109876,
        "qace_bs": 0.8765432101,
        "qace_an": 0.4321098765,
        "qace_max": 0.7654321098,
        "n_questions": 6,
        "flags": [],
        "signature": SIGNATURE,
    }
    if explain:
        row["explanation"] = {
            "caption": record.caption,
            "candidates": ["a dog", "the grass", "a ball"],
            "questions": [
                {
                    "candidate": "a dog",
                    "question": "what is running on the grass?",
                    "answer_on_caption": "a dog",
                    "answers_on_context": ["dog"],
                    "f1": [1.0],
                    "bs": [0.9731],
                    "an": [0.8812],
                }
            ]
            * 6,
        }
    return row


class InstantScorer:
    """A `qace.scorers.Scorer` that answers every record at once with `result_row`."""

    signature = SIGNATURE
    score_key = "qace"
    uses_test_models = False
    chunk_size = CHUNK
    progress = False

    def __init__(self, explain: bool) -> None:
        self.explain = explain

    def score_records(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        for record in records:
            yield record if isinstance(record, RecordError) else result_row(record, self.explain)

    score_committed = score_records


def stages(path: Path, out: Path, explain: bool) -> dict[str, float]:
    """CPU seconds of each stage alone (see the module docstring), with the garbage collector off: each
    stage holds all records, which would make its collections far dearer than a streaming run's."""
    gc.collect()
    gc.disable()
    try:
        return _stages(path, out, explain)
    finally:
        gc.enable()


def _stages(path: Path, out: Path, explain: bool) -> dict[str, float]:
    seconds: dict[str, float] = {}
    clock = time.process_time

    t = clock()
    records = list(read_records(path))
    seconds["read"] = clock() - t

    t = clock()
    marks = [input_mark(r) for r in records]
    seconds["mark"] = clock() - t

    writer = ResultWriter(out, signature=SIGNATURE, resume=True, chunk_size=CHUNK, input_log=True)
    t = clock()
    check = InputCheck(writer.committed_marks(), str(out))
    done_ids, done_lines = writer.done_ids(), writer.done_lines()
    for item, mark in zip(records, marks, strict=True):
        check.matches(mark) or item.id in done_ids or item.line in done_lines
    check.finish()
    seconds["check"] = clock() - t

    rows = [result_row(r, explain) for r in records if isinstance(r, Record)]
    commits = 0.0
    flush = writer.flush

    def timed_flush() -> None:
        nonlocal commits
        start = clock()
        flush()
        commits += clock() - start

    writer.flush = timed_flush  # type: ignore[method-assign]
    t = clock()
    for row, mark in zip(rows, marks, strict=True):
        writer.add(row, mark=mark)
    writer.flush()
    seconds["add"] = clock() - t - commits
    seconds["commit"] = commits
    t = clock()
    writer.close()
    seconds["close"] = clock() - t
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON report path")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--explain", action="store_true", help="rows carry the per-question explanation")
    parser.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data")
    )
    args = parser.parse_args(argv)

    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="qace-file-path-") as tmp:
        work = Path(tmp)
        path = work / "input.jsonl"
        write_jsonl(pascal_workload(Path(args.data_dir), args.records, seed=1), path)
        for repeat in range(args.repeats):
            found = stages(path, work / f"stages-{repeat}.parquet", args.explain)
            start = time.process_time()
            summary = score_file(
                InstantScorer(args.explain), path, work / f"run-{repeat}.parquet", resume=True
            )
            found["score_file"] = time.process_time() - start
            assert summary.scored == args.records, summary
            best = {k: min(v, best.get(k, v)) for k, v in found.items()}

    per_record = {k: round(v / args.records * 1e6, 2) for k, v in best.items()}
    per_record["stages_total"] = round(
        sum(per_record[k] for k in ("read", "mark", "check", "add", "commit")), 2
    )
    report = {
        **run_info.record("benchmarks.file_path", argv, device="cpu", packages=("pyarrow",)),
        "records": args.records,
        "explain": args.explain,
        "chunk_size": CHUNK,
        "us_per_record": per_record,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["us_per_record"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
