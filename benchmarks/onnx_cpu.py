"""ONNX Runtime vs PyTorch eager on CPU, side by side in one run, with agreement next to speed.

    python -m benchmarks.onnx_cpu --out benchmarks/results/onnx_cpu.json
    python -m benchmarks.onnx_cpu --tiny --n 4 --out /tmp/onnx_cpu.json      # smoke run, numbers mean nothing

Speed: T5-small-shaped random QG and TQA models (benchmarks.workload shapes), the first ``--n``
Flickr8k-Expert captions as QG prompts ("answer: <last word>  context: <caption> </s>") and TQA prompts,
planned into batches by the engine's scheduler; every backend gets the same benchmark-only length
control (``force_tokens``, `qace.engine.instrument`: seeded outputs, questions 8-16 tokens, answers
2-4). Rounds alternate the backends and the median round is reported. Agreement here is on random
weights (tiny logit margins), so it is a worst case.

Quality: the whole metric on the tiny *trained* test models (100 captions, QACE-Ref and QACE-Img),
ONNX fp32 / fp16 / int8 against PyTorch fp32: shares of identical questions and answers, score deltas.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.run_info import record
from benchmarks.workload import RANDOM_T5, T5_SMALL, TINY_T5, batch_tokens, flickr_workload
from qace.engine import instrument
from qace.engine.batches import TextBatch
from qace.engine.onnx_runner import OnnxRunner
from qace.engine.scheduler import pad_batch, plan_batches
from qace.export.cache import runner_for
from qace.families import torch_runner
from qace.metric.prompts import MAX_NEW_TOKENS

REPO = Path(__file__).resolve().parents[1]


def _random_t5(seed: int, shape: dict[str, int]) -> Any:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(**RANDOM_T5, **shape)
    return T5ForConditionalGeneration(config).eval()


def _batches(tokenizer: Any, prompts: list[str], rows: int, tokens: int) -> list[TextBatch]:
    ids = tokenizer(prompts)["input_ids"]
    plan = plan_batches([len(x) for x in ids], tokens, rows)
    return [TextBatch(*pad_batch([ids[i] for i in index], 0)) for index in plan]


def _run(runner: Any, batches: list[TextBatch], role: str) -> tuple[float, list[list[int]]]:
    instrument.attach(runner, force_tokens=batch_tokens(role))
    start = time.perf_counter()
    tokens = [t for b in batches for t in runner.generate(b, max_new_tokens=MAX_NEW_TOKENS).tokens]
    return time.perf_counter() - start, tokens


def speed(args: argparse.Namespace, tokenizer: Any, work: Path) -> list[dict[str, Any]]:
    from qace.export.exporter import export_model

    records = flickr_workload(Path(args.data_dir))[: args.n]
    prompts = {
        "qg": [f"answer: {r.caption.split()[-1]}  context: {r.caption} </s>" for r in records],
        "tqa": [f"question: what is in the picture ?  context: {r.references[0]} </s>" for r in records],
    }
    results = []
    for seed, role in enumerate(("qg", "tqa")):
        model = _random_t5(seed, TINY_T5 if args.tiny else T5_SMALL)
        batches = _batches(tokenizer, prompts[role], args.batch_rows, args.batch_tokens)
        runners: dict[str, Any] = {"torch_eager_fp32": torch_runner(model)}
        exports = {}
        for variant in ("fp32", "int8"):
            result = export_model(model, work / role / variant, variant=variant, validate=False)
            exports[variant] = {
                "validation": result.validation.__dict__,
                "export_seconds": round(result.seconds, 1),
            }
            runners[f"onnx_{variant}"] = OnnxRunner(result.out_dir, threads=args.threads)
        times: dict[str, list[float]] = {name: [] for name in runners}
        tokens: dict[str, list[list[int]]] = {}
        for name, runner in runners.items():  # warm-up round (allocations, ORT arena)
            _, tokens[name] = _run(runner, batches, role)
        for _ in range(args.rounds):
            for name, runner in runners.items():
                times[name].append(_run(runner, batches, role)[0])
        base = statistics.median(times["torch_eager_fp32"])
        rows = sum(len(b.input_ids) for b in batches)
        entry: dict[str, Any] = {
            "role": role,
            "model": f"{'tiny' if args.tiny else 'T5-small'} shape, random weights",
            "rows": rows,
            "batches": len(batches),
            "exports": exports,
            "backends": {},
        }
        for name, values in times.items():
            median = statistics.median(values)
            same = [a == b for a, b in zip(tokens[name], tokens["torch_eager_fp32"], strict=True)]
            entry["backends"][name] = {
                "seconds_median": round(median, 3),
                "seconds_all": [round(v, 3) for v in values],
                "rows_per_second": round(rows / median, 1),
                "speedup_vs_torch": round(base / median, 2),
                "identical_outputs_vs_torch": round(float(np.mean(same)), 4),
            }
        results.append(entry)
        print(json.dumps(entry, indent=1), file=sys.stderr)
    return results


def quality(args: argparse.Namespace, models_dir: Path) -> list[dict[str, Any]]:
    from qace.api import QACE
    from qace.data.features import RandomFeatureStore
    from tests.helpers import flickr_records

    out = []
    for variant, refs in (("ref", 5), ("img", 1)):
        records = flickr_records(args.quality_n, refs=refs)
        extra = {"features": RandomFeatureStore(seed=0)} if variant == "img" else {}
        scorer = QACE(models=models_dir, variant=variant, explain=True, progress=False, **extra)
        torch_models = {role: getattr(scorer.models, role) for role in ("qg", "tqa", "vqa")}
        expected = list(scorer.score_records(records))
        for precision in ("fp32", "fp16", "int8"):
            for role, runner in torch_models.items():
                if runner is not None:
                    source = str(models_dir / role)
                    setattr(scorer.models, role, runner_for(runner.model, source, precision=precision))
            rows = list(scorer.score_records(records))
            q_same, a_same, deltas = [], [], []
            for row, exp in zip(rows, expected, strict=True):
                got_q, exp_q = row["explanation"]["questions"], exp["explanation"]["questions"]
                q_same.append([q["question"] for q in got_q] == [q["question"] for q in exp_q])
                if q_same[-1]:
                    a_same += [
                        (a["answer_on_caption"], a["answers_on_context"])
                        == (b["answer_on_caption"], b["answers_on_context"])
                        for a, b in zip(got_q, exp_q, strict=True)
                    ]
                deltas.append(abs(row["qace"] - exp["qace"]))
            out.append(
                {
                    "variant": variant,
                    "precision": precision,
                    "captions": len(rows),
                    "identical_questions_per_caption": round(float(np.mean(q_same)), 4),
                    "identical_answers_per_question": round(float(np.mean(a_same)), 4) if a_same else None,
                    "mean_abs_delta_qace": float(np.mean(deltas)),
                    "max_abs_delta_qace": float(np.max(deltas)),
                }
            )
            print(json.dumps(out[-1]), file=sys.stderr)
        for role, runner in torch_models.items():
            setattr(scorer.models, role, runner)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="benchmarks/results/onnx_cpu.json")
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--n", type=int, default=512, help="prompts per role in the speed run")
    parser.add_argument("--quality-n", type=int, default=100, help="captions in the quality run")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads for both backends")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-rows", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="tiny random T5s in the speed part (a smoke run: numbers mean nothing)",
    )
    parser.add_argument("--test-models", default=str(REPO / ".qace-cache" / "test-models"))
    args = parser.parse_args(argv)

    from qace.models.loading import load_seq2seq
    from qace.testing.qace_models import make_test_models

    torch.set_num_threads(args.threads)
    models_dir = make_test_models(args.test_models)
    tokenizer = load_seq2seq(str(models_dir / "qg"), role="qg")[1]
    with tempfile.TemporaryDirectory(prefix="qace-onnx-bench-") as work:
        speed_results = speed(args, tokenizer, Path(work))
    torch.set_num_threads(1)  # the tiny test models run fastest on one thread
    report = {
        **record("benchmarks.onnx_cpu", argv, device="cpu", packages=("onnxruntime",)),
        "threads": args.threads,
        "tiny": args.tiny,
        "note": "2-core machine shared with other jobs: timings are noisy",
        "speed": speed_results,
        "quality": quality(args, models_dir),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
