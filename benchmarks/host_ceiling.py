"""The engine's host ceiling: captions/s on distinct captions when every model answers at once, so that
every second measured is the host work of the path the GPU engine runs.

    python -m benchmarks.host_ceiling --variant img --out benchmarks/results/host_ceiling_cpu.json
    [--captions 4096] [--passes 3] [--models-dir DIR] [--call-sizes 64 256] [--calls 10]

What is replaced, and what runs as in a real pass:

- each model runner answers a batch with the outputs the GPU benchmark forces
  (`benchmarks.workload.padded_target_tokens`) without running its model; a QA model's answerability is
  a constant. Everything around the models runs: de-duplication, prompt ids, slicing, batch planning and
  padding, decoding, question cleaning, result rows;
- the tensors that live on the GPU there (the device feature cache's slab, BERTScore's inputs, token
  vectors and matching) live on PyTorch's ``meta`` device here: every operation on them is dispatched,
  as a GPU launch is, but computes nothing, so only the host's part of it is timed. Visual-T5's region
  features are read and stacked on the host as on a GPU (into ordinary instead of pinned memory);
  BERTScore's encoder returns its output's shape, and its matching builds its padded index arrays on the
  host but no similarities (each pair reads 0);
- spaCy is left out: every caption's candidates are parsed before the timed passes and kept, while every
  other cache the engine keeps across calls (prompt parts, device features) starts cold in each pass
  (`benchmarks.workload.reset_caches`).

Workload: the distinct PASCAL-50S captions (`benchmarks.workload.pascal_workload`), tiny models with the
workload's tokenizer, and the GPU speed defaults (chunks of 2,048 captions, batches of up to 2,048 rows
and 131,072 tokens), so the host does what it does beside a GPU. ``captions_per_s`` is the median pass.
No device can make the engine faster than this on the same host; the GPU host has more cores, so its
ceiling is measured there.

``calls``: the host work of single reward-sized calls (``--call-sizes``), what a reward call pays on top
of the parse and the device's work (`benchmarks.profile`'s chain floor). After the passes, with the
engine's caches emptied once as `benchmarks.latency` does before a cell, up to ``--calls`` calls of each
size score captions no earlier call of that size met (as many as the workload holds); p50 and min ms.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

from benchmarks.run_info import record
from benchmarks.throughput import DATA
from benchmarks.workload import (
    build_tiny_models,
    padded_target_tokens,
    pascal_workload,
    reset_caches,
    workload_scorer,
)
from qace.engine.batches import Generated, TextBatch, VisualBatch, cut_at_eos
from qace.engine.device_features import DeviceFeatureCache
from qace.kernels import bertscore

SETTINGS = {"batch_rows": 2048, "batch_tokens": 131072, "chunk_size": 2048, "spacy_workers": 0}
"""The GPU speed defaults (`qace.config.speed_defaults`); spaCy runs once, before the passes."""

META = torch.device("meta")


class InstantRunner:
    """A runner that answers every batch at once with the workload's forced outputs (module docstring)."""

    def __init__(self, role: str, eos_id: int) -> None:
        self.role, self.eos_id = role, eos_id
        self.features: DeviceFeatureCache | None = None

    def generate(
        self, batch: TextBatch | VisualBatch, *, max_new_tokens: int, unanswerable_id: int | None = None
    ) -> Generated:
        ids, mask = np.asarray(batch.input_ids), np.asarray(batch.attention_mask)
        tokens = padded_target_tokens(ids, mask, self.role, max_new_tokens, self.eos_id)
        answerability = np.full(len(tokens), 0.75) if unanswerable_id is not None else None
        return Generated(tokens=cut_at_eos(tokens, self.eos_id), answerability=answerability)

    def feature_rows(self, image_ids: Any, load: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The device feature cache of a GPU runner (the same capacity), its slab on ``meta``."""
        if self.features is None:
            self.features = DeviceFeatureCache(META, torch.bfloat16, 8192)
        return self.features.rows(image_ids, load)


def _match_on_meta(
    emb: torch.Tensor, weight: np.ndarray, offsets: np.ndarray, ci: Any, ri: Any
) -> np.ndarray:
    """BERTScore's matching as far as the host takes part: both sides' padded index arrays (on ``meta``)."""
    bertscore._pad(emb, weight, offsets, ci)
    bertscore._pad(emb, weight, offsets, ri)
    return np.zeros(len(ci))


def instant_scorer(models: Path, variant: str) -> Any:
    """The benchmarks' scorer (`workload_scorer`) with instant runners and BERTScore on ``meta`` (module
    docstring), batched as on a GPU."""
    args = argparse.Namespace(**SETTINGS)
    scorer = workload_scorer(models, variant, device="cpu", precision="fp32", args=args, candidate_cache=True)
    for role in ("qg", "tqa", "vqa"):
        runner = getattr(scorer.models, role)
        if runner is not None:
            setattr(scorer.models, role, InstantRunner(role, runner.decoder.eos_id))
    matcher = scorer.matcher
    width = int(matcher._encoder.config.hidden_size)
    matcher.device, matcher.batch_size = META, 4096  # `QACE`'s BERTScore batch on a GPU
    matcher._hidden = lambda ids, mask: torch.zeros(ids.shape[0], ids.shape[1], width, device=META)
    return scorer


@contextmanager
def matching_on_meta() -> Iterator[None]:
    """Inside, BERTScore matches as far as the host takes part (`_match_on_meta`): every pair reads 0."""
    with mock.patch.object(bertscore, "_greedy_f1", _match_on_meta):
        yield


def _reset_keeping_candidates(scorer: Any) -> None:
    """The engine's caches emptied (`reset_caches`) but the parsed candidates kept: spaCy is left out."""
    candidates = dict(scorer.candidates._cache)
    reset_caches(scorer)
    scorer.candidates._cache.update(candidates)


