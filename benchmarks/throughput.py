"""Throughput on distinct captions: the engine, a fair batched Hugging Face baseline and ``qace score``.

    python -m benchmarks.throughput --variant img --models-dir /tmp/qace-bench   # one variant, all sections
    python -m benchmarks.throughput --variant ref --skip-cli                     # engine and baseline only
    python -m benchmarks.throughput --variant ref --skip-engine --skip-baseline  # qace score only
    python -m benchmarks.throughput --tiny --out /tmp/throughput-tiny.json       # CPU smoke run

Every run merges its sections into ``--out`` (default ``benchmarks/results/throughput_distinct_<gpu>.json``),
so the variants and sections can be run by separate commands.

Workload (``--workload distinct``, the main one): ``--captions`` PASCAL-50S human captions, all distinct,
each with 5 other captions of its image as references (a seeded draw, `benchmarks.workload.pascal_workload`);
``--workload repeats``: the 5,664 Flickr8k-Expert candidates, only 977 of them distinct. Models:
T5-base-shaped QG/TQA and T5-small-shaped Visual-T5 with random weights, random region features per image,
and the same seeded forced outputs for every system (questions 8-16 tokens, answers 2-4), so all do the
same work.

- ``engine``: ``QACE.warm_up()`` (CUDA graphs of every batch shape; ``--capture lazy`` skips it) and
  one pass over ``--warmup`` other captions, then a cold pass over the workload
  (``cold_captions_per_s``: captions never seen by the process), then ``--passes`` passes, each after
  emptying every engine cache (`reset_caches`: prompt ids, candidates, device features); their median
  is ``captions_per_s``. A synchronised pass over the
  first ``--profile-captions`` captions, scored as the steady state of a long run (``score_in_full_chunks``:
  whole chunks, through the host processes), gives each model's encoder and decoder FLOP utilisation
  (``graph_captures_in_profiled_pass``: CUDA graphs it still had to capture, whose time it would count).
- ``baseline``: `benchmarks.hf_batched.Baseline` over the same records after a warm-up on
  ``--baseline-warmup`` of the warm-up captions (default: all of them, as the engine), then
  plain ``generate`` alone on sampled batches of each stage (`generate_bound`);
  ``generate_bound_fraction`` is the baseline's model rate as a fraction of that bound.
- ``cli``: ``qace score INPUT -o out.parquet --resume`` in a subprocess (`benchmarks.forced_cli`) on
  ``--cli-captions`` records (PASCAL's distinct captions, then the same captions again with other
  images and references); QACE-Img reads its features from an HDF5 store written for the run. The
  steady-state rate leaves out start-up (imports, model load) and the first chunk: rows after the
  first ``chunk_size`` rows over the time from then to the CLI's return (output written). The same
  scorer, built from the same arguments in a second fresh subprocess, scoring the same records (read
  into memory first) through ``QACE.score_records`` and measured the same way, gives
  ``in_process_captions_per_s``: both processes pay the same first-use costs (CUDA-graph captures,
  kernel loading), so the ratio is what the file path costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import hf_batched
from benchmarks.run_info import default_result, gpu_name, record
from benchmarks.workload import (
    PASCAL_DISTINCT,
    add_engine_arguments,
    distinct_captions,
    engine_defaults,
    flickr_workload,
    graph_captures,
    pascal_workload,
    reset_caches,
    score_in_full_chunks,
    transformers_model,
    workload_models,
    workload_scorer,
    write_jsonl,
)
from qace.api import QACE
from qace.data.features import RandomFeatureStore
from qace.engine import instrument
from qace.engine.instrument import StageTimer, cuda_sync
from qace.metric.candidates import load_spacy
from qace.models.visual_inputs import NUM_REGIONS

PEAK_BF16 = {"H100": 989e12, "H200": 989e12}  # dense bf16 tensor-core peak, vendor datasheet (SXM)
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


BASELINE_SPACY = {"blis": True, "pos_rules": False}
"""The baseline's spaCy (`load_spacy`'s arguments): spaCy's own load, as its engineer would write it. With
numpy's BLAS, each of ``nlp.pipe(n_process=...)``'s processes would thread its products over every core
(docs/performance.md)."""


def _linear_params(module: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


def _model_flops(runner: Any) -> tuple[float, float]:
    """Encoder and decoder FLOPs of the linear layers ``runner`` ran since its counters were zeroed, each
    layer counted where it runs (2 x its parameters per row it multiplies):

    - the encoder's layers once per (padded) encoder token; Visual-T5's region projection once per region
      (36 a sequence), not per token;
    - the decoder's layers and the LM head once per decoded row-step (graph buckets' rows included),
      except the cross-attention's key and value projections, which run once per encoder token (the
      decoder computes every layer's cross keys and values once a batch).

    Attention products and relative-bias adds are left out (about 1% of T5-base's), so these are slight
    underestimates; on a GPU the products' rows padded to a count cuBLAS has met (at most 3.1%,
    `qace.engine.gemm_rows`) are not counted either. A CPU test checks the count against
    ``torch.utils.flop_counter`` on the engine's own runs.
    """
    model, stats = runner.model, runner.stats
    tokens = stats["encoder_tokens"]
    region = getattr(model.encoder, "img_emb", None)
    region_params = 0 if region is None else region.weight.numel()
    encoder = 2 * (_linear_params(model.encoder) - region_params) * tokens
    encoder += 2 * region_params * NUM_REGIONS * stats["sequences"]
    cross_kv = sum(
        block.layer[1].EncDecAttention.k.weight.numel() + block.layer[1].EncDecAttention.v.weight.numel()
        for block in model.decoder.block
    )
    per_step = _linear_params(model.decoder) - cross_kv + model.lm_head.weight.numel()
    decoder = 2 * per_step * runner.decoder.row_steps + 2 * cross_kv * tokens
    return float(encoder), float(decoder)


def _runners(scorer: QACE) -> dict[str, Any]:
    return {r: getattr(scorer.models, r) for r in ("qg", "tqa", "vqa") if getattr(scorer.models, r)}


def _zero_counters(scorer: QACE, profile: bool = False) -> None:
    """Zero every runner's counters; ``profile`` attaches a fresh encoder/decoder timer to each
    (`qace.engine.instrument`), else detaches it."""
    for runner in _runners(scorer).values():
        instrument.attach(runner, profile=StageTimer() if profile else None)
        runner.stats = dict.fromkeys(runner.stats, 0)
        runner.decoder.row_steps = 0


def _timed(scorer: QACE, records: list) -> tuple[float, list[dict[str, Any]]]:
    cuda_sync()
    start = time.perf_counter()
    rows = list(scorer.score_records(records))
    cuda_sync()
    return time.perf_counter() - start, rows


def _peak(device: str) -> float:
    gpu = gpu_name(device) or "cpu"
    return next((v for k, v in PEAK_BF16.items() if k in gpu), float("nan"))


@contextmanager
def single_process(scorer: QACE) -> Iterator[None]:
    """The single-process design on the same scorer and models: no host processes (none started
    either) until the block ends."""
    host, config = scorer.host, scorer.config
    scorer.host, scorer.config = None, config.with_(host_workers=0)
    try:
        yield
    finally:
        scorer.host, scorer.config = host, config


def _design_pass(
    scorer: QACE, records: list, *, single: bool
) -> tuple[float, list[dict[str, Any]], int | None]:
    """One timed pass after emptying every cache, by the engine core with host processes or (``single``)
    by the single-process design on the same models; its seconds, rows and peak GPU memory."""
    reset_caches(scorer)
    _zero_counters(scorer)
    idle = scorer.core.idle_seconds if scorer.core is not None else 0.0
    with single_process(scorer) if single else nullcontext():
        if torch.cuda.is_available() and str(scorer.config.device).startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        seconds, rows = _timed(scorer, records)
    if not single and scorer.core is not None:
        print(
            f"engine core idle {scorer.core.idle_seconds - idle:.3f} s of a {seconds:.3f} s pass", flush=True
        )
    peak = torch.cuda.max_memory_allocated() if str(scorer.config.device).startswith("cuda") else None
    return seconds, rows, peak


def replay(
    core: Any,
    requests: list[tuple[str, Any]],
    *,
    models: bool = True,
    functions: bool = True,
    label: Callable[[str], AbstractContextManager[object]] | None = None,
) -> None:
    """The device work of a pass alone: every recorded request, in the order the core ran them, its
    runner batches as one overlapping stream, with no host work between them; ``models`` / ``functions``
    False leave out the runners' batches (the three models, region features gathered) or the core's
    functions (BERTScore's encoder and matching). ``label(name)``, where given, is entered around each
    function's call and each stream of batches (named by its runners, ``"tqa+vqa"``)."""
    from qace.engine.batches import VisualBatch
    from qace.engine.core import generate_jobs
    from qace.engine.engine import gather_features

    def batch(name: str, payload: Any) -> Any:
        runner = core.runners[name]
        b = payload[0]
        return gather_features(runner, core.features, b) if isinstance(b, VisualBatch) else b

    mark = label or (lambda _name: nullcontext())
    with core.lock:
        i = 0
        while i < len(requests):
            name, payload = requests[i]
            if name in core.functions:
                if functions:
                    with mark(name):
                        core.functions[name](payload)
                i += 1
                continue
            j, steps = i, payload[2]
            while j < len(requests) and requests[j][0] in core.runners and requests[j][1][2] == steps:
                j += 1
            if models:
                group = requests[i:j]
                jobs = ((core.runners[n], k, batch(n, p), p[1]) for k, (n, p) in enumerate(group))
                with mark("+".join(dict.fromkeys(n for n, _ in group))):
                    for _ in generate_jobs(jobs, steps):
                        pass
            i = j


def recorded_requests(scorer: QACE, score: Callable[[], object]) -> list[tuple[str, Any]]:
    """Every request the engine core runs while ``score()`` runs, from emptied caches."""
    requests: list[tuple[str, Any]] = []
    reset_caches(scorer)
    with instrument.attached(scorer.core, requests=requests):
        score()
    return requests


def replayed_seconds(scorer: QACE, requests: list[tuple[str, Any]], **which: bool) -> float:
    """Seconds of one synchronised `replay` of ``requests`` (``which``: its ``models`` / ``functions``),
    from emptied caches: the replay uploads each image's features again, as the pass did."""
    reset_caches(scorer)
    cuda_sync()
    start = time.perf_counter()
    replay(scorer.core, requests, **which)
    cuda_sync()
    return time.perf_counter() - start


def models_alone(scorer: QACE, records: list) -> dict[str, Any]:
    """Record every request the engine core runs in a pass, then replay them back to back: the rate of
    the device work alone (the three models and BERTScore's encoder and matching; region features
    gathered on the device as in the pass), the bound host work cannot beat. To split it, each replayed
    from emptied caches: the models' batches alone and BERTScore's alone, and the requests of the same
    records scored in whole chunks from the first (`score_in_full_chunks`, a long run's steady state),
    where the pass tapers its first and last chunks."""

    tapered = recorded_requests(scorer, lambda: list(scorer.score_records(records)))
    whole = recorded_requests(scorer, lambda: score_in_full_chunks(scorer, records))
    seconds = replayed_seconds(scorer, tapered)
    return {
        "captions_per_s": len(records) / seconds,
        "seconds": seconds,
        "requests": len(tapered),
        "models_only_seconds": replayed_seconds(scorer, tapered, functions=False),
        "bertscore_only_seconds": replayed_seconds(scorer, tapered, models=False),
        "whole_chunks_seconds": replayed_seconds(scorer, whole),
        "whole_chunks_requests": len(whole),
    }


def gpu_busy_fraction(scorer: QACE, records: list, *, single: bool = False) -> dict[str, Any]:
    """Kernel time over wall time of a pass (the union of every kernel's interval on the device, from a
    CUDA-only profile; copies not counted), after emptying every cache."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    reset_caches(scorer)
    with (
        single_process(scorer) if single else nullcontext(),
        profile(activities=[ProfilerActivity.CUDA]) as prof,
    ):
        seconds, _ = _timed(scorer, records)
    spans = sorted(
        (e.start_ns(), e.start_ns() + e.duration_ns())
        for e in prof.profiler.kineto_results.events()
        if e.device_type() == DeviceType.CUDA and not e.name().startswith(("Memcpy", "Memset"))
    )
    busy, end = 0, None
    for lo, hi in spans:
        if end is None or lo > end:
            busy += hi - lo
            end = hi
        elif hi > end:
            busy += hi - end
            end = hi
    return {
        "fraction": busy / 1e9 / seconds,
        "kernel_seconds": busy / 1e9,
        "wall_seconds": seconds,
        "kernels": len(spans),
        "captions": len(records),
    }


def engine_section(
    scorer: QACE, records: list, warm: list, args: argparse.Namespace
) -> tuple[dict[str, Any], list[float]]:
    """Warm-up, the cold pass, the timed passes (caches emptied before each; with host processes,
    alternating with the single-process design on the same models), the models-alone replay, the GPU's
    busy fraction and the profiled pass; also the last timed pass's scores."""
    start = time.perf_counter()
    shapes = scorer.warm_up() if args.capture == "all" else None
    list(scorer.score_records(warm))
    if scorer.host is not None:  # the single-process design's first use (its tokenizers) outside the timing
        with single_process(scorer):
            list(scorer.score_records(warm[: len(warm) // 4]))
    warm_seconds = time.perf_counter() - start
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    _zero_counters(scorer)
    cold, _ = _timed(scorer, records)
    passes, flops, peaks, single, single_peaks, differing = [], [], [], [], [], []
    for _ in range(args.passes):
        seconds, rows, peak = _design_pass(scorer, records, single=False)
        passes.append(seconds)
        peaks.append(peak)
        flops.append(sum(sum(_model_flops(r)) for r in _runners(scorer).values()))
        if scorer.host is not None:
            seconds, single_rows, peak = _design_pass(scorer, records, single=True)
            single.append(seconds)
            single_peaks.append(peak)
            differing.append(sum(a != b for a, b in zip(single_rows, rows, strict=True)))
    seconds = float(np.median(passes))
    peak = _peak(args.device)
    result: dict[str, Any] = {
        "captions_per_s": len(records) / seconds,
        "cold_captions_per_s": len(records) / cold,
        "seconds": seconds,
        "cold_seconds": cold,
        "pass_seconds": passes,
        "host_workers": scorer.config.host_workers,
        "spacy_workers": scorer.config.spacy_workers,
        "warm_up_seconds": warm_seconds,
        "warm_up_captions": len(warm),
        "graph_shapes_captured_in_warm_up": shapes,
        "rows_per_stage_after_dedup": {role: r.stats["sequences"] for role, r in _runners(scorer).items()},
        "model_gflop_per_caption": float(np.median(flops)) / len(records) / 1e9,
        "pass_mfu_vs_datasheet_bf16_peak": float(np.median(flops)) / seconds / peak,
        "mean_qace": float(np.mean([r["qace"] for r in rows])),
        "peak_gpu_bytes": max(p for p in peaks) if args.device.startswith("cuda") else None,
    }
    on_gpu = args.device.startswith("cuda")
    if scorer.host is not None:
        single_seconds = float(np.median(single))
        result["single_process"] = {
            "captions_per_s": len(records) / single_seconds,
            "seconds": single_seconds,
            "pass_seconds": single,
            "peak_gpu_bytes": max(single_peaks) if on_gpu else None,
            "rows_differing_from_engine": differing,
        }
        result["speedup_vs_single_process"] = single_seconds / seconds
        if on_gpu:
            result["peak_gpu_bytes_vs_single_process"] = result["peak_gpu_bytes"] / max(single_peaks)
        alone = models_alone(scorer, records)
        result["models_alone"] = alone
        result["fraction_of_models_alone"] = result["captions_per_s"] / alone["captions_per_s"]
    if on_gpu and args.busy_captions:
        busy = records[: args.busy_captions]
        engine_busy = gpu_busy_fraction(scorer, busy)
        result["gpu_busy_fraction"] = engine_busy["fraction"]
        result["gpu_busy"] = {"engine": engine_busy}
        if scorer.host is not None:
            result["gpu_busy"]["single_process"] = gpu_busy_fraction(scorer, busy, single=True)
    # a synchronised pass over a prefix times each model's encoder and decoder apart (costs a little)
    profiled = records[: args.profile_captions]
    if profiled:
        reset_caches(scorer)
        _zero_counters(scorer, profile=True)
        captured = graph_captures(scorer)
        score_in_full_chunks(scorer, profiled)
        captured = graph_captures(scorer) - captured
        mfu = {}
        for role, runner in _runners(scorer).items():
            enc, dec = _model_flops(runner)
            stats = runner.stats
            profile = instrument.of(runner).profile
            assert profile is not None
            seconds = {stage: profile.seconds[stage] for stage in ("encoder", "decoder")}
            mfu[role] = {
                "sequences": stats["sequences"],
                "encoder_tokens_padded": stats["encoder_tokens"],
                "decoder_row_steps": runner.decoder.row_steps,
                "encoder_seconds": seconds["encoder"],
                "decoder_seconds": seconds["decoder"],
                "encoder_tflops": enc / max(seconds["encoder"], 1e-9) / 1e12,
                "decoder_tflops": dec / max(seconds["decoder"], 1e-9) / 1e12,
                "encoder_mfu": enc / max(seconds["encoder"], 1e-9) / peak,
                "decoder_mfu": dec / max(seconds["decoder"], 1e-9) / peak,
            }
        _zero_counters(scorer)
        result["mfu"] = {
            "captions": len(profiled),
            "peak_flops": peak,
            "graph_captures_in_profiled_pass": captured,
            **mfu,
        }
    return result, [r["qace"] for r in rows]


def baseline_section(
    scorer: QACE,
    models_dir: Path,
    variant: str,
    records: list,
    warm: list,
    args: argparse.Namespace,
    engine_scores: list[float] | None,
) -> dict[str, Any]:
    """The fair baseline on the same records (same model weights), then its `generate` bound; with the
    engine's scores of the same records, how far the baseline's are from them (same work: the same
    forced outputs; bf16 rounding differs)."""
    device = torch.device(args.device)
    models = {
        role: (
            transformers_model(runner.model, models_dir / role),
            getattr(scorer.models, f"{role}_tokenizer"),
        )
        for role, runner in _runners(scorer).items()
    }
    baseline = hf_batched.Baseline(
        models,
        load_spacy(**BASELINE_SPACY),
        scorer.matcher,
        scorer.features,
        batch_size=args.hf_batch,
        spacy_processes=args.baseline_spacy_processes,
        device=device,
    )
    if args.baseline_warmup:
        baseline.score(warm[: args.baseline_warmup], variant)
    cuda_sync()
    start = time.perf_counter()
    scores = baseline.score(records, variant)
    cuda_sync()
    seconds = time.perf_counter() - start
    bound = hf_batched.generate_bound(
        models, baseline.stages, baseline.feature_table, device, args.bound_batches
    )
    return {
        "captions_per_s": len(records) / seconds,
        "seconds": seconds,
        "warm_up_captions": min(len(warm), args.baseline_warmup),
        "batch_size": args.hf_batch,
        "spacy_processes": args.baseline_spacy_processes,
        "spacy_load": BASELINE_SPACY,
        "stage_seconds": dict(baseline.seconds),
        "rows_per_stage_after_dedup": {name: run.rows for name, run in baseline.stages.items()},
        "generate_bound_fraction": bound["all"]["fraction"],
        "generate_bound": bound,
        "mean_qace": float(np.mean(scores)),
        "max_abs_qace_diff_vs_engine": None
        if engine_scores is None
        else float(np.max(np.abs(np.asarray(scores) - np.asarray(engine_scores)))),
    }


def _steady(stamps: list[list[float]], end: float, chunk: int) -> dict[str, float]:
    """Rate after the first chunk: rows from the first stamp at or past ``chunk`` rows to the last row,
    over the time from that stamp to ``end``; NaN when the records fit one chunk."""
    total = stamps[-1][0]
    first = next((s for s in stamps if chunk <= s[0] < total), None)
    if first is None:
        return {"captions_per_s": float("nan"), "rows": 0, "seconds": 0.0}
    rows, seconds = total - first[0], end - first[1]
    return {"captions_per_s": rows / seconds, "rows": int(rows), "seconds": seconds, "from": first[1]}


def cli_section(variant: str, models_dir: Path, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``qace score`` end to end in a subprocess, then the same records in process (see module doc)."""
    from qace.data.features import pack_features

    records = pascal_workload(DATA, args.cli_captions, seed=args.seed)
    input_path = work / f"cli-{variant}.jsonl"
    write_jsonl(records, input_path)
    features = None
    if variant == "img":
        features = work / "features.h5"
        if not features.exists():
            store = RandomFeatureStore(seed=0)
            images = sorted({r.image_id for r in records})
            pack_features(((i, store.get(i)) for i in images), features, progress=False)
    output, stamps_path = work / f"cli-{variant}.parquet", work / f"stamps-{variant}.json"
    bertscore = models_dir / "bertscore"
    settings = {
        "batch-rows": args.batch_rows,
        "batch-tokens": args.batch_tokens,
        "chunk-size": args.chunk_size,
        "spacy-workers": args.spacy_workers,
    }
    command = [
        "score", str(input_path), "-o", str(output), "--resume", "--models", str(models_dir),
        "--variant", variant, "--device", args.device, "--precision", args.precision, "--no-progress",
        *(["--features", str(features)] if features else []),
        *(["--bertscore-model", str(bertscore)] if bertscore.is_dir() else []),
        *[x for k, v in settings.items() for x in (f"--{k}", str(v))],
    ]  # fmt: skip
    start = time.time()
    run = _forced_cli(stamps_path, command)
    wall = time.time() - start
    steady = _steady(run["stamps"], run["done"], args.chunk_size)
    # the same scorer from the same arguments on the same records, read into memory first, through
    # score_records in a process as fresh as the CLI's (so both pay the same first-use costs)
    alone = _forced_cli(work / f"stamps-{variant}-in-process.json", command, in_process=True)
    in_process = _steady(alone["stamps"], alone["stamps"][-1][1], args.chunk_size)
    output.unlink(missing_ok=True)
    return {
        "captions": len(records),
        "distinct_captions": distinct_captions(records),
        "command": "qace " + shlex.join(command),
        "wall_seconds": wall,
        "startup_seconds": steady.get("from", float("nan")) - run["started"],
        "captions_per_s": steady["captions_per_s"],
        "steady_rows": steady["rows"],
        "steady_seconds": steady["seconds"],
        "in_process_captions_per_s": in_process["captions_per_s"],
        "fraction_of_in_process": steady["captions_per_s"] / in_process["captions_per_s"],
        "method": f"rows after the first {args.chunk_size} over the time from then to the end "
        "(qace score: its return, output written; in process, a second fresh process running the same "
        "scorer on the records read into memory: the last row)",
        "breakdown": run["breakdown"],
        "in_process_breakdown": alone["breakdown"],
    }


def _forced_cli(stamps_path: Path, command: list[str], *, in_process: bool = False) -> dict[str, Any]:
    """Run `benchmarks.forced_cli` on ``command`` in a subprocess; its stamps."""
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    if in_process:
        env["QACE_BENCH_IN_PROCESS"] = "1"
    subprocess.run(
        [sys.executable, "-m", "benchmarks.forced_cli", str(stamps_path), "--", *command],
        check=True,
        cwd=root,
        env=env,
    )
    return json.loads(stamps_path.read_text())


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_variant(
    variant: str, records: list, warm: list, models_dir: Path, args: argparse.Namespace, work: Path,
    save: Any,
) -> None:  # fmt: skip
    """Run the requested sections of one variant; ``save(section, value)`` merges each into the report."""
    if not (args.skip_engine and args.skip_baseline):
        scorer = workload_scorer(models_dir, variant, device=args.device, precision=args.precision, args=args)
        if args.switch_interval is not None:
            sys.setswitchinterval(args.switch_interval)
        engine_scores = None
        if not args.skip_engine:
            result, engine_scores = engine_section(scorer, records, warm, args)
            save("engine", result)
        if not args.skip_baseline:
            save(
                "baseline", baseline_section(scorer, models_dir, variant, records, warm, args, engine_scores)
            )
        scorer.close()
        del scorer  # its decoders' graph pools and buffers, before the CLI's process needs the GPU
        _release_memory()
    if not args.skip_cli and args.workload == "distinct":
        save("cli", cli_section(variant, models_dir, args, work))


def merge(report: dict[str, Any], key: dict[str, str], section: str, value: dict[str, Any]) -> None:
    """Put ``value`` as ``section`` of the result entry matching ``key`` (made if missing), then redo the
    ratios that need two sections."""
    entry = next((e for e in report["results"] if all(e.get(k) == v for k, v in key.items())), None)
    if entry is None:
        entry = dict(key)
        report["results"].append(entry)
    entry[section] = value
    engine, baseline = entry.get("engine"), entry.get("baseline")
    if engine and baseline:
        entry["speedup_vs_baseline"] = engine["captions_per_s"] / baseline["captions_per_s"]
    if engine and "cli" in entry:
        cli = entry["cli"]
        cli["fraction_of_engine_timed_passes"] = cli["captions_per_s"] / engine["captions_per_s"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", default=None, help="default: benchmarks/results/throughput_distinct_<gpu>.json"
    )
    parser.add_argument("--variant", default="both", choices=["img", "ref", "both"])
    parser.add_argument("--workload", default="distinct", choices=["distinct", "repeats"])
    parser.add_argument("--captions", type=int, default=None, help="distinct workload (default 20,000)")
    parser.add_argument("--warmup", type=int, default=None, help="other captions for the warm-up pass")
    parser.add_argument(
        "--capture",
        choices=["all", "lazy"],
        default="all",
        help="engine: capture every batch shape's CUDA graphs before the warm-up pass (all), or only "
        "the shapes the passes meet, when first met (lazy: shorter runs; a timed pass may capture)",
    )
    parser.add_argument("--passes", type=int, default=None, help="timed passes (default 3); median")
    parser.add_argument("--profile-captions", type=int, default=None, help="profiled pass (default 4,096)")
    parser.add_argument(
        "--busy-captions", type=int, default=None, help="pass profiled for the GPU's busy fraction (8,192)"
    )
    parser.add_argument("--hf-batch", type=int, default=2048)
    parser.add_argument("--bound-batches", type=int, default=4, help="batches per stage for the bound")
    parser.add_argument(
        "--baseline-warmup",
        type=int,
        default=None,
        help="warm-up captions for the baseline (default: all of --warmup's, as the engine)",
    )
    parser.add_argument("--baseline-spacy-processes", type=int, default=None, help="default: the cores")
    parser.add_argument("--cli-captions", type=int, default=None, help="qace score records (default 100,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default=None, help="inputs and outputs of the CLI section")
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="set sys.setswitchinterval after the scorer starts",
    )
    for section in ("engine", "baseline", "cli"):
        parser.add_argument(f"--skip-{section}", action="store_true")
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    engine_defaults(args)
    tiny = args.tiny
    args.captions = args.captions or (48 if tiny else 20_000)
    args.warmup = args.warmup if args.warmup is not None else (16 if tiny else args.chunk_size)
    args.passes = args.passes or (1 if tiny else 3)
    if args.profile_captions is None:
        args.profile_captions = 16 if tiny else 4096
    if args.busy_captions is None:
        args.busy_captions = 16 if tiny else 8192
    args.cli_captions = args.cli_captions or (64 if tiny else 100_000)
    args.baseline_spacy_processes = args.baseline_spacy_processes or len(os.sched_getaffinity(0))
    if args.workload == "distinct" and args.captions + args.warmup > PASCAL_DISTINCT:
        parser.error(
            f"--captions {args.captions} + --warmup {args.warmup} exceed PASCAL-50S's {PASCAL_DISTINCT} "
            "distinct captions (the warm-up must use other captions)"
        )
    if min(args.captions, args.passes, args.hf_batch, args.bound_batches, args.cli_captions) < 1:
        parser.error("--captions, --passes, --hf-batch, --bound-batches and --cli-captions must be positive")
    if args.baseline_warmup is None:
        args.baseline_warmup = args.warmup
    if args.baseline_warmup < 0:
        parser.error("--baseline-warmup must not be negative")
    if not DATA.is_dir():
        parser.error(f"shared data not found at {DATA}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pascal = pascal_workload(DATA, PASCAL_DISTINCT, seed=args.seed)
    if args.workload == "distinct":
        records, warm = pascal[: args.captions], pascal[args.captions : args.captions + args.warmup]
    else:  # Flickr8k-Expert's candidates; the warm-up uses PASCAL captions
        records, warm = flickr_workload(DATA)[: args.captions], pascal[: args.warmup]
    models_dir = workload_models(args, [*pascal, *flickr_workload(DATA)], "qace-throughput-", DATA)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="qace-throughput-work-"))
    work.mkdir(parents=True, exist_ok=True)

    gpu = gpu_name(args.device)
    out = Path(args.out or default_result("throughput_distinct", gpu))
    report = json.loads(out.read_text()) if out.is_file() else {"results": []}
    runs = report.setdefault("runs", [])
    meta = record("benchmarks.throughput", argv, device=args.device, packages=("transformers",))
    runs.append({**meta, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    report.update(
        {
            **meta,
            "precision": args.precision,
            "tiny": args.tiny,
            "settings": {
                "batch_rows": args.batch_rows,
                "batch_tokens": args.batch_tokens,
                "chunk_size": args.chunk_size,
                "spacy_workers": args.spacy_workers,
                "passes": args.passes,
                "warmup_captions": args.warmup,
                "capture": args.capture,
            },
            "models": "tiny random T5s (a smoke run: numbers mean nothing)"
            if args.tiny
            else "random T5-base QG/TQA, random T5-small Visual-T5, random features, forced seeded outputs "
            "(questions 8-16, answers 2-4 tokens)",
        }
    )
    key = "workload" if args.workload == "distinct" else "workload_with_repeats"
    report[key] = {
        "name": "PASCAL-50S distinct human captions, 5 other captions of the image as references"
        if args.workload == "distinct"
        else "Flickr8k-Expert candidates with 5 references (with repeats)",
        "captions": len(records),
        "distinct_captions": distinct_captions(records),
        "seed": args.seed,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    variants = ["img", "ref"] if args.variant == "both" else [args.variant]
    for variant in variants:

        def save(section: str, value: dict[str, Any], variant: str = variant) -> None:
            merge(report, {"workload": args.workload, "variant": variant}, section, value)
            out.write_text(json.dumps(report, indent=2) + "\n")
            print(f"{args.workload} {variant} {section}: {json.dumps(value)[:400]}", flush=True)

        run_variant(variant, records, warm, models_dir, args, work, save)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
