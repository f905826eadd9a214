"""ONNX Runtime (CUDA) against the PyTorch runner on the throughput workload, same process, same precision.

    python -m benchmarks.backends --models-dir DIR --out benchmarks/results/backends.json
    python -m benchmarks.backends --models-dir DIR --records distinct.jsonl   # another workload
    python -m benchmarks.backends --tiny --device cpu --precision fp32 --n 64  # smoke run on a CPU

Both backends score the same captions with the same models (random T5-base QG/TQA, T5-small Visual-T5, see
``benchmarks/workload.py``; tiny ones with ``--tiny``) in the same precision and with the same forced
outputs; the first ONNX use exports and validates the graphs (timed separately). The captions are the
Flickr8k-Expert standard protocol, or ``--records``: any file ``qace score`` reads (JSONL, CSV, COCO),
such as the distinct-caption workload of the throughput benchmark. Each backend first scores 256 captions
of the other data set (untimed warm-up), so the timed pass meets only captions it has not seen. On CUDA
each backend and variant runs in a process of its own (``--isolate``), so each has the whole device. Reported:
captions/s of each, their ratio and the mean absolute QACE difference, as JSON (``--out``), and how each
ONNX runner decoded (``onnx_decoding``: on CUDA the static-cache step replayed from CUDA graphs, with the
batch shapes captured and the decoder positions computed; on the CPU the growing-past loop).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.run_info import record
from benchmarks.workload import (
    device_speed_settings,
    flickr_workload,
    pascal_workload,
    workload_models,
    workload_scorer,
)
from qace.data.records import Record, read_records
from qace.engine.instrument import cuda_sync


def workload_records(args: argparse.Namespace) -> tuple[str, list[Record]]:
    """The captions to score (first ``--n``) and a name for them: ``--records`` or Flickr8k-Expert."""
    if args.records is None:
        return "flickr8k_expert standard protocol", flickr_workload(Path(args.data_dir))[: args.n]
    records = []
    for item in read_records(args.records, references=args.references):
        if not isinstance(item, Record):
            raise SystemExit(f"--records {args.records}: {item}; fix or drop that record")
        records.append(item)
    return str(args.records), records[: args.n]


def onnx_decoding(scorer: Any) -> dict[str, Any]:
    """Per model role, how its ONNX runner decoded: over the static cache (with the batch shapes captured
    as CUDA graphs and the decoder positions computed, warm-up included) or the growing-past loop."""
    found: dict[str, Any] = {}
    for role in ("qg", "tqa", "vqa"):
        runner = getattr(scorer.models, role, None)
        static = getattr(runner, "static", None)
        if runner is None:
            continue
        found[role] = {"static_cache": static is not None}
        if static is not None:
            found[role] |= {"captured_shapes": static.captured_shapes, "row_steps": static.row_steps}
    return found


def _device_used_gb() -> float | None:
    """GB in use on the whole device (so ONNX Runtime's arenas count too), None without CUDA."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return round((total - free) / 2**30, 2)


def measure(
    backend: str,
    variant: str,
    models: Path,
    records: list[Record],
    warm: list[Record],
    args: argparse.Namespace,
) -> tuple[dict[str, Any], np.ndarray, dict[str, Any] | None]:
    """One backend on one variant: setup (export included), the untimed warm-up, then the timed pass;
    returns its figures, its per-caption QACE and (ONNX) how each runner decoded."""
    chosen = device_speed_settings(args.device, backend, variant)  # its own batches unless given
    batch_rows = args.batch_rows or chosen["max_batch_rows"]
    batch_tokens = args.batch_tokens or chosen["max_batch_tokens"]
    start = time.perf_counter()
    scorer = workload_scorer(
        models,
        variant,
        device=args.device,
        precision=args.precision,
        args=argparse.Namespace(**{**vars(args), "batch_rows": batch_rows, "batch_tokens": batch_tokens}),
        backend=backend,
        candidate_cache=True,
    )
    setup = time.perf_counter() - start
    list(scorer.score_records(warm))
    cuda_sync()
    start = time.perf_counter()
    rows = list(scorer.score_records(records))
    cuda_sync()
    seconds = time.perf_counter() - start
    scores = np.array([r["qace"] for r in rows])
    result: dict[str, Any] = {
        "captions_per_s": len(records) / seconds,
        "seconds": seconds,
        "setup_seconds_incl_export": setup,
        "batch_rows": batch_rows,
        "batch_tokens": batch_tokens,
        "mean_qace": float(scores.mean()),
    }
    if (used := _device_used_gb()) is not None:
        result["device_used_gb_after"] = used
    decoding = onnx_decoding(scorer) if backend == "onnx" else None
    scorer.candidates.close()
    del scorer
    gc.collect()
    return result, scores, decoding


def _in_child(
    backend: str, variant: str, models: Path, args: argparse.Namespace, argv: list[str] | None
) -> tuple[dict[str, Any], np.ndarray | None, dict[str, Any] | None]:
    """`measure` in a fresh process (``--isolate``): each backend gets the whole device, since neither
    PyTorch's graph pools nor ONNX Runtime's arenas give all their memory back within a process."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        given = list(sys.argv[1:] if argv is None else argv)
        command = [sys.executable, "-m", "benchmarks.backends", *given, "--models-dir", str(models)]
        command += ["--child", f"{backend}:{variant}", str(out)]
        subprocess.run(command, check=True)
        child = json.loads(out.read_text())
    scores = None if child["scores"] is None else np.array(child["scores"])
    return child["result"], scores, child["decoding"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/backends.json")
    parser.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data")
    )
    parser.add_argument("--records", default=None, help="captions file (default: Flickr8k-Expert)")
    parser.add_argument("--references", default=None, help="references file for --records, if apart")
    parser.add_argument("--models-dir", default=None, help="reuse models built earlier (default: build)")
    parser.add_argument("--bertscore-files", default=None)
    parser.add_argument("--tiny", action="store_true", help="tiny random models: a smoke run on a CPU")
    parser.add_argument("--variants", nargs="+", default=["img", "ref"])
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-rows", type=int, default=None, help="default: each backend's")
    parser.add_argument("--batch-tokens", type=int, default=None, help="default: each backend's")
    parser.add_argument("--chunk-size", type=int, default=2048)
    parser.add_argument("--spacy-workers", type=int, default=8)
    parser.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="each backend and variant in a process of its own (default on CUDA)",
    )
    parser.add_argument("--child", nargs=2, metavar=("BACKEND:VARIANT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.isolate is None:
        args.isolate = args.device.startswith("cuda")
    workload, records = workload_records(args)
    # the tokenizer of the models knows the words of both data sets, as the throughput benchmark's does
    flickr = flickr_workload(Path(args.data_dir))
    models = workload_models(args, [*records, *flickr], "qace-backends-", Path(args.data_dir))
    # warm-up captions the timed pass never sees: the other data set's
    warm = flickr[:256] if args.records else pascal_workload(Path(args.data_dir), 256)
    if args.child:
        (backend, variant), out = args.child[0].split(":"), args.child[1]
        try:
            result, scores, decoding = measure(backend, variant, models, records, warm, args)
        except Exception as exc:  # reported in the parent's JSON (an out-of-memory, say), the run goes on
            failed = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1]}"}
            if (used := _device_used_gb()) is not None:
                failed["device_used_gb_at_error"] = used
            Path(out).write_text(json.dumps({"result": failed, "scores": None, "decoding": None}))
            return 0
        Path(out).write_text(json.dumps({"result": result, "scores": scores.tolist(), "decoding": decoding}))
        return 0
    report: dict[str, Any] = {
        # the versions that decide the numbers: torch (and its CUDA), onnxruntime and its providers
        **record("benchmarks.backends", argv, packages=("onnxruntime", "providers")),
        "device": args.device,
        "precision": args.precision,
        "workload": workload,
        "models": "tiny random" if args.tiny else "random T5-base QG/TQA, T5-small Visual-T5",
        "captions": len(records),
        "distinct_captions": len({r.caption for r in records}),
        "results": [],
    }
    for variant in args.variants:
        entry: dict[str, Any] = {"variant": variant}
        scores = {}
        for backend in ("torch", "onnx"):
            if args.isolate:
                result, scores[backend], decoding = _in_child(backend, variant, models, args, argv)
            else:
                result, scores[backend], decoding = measure(backend, variant, models, records, warm, args)
            entry[backend] = result
            if decoding is not None:
                entry["onnx_decoding"] = decoding
            print(f"{variant} {backend}: {result}", file=sys.stderr, flush=True)
        if all(scores[b] is not None for b in ("torch", "onnx")):  # a child that failed has no scores
            entry["onnx_vs_torch"] = entry["onnx"]["captions_per_s"] / entry["torch"]["captions_per_s"]
            entry["mean_abs_qace_diff"] = float(np.abs(scores["onnx"] - scores["torch"]).mean())
        report["results"].append(entry)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
