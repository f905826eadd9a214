"""spaCy's parse as spaCy loads it and as qace loads it (`qace.metric.candidates.load_spacy`): the
layers' matrix products through BLIS (thinc's default) or numpy's BLAS, the attribute ruler as spaCy's
`Matcher` or as table lookups (`qace.metric.pos_rules`). How fast a parsing process is with each, and
whether the annotations candidates read are the same.

    python -m benchmarks.spacy_parse                      # -> benchmarks/results/spacy_parse_cpu.json
    python -m benchmarks.spacy_parse --captions 64 --speed-captions 64 --rounds 1 --out /tmp/s.json  # smoke

The pipelines (`PIPELINES`): ``spacy`` (BLIS, spaCy's ruler), ``numpy_blas`` (numpy's BLAS, spaCy's
ruler), ``qace`` (numpy's BLAS, the ruler as lookups). The captions: every distinct caption of
PASCAL-50S (48,715) and of Flickr8k-Expert (its candidates and references), sorted; ``--captions``
keeps the first N.

- ``speed``: one parsing process per pipeline, each a `HostPool` process as qace's parsing processes are
  (the same environment: one BLAS thread). Each parses the first ``--speed-captions`` captions in tasks
  of ``--task`` captions, one task at a time, the processes taking turns (in reversed order every other
  round) over ``--rounds``. Per pipeline: milliseconds per caption (median over rounds) from submitting
  a task to its result, as the extractor waits, and inside the process; spaCy's over each other's.
- ``gemm``: in each process, a product of a tok2vec layer's shape (2,500 x 288 by 288 x 288, fp32)
  through the pipeline's ops, GFLOP/s (median of 20).
- ``agreement``: in this process, every pipeline over every caption: per pipeline, how many captions
  differ from ``spacy``'s in their coarse tags, fine tags, dependency labels, heads, entities or
  candidates.
- ``parallel``: where a reward call's parse goes. For each ``--parallel-processes`` count, that many
  parsing processes of qace's (qace's load, candidates of every caption); each call of
  ``--parallel-calls`` distinct captions is cut into one part per process two ways (`SPLITS`): as the
  scorer's extractor cuts it (``balanced``: about equal characters a part, `balanced_parts`) and into
  parts of equal count in the call's order (``by_count``), the two taking turns going first. Every
  part's process notes when it began and ended its parse on the host's monotonic clock (system-wide on
  Linux). Per call size and split, medians over ``--parallel-repeats`` calls (after one untimed): the
  call's wall (the first part submitted to the last result back), when the first and the last part came
  back, the shortest and the longest parse inside a process, the longest wait of a part before its
  process began it and of a result before it was back, and the part whose parse took longest parsed
  again alone (submitted by itself to the same processes): the parse of a part beside the others
  against the same parse with the host otherwise idle; that part's captions and characters.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.latency import DEFAULT_DATA
from benchmarks.run_info import record, write_result
from benchmarks.workload import PASCAL_DISTINCT, flickr_workload, pascal_workload
from qace.metric.candidates import DEFAULT_SPACY_MODEL, balanced_parts, candidates_from_doc, load_spacy

PIPELINES: dict[str, dict[str, bool]] = {
    "spacy": {"blis": True, "pos_rules": False},
    "numpy_blas": {"blis": False, "pos_rules": False},
    "qace": {"blis": False, "pos_rules": True},
}
"""`load_spacy`'s arguments for each pipeline compared; ``spacy`` is spaCy's own load."""


def captions(data_dir: Path) -> list[str]:
    """The module docstring's captions: every distinct PASCAL-50S and Flickr8k-Expert caption, sorted."""
    flickr = flickr_workload(data_dir)
    return sorted(
        {r.caption for r in pascal_workload(data_dir, PASCAL_DISTINCT)}
        | {r.caption for r in flickr}
        | {ref for r in flickr for ref in r.references}
    )


def _worker(argument: tuple[str, str], _core: object = None) -> Callable[[Any], Any]:
    """A parsing process (`HostPool` setup): ``("parse", captions)`` -> seconds the parse took here;
    ``("gemm", repeats)`` -> GFLOP/s of a tok2vec-shaped product through this pipeline's ops."""
    import numpy as np

    model, pipeline = argument
    nlp = load_spacy(model, **PIPELINES[pipeline])
    ops = nlp.get_pipe("tok2vec").model.ops

    def run(task: tuple[str, Any]) -> float:
        kind, payload = task
        if kind == "parse":
            start = time.perf_counter()
            list(nlp.pipe(payload, batch_size=len(payload)))
            return time.perf_counter() - start
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2500, 288), dtype=np.float32)
        w = rng.standard_normal((288, 288), dtype=np.float32)
        ops.gemm(x, w)
        seconds = []
        for _ in range(payload):
            start = time.perf_counter()
            ops.gemm(x, w)
            seconds.append(time.perf_counter() - start)
        return 2 * 2500 * 288 * 288 / statistics.median(seconds) / 1e9

    return run