def measure(scorer: Any, records: list[Any], passes: int) -> dict[str, Any]:
    """Parse every caption once, then ``passes`` passes, each with the engine's caches cold but the
    candidates kept."""
    rates = []
    with matching_on_meta():
        list(scorer.score_records(records))  # parses the captions (kept) and imports what a pass needs
        for _ in range(passes):
            _reset_keeping_candidates(scorer)
            start = time.perf_counter()
            list(scorer.score_records(records))
            rates.append(len(records) / (time.perf_counter() - start))
    return {"captions_per_s": float(np.median(rates)), "passes_captions_per_s": rates}


def measure_calls(scorer: Any, records: list[Any], size: int, calls: int) -> dict[str, Any]:
    """Host milliseconds of single calls of ``size`` distinct captions (module docstring, ``calls``);
    the captions' candidates must be parsed already (`measure` keeps them)."""
    calls = min(calls, len(records) // size - 1)
    if calls < 1:
        raise SystemExit(f"--call-sizes {size} needs --captions of at least {2 * size}")
    times = []
    with matching_on_meta():
        _reset_keeping_candidates(scorer)
        list(scorer.score_records(records[:size]))  # as the latency cells' warm-up calls
        for c in range(1, calls + 1):
            start = time.perf_counter()
            list(scorer.score_records(records[c * size : (c + 1) * size]))
            times.append(1000 * (time.perf_counter() - start))
    return {"size": size, "calls": calls, "p50_ms": float(np.median(times)), "min_ms": min(times)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=["img", "ref"], action="append")
    parser.add_argument("--captions", type=int, default=4096)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--models-dir", default=None, help="tiny models built earlier (else built here)")
    parser.add_argument("--out", default="benchmarks/results/host_ceiling_cpu.json")
    parser.add_argument("--call-sizes", type=int, nargs="*", default=[64, 256], help="reward-sized calls")
    parser.add_argument("--calls", type=int, default=10, help="calls of each size (at most)")
    args = parser.parse_args(argv)
    records = pascal_workload(DATA, args.captions)
    models = Path(args.models_dir or tempfile.mkdtemp(prefix="qace-host-ceiling-"))
    build_tiny_models(models, records)
    results = []
    for variant in args.variant or ["img", "ref"]:
        scorer = instant_scorer(models, variant)
        result = measure(scorer, records, args.passes)
        result["calls"] = [measure_calls(scorer, records, size, args.calls) for size in args.call_sizes]
        results.append({"variant": variant, **result})
        print(f"{variant}: {result['captions_per_s']:.0f} captions/s (host ceiling)", flush=True)
        for call in result["calls"]:
            print(f"{variant}: calls of {call['size']}: host {call['p50_ms']:.1f} ms p50", flush=True)
    report = {
        **record(
            "benchmarks.host_ceiling", argv, device="cpu", packages=("transformers", "tokenizers", "numpy")
        ),
        "workload": {
            "name": "PASCAL-50S distinct human captions, 5 other captions of the image as references",
            "captions": len(records),
            "distinct_captions": len({r.caption for r in records}),
            "spacy": "left out: candidates parsed before the timed passes",
        },
        "settings": {**SETTINGS, "passes": args.passes, "call_sizes": args.call_sizes, "calls": args.calls},
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
