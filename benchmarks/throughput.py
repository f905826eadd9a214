"""Throughput: reference vs batched Hugging Face ``generate`` vs the engine, same process, same workload.

    python -m benchmarks.throughput --out benchmarks/results/throughput.json [--variants img ref]

Workload: Flickr8k-Expert's 5,664 candidates with 5 references, T5-base-shaped QG/TQA and T5-small-shaped
Visual-T5 with random weights, random 36 x 2054 features per image, and the shared length control of
``benchmarks/workload.py``. The reference runs on a subset and is extrapolated (the JSON says so). The
engine's rate is the median of ``--passes`` timed passes over the workload (each pass is listed).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import hf_batched
from benchmarks.reference import ReferenceQACE
from benchmarks.workload import build_models, flickr_workload, workload_scorer
from qace import __version__
from qace.api import QACE
from qace.data.features import RandomFeatureStore
from qace.engine.profiling import StageTimer, cuda_sync
from qace.metric.candidates import load_spacy

PEAK_BF16 = {"H100": 989e12, "H200": 989e12}  # dense bf16 tensor-core peak, vendor datasheet (SXM)


def _linear_params(module: torch.nn.Module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


def _mfu(scorer: QACE, seconds_peak: float) -> dict[str, Any]:
    """Model FLOP utilisation of encoder and decoder (2 x linear-layer parameters per token; attention
    score/value products and the relative-bias adds are left out, so these are slight underestimates)."""
    out = {}
    for role in ("qg", "tqa", "vqa"):
        runner = getattr(scorer.models, role)
        if runner is None or not runner.stats["sequences"]:
            continue
        model, stats = runner.model, runner.stats
        enc_flops = 2 * _linear_params(model.encoder) * stats["encoder_tokens"]
        dec_flops = (
            2 * (_linear_params(model.decoder) + model.lm_head.weight.numel()) * runner.decoder.row_steps
        )
        out[role] = {
            "sequences": stats["sequences"],
            "encoder_tokens_padded": stats["encoder_tokens"],
            "decoder_positions": runner.decoder.row_steps,
            "encoder_seconds": stats["encoder_seconds"],
            "decoder_seconds": stats["decoder_seconds"],
            "encoder_tflops": enc_flops / max(stats["encoder_seconds"], 1e-9) / 1e12,
            "decoder_tflops": dec_flops / max(stats["decoder_seconds"], 1e-9) / 1e12,
            "encoder_mfu": enc_flops / max(stats["encoder_seconds"], 1e-9) / seconds_peak,
            "decoder_mfu": dec_flops / max(stats["decoder_seconds"], 1e-9) / seconds_peak,
        }
    return out


def run_variant(variant: str, records: list, models_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    result: dict[str, Any] = {"variant": variant, "captions": len(records)}
    # engine, bf16: a warm-up pass, then the timed passes (their median is the rate: one pass of the
    # 5,664 captions takes about two seconds, and single passes varied by up to 15% on one machine),
    # then a profiled pass for stage times and MFU; every timed pass parses its captions, as the
    # baselines do
    engine = workload_scorer(models_dir, variant, device=args.device, precision=args.precision, args=args)
    # the warm-up pass captures the CUDA graphs of every batch shape the workload makes (a long job
    # captures each once); spaCy is not cached, so the timed pass parses every caption again
    list(engine.score_records(records))
    torch.cuda.reset_peak_memory_stats() if device.type == "cuda" else None
    passes = []
    for _ in range(args.passes):
        cuda_sync()
        start = time.perf_counter()
        rows = list(engine.score_records(records))
        cuda_sync()
        passes.append(time.perf_counter() - start)
    seconds = float(np.median(passes))
    result["engine"] = {
        "seconds": seconds,
        "captions_per_s": len(records) / seconds,
        "pass_seconds": passes,
        "mean_qace": float(np.mean([r["qace"] for r in rows])),
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
    }
    for role in ("qg", "tqa", "vqa"):
        runner = getattr(engine.models, role)
        if runner is not None:
            runner.profile = True
            runner.stats = dict.fromkeys(runner.stats, 0)
            runner.decoder.row_steps = 0
    engine.timer = StageTimer(sync=cuda_sync)
    list(engine.score_records(records))
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in gpu), float("nan"))
    result["engine"]["stage_seconds_profiled"] = dict(engine.timer.seconds)
    result["engine"]["mfu_vs_datasheet_bf16_peak"] = _mfu(engine, peak)

    # batched Hugging Face generate, bf16
    hf_models = {
        role: (getattr(engine.models, role).model, getattr(engine.models, f"{role}_tokenizer"))
        for role in ("qg", "tqa", "vqa")
        if getattr(engine.models, role) is not None
    }
    nlp = load_spacy()
    hf_batched.score(
        records[:256], variant, hf_models, nlp, engine.matcher, engine.features, args.hf_batch, device
    )
    cuda_sync()
    start = time.perf_counter()
    timings: dict[str, float] = {}
    hf_scores = hf_batched.score(
        records, variant, hf_models, nlp, engine.matcher, engine.features, args.hf_batch, device, timings
    )
    cuda_sync()
    seconds = time.perf_counter() - start
    result["hf_batched"] = {
        "seconds": seconds,
        "captions_per_s": len(records) / seconds,
        "batch_size": args.hf_batch,
        "mean_qace": float(np.mean(hf_scores)),
        **timings,
    }
    engine.candidates.close()
    del engine, hf_models

    # fp32: reference (per input generate) and engine on the same subset; exact parity expected
    subset = records[: args.reference_n]
    exact = workload_scorer(models_dir, variant, device=args.device, precision="fp32", args=args)
    exact.config = exact.config.with_(explain=True)
    ref = ReferenceQACE(
        qg=exact.models.qg.model,
        qg_tokenizer=exact.models.qg_tokenizer,
        tqa=exact.models.tqa.model,
        tqa_tokenizer=exact.models.tqa_tokenizer,
        nlp=nlp,
        bertscore=exact.matcher.score,
        vqa=exact.models.vqa.model if exact.models.vqa else None,
        vqa_tokenizer=exact.models.vqa_tokenizer,
        features=exact.features.get if exact.features else None,
        length_control=True,
    )
    ref.score_caption(subset[0].caption, **_context(subset[0], variant))
    ref.memo.clear()
    cuda_sync()
    start = time.perf_counter()
    expected = [ref.score_caption(r.caption, **_context(r, variant)) for r in subset]
    cuda_sync()
    seconds = time.perf_counter() - start
    got = list(exact.score_records(subset))
    same_questions = sum(
        [q["question"] for q in g["explanation"]["questions"]] == e["questions"]
        for g, e in zip(got, expected, strict=True)
    )
    max_diff = max(abs(g["qace"] - e["qace"]) for g, e in zip(got, expected, strict=True))
    result["reference"] = {
        "captions_measured": len(subset),
        "seconds": seconds,
        "captions_per_s": len(subset) / seconds,
        "extrapolated": True,
        "fp32_engine_same_questions": f"{same_questions}/{len(subset)}",
        "fp32_engine_max_abs_qace_diff": max_diff,
    }
    result["speedup_vs_reference"] = (
        result["engine"]["captions_per_s"] / result["reference"]["captions_per_s"]
    )
    result["speedup_vs_hf_batched"] = (
        result["engine"]["captions_per_s"] / result["hf_batched"]["captions_per_s"]
    )
    result["speedup_vs_paper_1s_per_caption"] = result["engine"]["captions_per_s"]
    return result


def precision_agreement(records: list, device: str, n: int, bertscore: str) -> dict[str, Any]:
    """bf16/fp16 against fp32 on the trained test models (random weights have no meaningful margins):
    share of identical answers and the mean absolute QACE difference, per variant."""
    from qace.models.testing import make_test_models

    models = make_test_models(Path(tempfile.gettempdir()) / "qace-test-models")
    out: dict[str, Any] = {"models": "qace test models (tiny, trained)", "captions": min(n, len(records))}
    for variant in ("img", "ref"):
        rows = {}
        for precision in ("fp32", "bf16", "fp16"):
            scorer = QACE(
                models=models,
                variant=variant,
                features=RandomFeatureStore(seed=0),
                device=device,
                precision=precision,
                explain=True,
                progress=False,
                bertscore_model=bertscore,
            )
            rows[precision] = list(scorer.score_records(records[:n]))

        def answers(row: dict[str, Any]) -> list[str]:
            return [
                a
                for q in row["explanation"]["questions"]
                for a in [q["answer_on_caption"], *q["answers_on_context"]]
            ]

        for precision in ("bf16", "fp16"):
            same = total = 0
            for a, b in zip(rows["fp32"], rows[precision], strict=True):
                x, y = answers(a), answers(b)
                total += max(len(x), len(y))
                same += sum(p == q for p, q in zip(x, y, strict=False))
            diffs = [abs(a["qace"] - b["qace"]) for a, b in zip(rows["fp32"], rows[precision], strict=True)]
            out[f"{variant}_{precision}"] = {
                "answers_identical": same / max(total, 1),
                "mean_abs_qace_diff": float(np.mean(diffs)),
                "max_abs_qace_diff": float(np.max(diffs)),
            }
    return out


def _context(record: Any, variant: str) -> dict[str, Any]:
    return {"references": record.references} if variant == "ref" else {"image_id": record.image_id}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/throughput.json")
    parser.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data")
    )
    parser.add_argument("--variants", nargs="+", default=["img", "ref"])
    parser.add_argument("--n", type=int, default=None, help="captions (default: all 5,664)")
    parser.add_argument("--reference-n", type=int, default=24)
    parser.add_argument("--hf-batch", type=int, default=2048)
    parser.add_argument("--batch-rows", type=int, default=2048)
    parser.add_argument("--batch-tokens", type=int, default=131072)
    parser.add_argument("--chunk-size", type=int, default=2048)
    parser.add_argument("--spacy-workers", type=int, default=8)
    parser.add_argument(
        "--passes", type=int, default=5, help="timed engine passes; the median pass gives the rate"
    )
    parser.add_argument(
        "--agreement-n", type=int, default=1000, help="captions for the bf16/fp16 agreement check"
    )
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--bertscore-files", default=None, help="MiniLM config/tokenizer files (random weights)"
    )
    parser.add_argument("--models-dir", default=None, help="reuse random models built earlier")
    args = parser.parse_args(argv)

    records = flickr_workload(Path(args.data_dir))[: args.n]
    models_dir = Path(args.models_dir or tempfile.mkdtemp(prefix="qace-bench-"))
    build_models(models_dir, records, args.bertscore_files)
    report: dict[str, Any] = {
        "command": "python -m benchmarks.throughput "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "precision": args.precision,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "qace": __version__,
        "workload": "Flickr8k-Expert standard protocol, random T5-base QG/TQA, "
        "random T5-small Visual-T5, random features, forced seeded outputs "
        "(questions 8-16, answers 2-4 tokens)",
        "results": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for variant in args.variants:  # the report is rewritten after each part, so a late failure loses nothing
        report["results"].append(run_variant(variant, records, models_dir, args))
        out.write_text(json.dumps(report, indent=2))
    report["host_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    report["precision_agreement"] = precision_agreement(
        records, args.device, args.agreement_n, str(models_dir / "bertscore")
    )
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