def _timed_parser(model: str, _core: object = None) -> Callable[[list[str]], tuple[float, float]]:
    """A parsing process as qace's (`qace.metric.candidates.parser`) that returns when it began and ended
    each task (``time.monotonic``) instead of the candidates."""
    from qace.metric.candidates import extract_candidates

    nlp = load_spacy(model)

    def run(captions: list[str]) -> tuple[float, float]:
        start = time.monotonic()
        extract_candidates(captions, nlp)
        return start, time.monotonic()

    return run


def _by_count(call: list[str], n: int) -> list[list[str]]:
    size = -(-len(call) // n)
    return [call[i : i + size] for i in range(0, len(call), size)]


SPLITS: dict[str, Callable[[list[str], int], list[list[str]]]] = {
    "balanced": lambda call, n: [[call[i] for i in part] for part in balanced_parts(call, n)],
    "by_count": _by_count,
}
"""How a call is cut into parts: as the extractor cuts it (`balanced_parts`: about equal characters a
part), and into parts of equal count in the call's order (how it cut calls before)."""


def _parallel_call(pool: Any, parts: list[list[str]]) -> dict[str, float]:
    """One call's timings in milliseconds, its captions cut into ``parts`` (the module docstring's
    ``parallel``)."""
    sent, back = [0.0] * len(parts), [0.0] * len(parts)
    futures = []
    start = time.monotonic()
    for k, part in enumerate(parts):
        sent[k] = time.monotonic()
        future = pool.submit(part)
        future.add_done_callback(lambda _, k=k: back.__setitem__(k, time.monotonic()))
        futures.append(future)
    spans = [future.result() for future in futures]
    while not all(back):  # a future's waiter may wake before its callbacks ran
        time.sleep(0)
    parses = [end - begin for begin, end in spans]
    longest = max(range(len(parts)), key=lambda k: parses[k])
    begin, end = pool.submit(parts[longest]).result()
    return {
        "wall_ms": 1000 * (max(back) - start),
        "first_back_ms": 1000 * (min(back) - start),
        "shortest_parse_ms": 1000 * min(parses),
        "longest_parse_ms": 1000 * max(parses),
        "longest_wait_to_begin_ms": 1000 * max(b - s for (b, _), s in zip(spans, sent, strict=True)),
        "longest_wait_for_result_ms": 1000 * max(r - e for (_, e), r in zip(spans, back, strict=True)),
        "longest_part_alone_ms": 1000 * (end - begin),
        "longest_part_captions": len(parts[longest]),
        "longest_part_characters": sum(map(len, parts[longest])),
        "parts": len(parts),
    }


def parallel(
    texts: Sequence[str], model: str, processes: Sequence[int], sizes: Sequence[int], repeats: int
) -> dict[str, Any]:
    """The module docstring's ``parallel``: per process count and call size, the medians of
    `_parallel_call` and the calls' walls."""
    from qace.engine.host_pool import HostPool

    result: dict[str, Any] = {}
    for n in processes:
        pool = HostPool(n, "benchmarks.spacy_parse:_timed_parser", model, label="spaCy")
        try:
            pool.wait_ready()
            for size in sizes:
                windows = max(1, len(texts) // size)
                calls: dict[str, list[dict[str, float]]] = {split: [] for split in SPLITS}
                for r in range(repeats + 1):
                    call = list(texts[(r % windows) * size :][:size])
                    for split in list(SPLITS)[:: 1 if r % 2 else -1]:  # the splits take turns going first
                        timed = _parallel_call(pool, SPLITS[split](call, n))
                        if r:  # the first call of each split is untimed
                            calls[split].append(timed)
                result[f"{n}_processes_{size}_captions"] = {
                    "processes": n,
                    "captions": size,
                    **{
                        split: {
                            **{key: statistics.median(c[key] for c in timed) for key in timed[0]},
                            "calls_wall_ms": [c["wall_ms"] for c in timed],
                        }
                        for split, timed in calls.items()
                    },
                }
        finally:
            pool.close()
    return result


def speed(texts: Sequence[str], model: str, task: int, rounds: int) -> dict[str, Any]:
    """The module docstring's ``speed`` and ``gemm``."""
    from qace.engine.host_pool import HostPool

    pools = {
        name: HostPool(1, "benchmarks.spacy_parse:_worker", (model, name), label=f"spaCy-{name}")
        for name in PIPELINES
    }
    try:
        for pool in pools.values():
            pool.wait_ready()
            pool.submit(("parse", list(texts[:task]))).result()  # first-call costs, untimed
        tasks = [list(texts[i : i + task]) for i in range(0, len(texts), task)]
        waited: dict[str, list[float]] = {name: [] for name in pools}
        inside: dict[str, list[float]] = {name: [] for name in pools}
        for r in range(rounds):
            for name in list(pools) if r % 2 == 0 else list(pools)[::-1]:
                start, parsing = time.perf_counter(), 0.0
                for part in tasks:
                    parsing += pools[name].submit(("parse", part)).result()
                waited[name].append(1000 * (time.perf_counter() - start) / len(texts))
                inside[name].append(1000 * parsing / len(texts))
        result: dict[str, Any] = {
            name: {
                "ms_per_caption": statistics.median(waited[name]),
                "ms_per_caption_inside": statistics.median(inside[name]),
                "rounds_ms_per_caption": waited[name],
                "gemm_gflops": pools[name].submit(("gemm", 20)).result(),
            }
            for name in pools
        }
        for name in list(PIPELINES)[1:]:
            result[f"spacy_over_{name}"] = result["spacy"]["ms_per_caption"] / result[name]["ms_per_caption"]
        return result
    finally:
        for pool in pools.values():
            pool.close()


def annotations(nlp: Any, texts: Sequence[str]) -> list[tuple[Any, ...]]:
    """Per caption: coarse tags, fine tags, dependency labels, heads, entities and candidates."""
    return [
        (
            tuple(t.pos_ for t in doc),
            tuple(t.tag_ for t in doc),
            tuple(t.dep_ for t in doc),
            tuple(t.head.i for t in doc),
            tuple((e.start, e.end, e.label_) for e in doc.ents),
            tuple(candidates_from_doc(doc)),
        )
        for doc in nlp.pipe(texts, batch_size=256)
    ]


def agreement(texts: Sequence[str], model: str) -> dict[str, Any]:
    """The module docstring's ``agreement``, with up to five differing captions per pipeline and field."""
    parsed = {name: annotations(load_spacy(model, **kwargs), texts) for name, kwargs in PIPELINES.items()}
    fields = ("coarse_tags", "tags", "dependency_labels", "heads", "entities", "candidates")
    differing = {
        name: {
            field: [texts[k] for k in range(len(texts)) if parsed["spacy"][k][i] != parsed[name][k][i]]
            for i, field in enumerate(fields)
        }
        for name in list(PIPELINES)[1:]
    }
    return {
        "captions": len(texts),
        "differing_from_spacy": {
            name: {field: len(found) for field, found in by_field.items()}
            for name, by_field in differing.items()
        },
        "examples": {
            name: {field: found[:5] for field, found in by_field.items() if found}
            for name, by_field in differing.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results/spacy_parse_cpu.json")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--model", default=DEFAULT_SPACY_MODEL)
    parser.add_argument("--captions", type=int, default=None, help="default: every caption")
    parser.add_argument("--speed-captions", type=int, default=4096)
    parser.add_argument("--task", type=int, default=256, help="captions a parsing task")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--parallel-processes", type=int, nargs="*", default=[14, 10, 8])
    parser.add_argument("--parallel-calls", type=int, nargs="*", default=[64, 256], help="captions a call")
    parser.add_argument("--parallel-repeats", type=int, default=10)
    args = parser.parse_args(argv)
    texts = captions(args.data_dir)[: args.captions]
    result = {
        **record("benchmarks.spacy_parse", argv, packages=("spacy", "thinc", "blis", "numpy")),
        "model": args.model,
        "task": args.task,
        "rounds": args.rounds,
        "speed_captions": min(args.speed_captions, len(texts)),
        "speed": speed(texts[: args.speed_captions], args.model, args.task, args.rounds),
        "agreement": agreement(texts, args.model),
        "parallel": parallel(
            texts, args.model, args.parallel_processes, args.parallel_calls, args.parallel_repeats
        ),
    }
    write_result(result, args.out, "spacy_parse", None)
    shown = ("speed", "agreement", "parallel")
    print(json.dumps({key: result[key] for key in shown}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
