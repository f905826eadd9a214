"""``qace vqa-data`` throughput on distinct captions, against the release's one-caption-at-a-time loop.

    python -m benchmarks.vqa_data --out benchmarks/results/vqa_data_h100.json        # on a GPU
    python -m benchmarks.vqa_data --tiny --out /tmp/vqa-data-tiny.json                # CPU smoke run

Workload: ``--captions`` distinct PASCAL-50S captions (`benchmarks.workload.pascal_workload`), each with
its image id. Models: T5-base-shaped QG/TQA with random weights and the workload's forced outputs
(questions 8-16 tokens, answers 2-4: `benchmarks.workload`), so both systems do the same work.

- ``engine``: `qace.vqa.data.make_vqa_data` (reading, spaCy, QG and TQA on the engine, the unanswerable
  mix, Parquet parts and the joined output) after a warm-up run on ``--warmup`` other captions. Forced
  outputs never reproduce a candidate, so the paper's filter would keep nothing; this run keeps every
  question (``kept: all``), which writes more rows than a real run and does the same model work.
  ``triples_per_s`` counts those rows; ``questions_per_s`` the questions QG and TQA ran on, whatever a
  real filter keeps.
- ``baseline``: the release's demo loop (``qace_demo.ipynb``: per caption, one QG ``generate`` over its
  candidates, then one TQA ``generate`` over its questions) on ``--baseline-captions`` of the captions,
  with the same models, precision and forced outputs; spaCy parses them beforehand (not timed).

``paper_1m_triples_s``: the seconds each system would take for the paper's 1M triples at its measured
questions per second (one triple per question asked, the most a run can keep).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import run_info
from benchmarks.hf_batched import ForceTokens
from benchmarks.workload import (
    PASCAL_DISTINCT,
    add_engine_arguments,
    batch_tokens,
    engine_defaults,
    padded_target_tokens,
    pascal_workload,
    transformers_model,
    workload_models,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PAPER_TRIPLES = 1_000_000


def write_captions(records: list[Any], path: Path) -> Path:
    rows = [{"id": r.id, "image_id": r.image_id, "caption": r.caption} for r in records]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def engine_run(
    models: Any, extractor: Any, captions: Path, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One `make_vqa_data` run keeping every question; its wall time and counts."""
    from qace.engine.engine import BatchLimits
    from qace.vqa import qgqa
    from qace.vqa.data import DataSettings, make_vqa_data

    consistent = qgqa.CaptionQA.consistent
    qgqa.CaptionQA.consistent = property(lambda self: True)  # type: ignore[method-assign,assignment]
    try:
        start = time.perf_counter()
        summary = make_vqa_data(
            captions,
            out,
            models=models,
            fingerprints={},
            extractor=extractor,
            settings=DataSettings(chunk_size=args.chunk_size),
            limits=BatchLimits(args.batch_tokens, args.batch_rows),
            progress=False,
        )
        seconds = time.perf_counter() - start
    finally:
        qgqa.CaptionQA.consistent = consistent  # type: ignore[method-assign]
    return {
        "captions": summary.captions,
        "questions": summary.questions,
        "triples": summary.triples,
        "seconds": seconds,
        "captions_per_s": summary.captions / seconds,
        "questions_per_s": summary.questions / seconds,
        "triples_per_s": summary.triples / seconds,
        "kept": "all",
    }


@torch.inference_mode()
def _generate(model: Any, tokenizer: Any, prompts: list[str], role: str, device: str) -> list[str]:
    """One release-style ``generate`` call on ``prompts``, outputs forced as the engine's are."""
    from qace.metric.prompts import MAX_LENGTH

    enc = tokenizer(prompts, return_tensors="pt", padding=True, truncation=True)
    forced = padded_target_tokens(enc["input_ids"].numpy(), enc["attention_mask"].numpy(), role)
    out = model.generate(
        input_ids=enc["input_ids"].to(device),
        attention_mask=enc["attention_mask"].to(device),
        max_length=MAX_LENGTH,
        num_beams=1,
        do_sample=False,
        logits_processor=[ForceTokens(torch.from_numpy(forced).to(device))],
    )
    return tokenizer.batch_decode(out, skip_special_tokens=True)


