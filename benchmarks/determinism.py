"""Determinism: the same captions scored again, by each design, in each precision; how many rows differ.

    python -m benchmarks.determinism --out benchmarks/results/determinism_<gpu>.json     # on a GPU host
    python -m benchmarks.determinism --tiny --out /tmp/determinism.json                 # smoke run, CPU

For each variant and precision, one list of distinct PASCAL-50S captions (default 2,048) is scored
``--passes`` times by the single-process design and as many times by the engine core with host
processes (started and ready before the first pass), every cache emptied before each pass, on the
workload's paper-shaped random models with forced output lengths (`benchmarks.workload`). Every pass is
compared with the first single-process pass: rows that differ in any field, and the largest |dQACE|.
Both designs cut the list alike (`qace.chunks.Tapered`, ``--chunk-size``), so a difference would come from
the device (kernels that are not run-to-run deterministic, or the engine core's interleaving of the host
processes' batches), not from how the input was cut.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.run_info import record

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _differences(rows: list[dict[str, Any]], first: list[dict[str, Any]]) -> dict[str, Any]:
    differing = sum(a != b for a, b in zip(rows, first, strict=True))
    delta = max(
        (abs(a["qace"] - b["qace"]) for a, b in zip(rows, first, strict=True) if "qace" in b), default=0.0
    )
    return {"rows_differing": differing, "max_abs_dqace": delta}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--captions", type=int, default=2048)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--chunk-size", type=int, default=256, help="small, so the list makes many chunks")
    parser.add_argument("--host-workers", type=int, default=4)
    parser.add_argument("--variants", nargs="+", default=["img", "ref"], choices=["img", "ref"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--models-dir", default=None, help="reuse models built earlier")
    parser.add_argument("--device", default=None, help="default: cuda if any")
    parser.add_argument("--tiny", action="store_true", help="tiny random models on the CPU: a smoke run")
    parser.add_argument("--data-dir", default=str(DATA))
    args = parser.parse_args(argv)

    import torch

    from benchmarks.workload import (
        build_models,
        build_tiny_models,
        pascal_workload,
        reset_caches,
        workload_scorer,
    )
    from qace.config import speed_defaults

    args.device = args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    records = pascal_workload(Path(args.data_dir), args.captions)
    models = Path(args.models_dir or tempfile.mkdtemp(prefix="qace-determinism-"))
    if args.tiny:  # a tiny tokenizer of the workload's own text
        build_tiny_models(models, pascal_workload(Path(args.data_dir), max(args.captions, 2048)))
    else:
        build_models(models, Path(args.data_dir))
    cells = []
    for variant in args.variants:
        for precision in args.precisions:
            defaults = speed_defaults(args.device, "torch", variant)
            settings = argparse.Namespace(
                batch_rows=defaults.get("max_batch_rows", 64),
                batch_tokens=defaults.get("max_batch_tokens", 4096),
                chunk_size=args.chunk_size,
                spacy_workers=defaults.get("spacy_workers", 0),
            )
            cell: dict[str, Any] = {"variant": variant, "precision": precision, "passes": {}}
            first: list[dict[str, Any]] | None = None
            for design, hosts in (("single_process", 0), ("engine_core", args.host_workers)):
                settings.host_workers = hosts
                scorer = workload_scorer(
                    models, variant, device=args.device, precision=precision, args=settings
                )
                try:
                    for _ in range(args.passes):
                        reset_caches(scorer)
                        rows = scorer.score_records(records)
                        kept = [dict(r) for r in rows]
                        first = first if first is not None else kept
                        cell["passes"].setdefault(design, []).append(_differences(kept, first))
                finally:
                    scorer.close()
            every = [p for passes in cell["passes"].values() for p in passes]
            cell["rows_differing_max"] = max(p["rows_differing"] for p in every)
            cell["max_abs_dqace"] = max(p["max_abs_dqace"] for p in every)
            print(json.dumps(cell), flush=True)
            cells.append(cell)
    result = {
        **record("benchmarks.determinism", argv, device=args.device),
        "device": args.device,
        "tiny": args.tiny,
        "workload": f"{len(records)} distinct PASCAL-50S captions, one list, chunk size {args.chunk_size}; "
        "paper-shaped random models, forced output lengths" + (" (tiny)" if args.tiny else ""),
        "compared_with": "the first single-process pass of the same variant and precision",
        "host_workers": args.host_workers,
        "cells": cells,
        "deterministic": all(c["rows_differing_max"] == 0 for c in cells),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