def baseline_run(
    models: Any, models_dir: Path, extractor: Any, records: list[Any], device: str
) -> dict[str, Any]:
    """The release's loop over ``records``: per caption, QG on its candidates, then TQA on its questions
    (transformers' ``generate`` on the same weights, `benchmarks.workload.transformers_model`)."""
    from qace.metric.prompts import clean_question, qg_input, tqa_input

    candidates = extractor([r.caption for r in records])
    qg = transformers_model(models.qg.model, models_dir / "qg")
    tqa = transformers_model(models.tqa.model, models_dir / "tqa")
    questions = 0
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for record, cands in zip(records, candidates, strict=True):
        if not cands:
            continue
        asked = _generate(qg, models.qg_tokenizer, [qg_input(a, record.caption) for a in cands], "qg", device)
        asked = list(dict.fromkeys(clean_question(q) for q in asked))
        _generate(tqa, models.tqa_tokenizer, [tqa_input(q, record.caption) for q in asked], "tqa", device)
        questions += len(asked)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {
        "captions": len(records),
        "questions": questions,
        "seconds": seconds,
        "captions_per_s": len(records) / seconds,
        "questions_per_s": questions / seconds,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="default: benchmarks/results/vqa_data_<gpu>.json")
    parser.add_argument("--captions", type=int, default=None, help="distinct captions (default 40,000)")
    parser.add_argument("--warmup", type=int, default=None, help="other captions for the warm-up run")
    parser.add_argument("--baseline-captions", type=int, default=None, help="default 500")
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    engine_defaults(args)
    args.captions = args.captions or (32 if args.tiny else 40_000)
    args.warmup = args.warmup if args.warmup is not None else (8 if args.tiny else args.chunk_size)
    args.baseline_captions = args.baseline_captions or (8 if args.tiny else 500)
    if not DATA.is_dir():
        parser.error(f"shared data not found at {DATA}")
    if args.captions + args.warmup > PASCAL_DISTINCT:
        parser.error(f"--captions + --warmup exceed PASCAL-50S's {PASCAL_DISTINCT} distinct captions")
    return args


def main(argv: list[str] | None = None) -> int:
    from qace.config import QACEConfig
    from qace.engine import instrument
    from qace.metric.candidates import CandidateExtractor
    from qace.metric.runners import build_models

    args = parse_args(argv)
    pascal = pascal_workload(DATA, PASCAL_DISTINCT, seed=args.seed)  # all: the tokenizer knows every word
    records, warm = pascal[: args.captions], pascal[args.captions : args.captions + args.warmup]
    models_dir = workload_models(args, pascal, "qace-vqa-data-", DATA)
    config = QACEConfig(device=args.device, precision=args.precision)
    models, _, _ = build_models(config, models_dir=models_dir)
    for role in ("qg", "tqa"):
        instrument.attach(getattr(models, role), force_tokens=batch_tokens(role))
    extractor = CandidateExtractor(workers=args.spacy_workers)
    with tempfile.TemporaryDirectory(prefix="qace-vqa-data-") as tmp:
        work = Path(tmp)
        engine_run(models, extractor, write_captions(warm, work / "warm.jsonl"), work / "warm.parquet", args)
        captions = write_captions(records, work / "captions.jsonl")
        engine = engine_run(models, extractor, captions, work / "out.parquet", args)
    baseline = baseline_run(models, models_dir, extractor, records[: args.baseline_captions], args.device)
    extractor.close()
    for section in (engine, baseline):
        section["paper_1m_triples_s"] = PAPER_TRIPLES / section["questions_per_s"]
    report = {
        **run_info.record(
            "benchmarks.vqa_data", argv, device=args.device, packages=("transformers", "spacy")
        ),
        "settings": {
            "device": args.device,
            "precision": args.precision,
            "batch_rows": args.batch_rows,
            "batch_tokens": args.batch_tokens,
            "chunk_size": args.chunk_size,
            "spacy_workers": args.spacy_workers,
            "tiny": args.tiny,
        },
        "workload": {"captions": len(records), "warmup_captions": len(warm), "source": "PASCAL-50S distinct"},
        "engine": engine,
        "baseline": baseline,
        "speedup_questions_per_s": engine["questions_per_s"] / baseline["questions_per_s"],
    }
    out = Path(args.out or run_info.default_result("vqa_data", report["gpu"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=float) + "\n")
    print(json.dumps({k: report[k] for k in ("engine", "baseline", "speedup_questions_per_s")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
