"""PASCAL-50S accuracy under variants of `qace meta`'s protocol, against the CLIPScore paper's Table 4.

The numbers of docs/meta.md's reproduction note ("PASCAL-50S: what reproduces the paper") come from

    python scripts/pascal50s_variants.py --out pascal50s_variants.json      # ~10 CPU-minutes, Java on PATH

Each variant changes one thing of the protocol `qace meta report` uses (5 of the image's 50 references
drawn per seed, seeds 0-4, pycocoevalcap with its PTB tokenizer, a metric tie counted 1/2): how ties are
broken, the tokenizer, which references can be drawn, or all 50 references. The vote-margin rows split
the protocol's own HC and MM credit by how decided the 10-11 human votes of a pair are. Prints a Markdown
table and writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from qace.meta.baselines import _coco_scores, _tokenize  # the scorers qace meta runs, minus the cache
from qace.meta.datasets import PASCAL_SEEDS, PairSet, load_pascal50s, spread
from qace.meta.evaluate import CATEGORIES, PairAccuracy, mean_accuracy, pair_accuracy
from qace.meta.published import PUBLISHED

Pools = Callable[[PairSet, int], list[list[str]]]


def _sampled(window: slice) -> Pools:
    """The protocol's draw (`PairSet.sample_references`) from ``references[window]`` of each image."""

    def pools(pairs: PairSet, seed: int) -> list[list[str]]:
        return replace(pairs, references=[refs[window] for refs in pairs.references]).sample_references(seed)

    return pools


def _simple_tokens(candidates: Sequence[str], references: Sequence[Sequence[str]]) -> tuple[dict, dict]:
    """Lowercase letter/digit runs instead of the PTB tokenizer."""

    def tok(text: str) -> str:
        return " ".join(re.findall(r"[a-z0-9]+", text.lower())) or "."

    return {i: [tok(r) for r in refs] for i, refs in enumerate(references)}, {
        i: [tok(c)] for i, c in enumerate(candidates)
    }


def _accuracy(pairs: PairSet, scores: np.ndarray, ties: str, rng: np.random.Generator) -> PairAccuracy:
    n = len(pairs)
    s1, s2 = scores[:n], scores[n:]
    if ties == "half":
        return pair_accuracy(pairs, s1, s2)
    order = np.sign(s1 - s2)
    tied = order == 0
    order[tied] = rng.choice([-1.0, 1.0], size=int(tied.sum()))
    return pair_accuracy(pairs, order, np.zeros(n))


def run_variant(
    pairs: PairSet,
    metrics: Sequence[str],
    seeds: Sequence[int],
    pools: Pools,
    tokens: Callable = _tokenize,
    ties: str = "half",
) -> dict[str, dict]:
    """Mean accuracy over ``seeds`` per metric, the share of tied pairs, and each seed's credit per pair."""
    runs: dict[str, list[PairAccuracy]] = {m: [] for m in metrics}
    tied: dict[str, list[float]] = {m: [] for m in metrics}
    rng = np.random.default_rng(0)
    n = len(pairs)
    for seed in seeds:
        refs = pools(pairs, seed)
        gts, res = tokens(pairs.cand1 + pairs.cand2, refs + refs)
        for m, v in _coco_scores(list(metrics), gts, res).items():
            runs[m].append(_accuracy(pairs, v, ties, rng))
            tied[m].append(float(np.mean(v[:n] == v[n:])))
    return {
        m: {**mean_accuracy(runs[m]).to_dict(), "tied_pairs": float(np.mean(tied[m])), "runs": runs[m]}
        for m in metrics
    }


def margin_rows(pairs: PairSet, protocol: dict[str, dict]) -> dict[str, dict]:
    """The protocol's HC and MM accuracy on pairs whose vote margin (of 10-11 votes) is close or decided."""
    margin = np.array([abs(int(v.sum())) for v in pairs.votes])
    cats = np.asarray(pairs.categories)
    out: dict[str, dict] = {}
    for label, lo, hi in (("margin 1-2", 1, 2), ("margin 3-8", 3, 8), ("margin 9-11", 9, 11)):
        row: dict[str, dict] = {}
        for m, entry in protocol.items():
            credit = np.nanmean(np.stack([r.credit for r in entry["runs"]]), axis=0)
            row[m] = {}
            for c in ("HC", "MM"):
                sel = (cats == c) & (margin >= lo) & (margin <= hi)
                row[m][c] = float(100 * credit[sel].mean()) if sel.any() else None
                row[m][f"{c}_pairs"] = int(sel.sum())
        out[label] = row
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=None, help="the shared data folder (default: qace meta's)")
    p.add_argument("--metrics", nargs="+", default=["bleu4", "rouge_l", "cider"])
    p.add_argument("--seeds", nargs="+", type=int, default=list(PASCAL_SEEDS))
    p.add_argument("--limit", type=int, default=None, help="only N pairs, spread evenly (a quick look)")
    p.add_argument("--out", type=Path, default=None, help="write the numbers as JSON here")
    args = p.parse_args(argv)
    pairs = load_pascal50s(args.data_dir)
    pairs = pairs.subset(spread(len(pairs), args.limit))
    every = slice(None)
    variants = {
        "qace meta (5 of 50, PTB, tie 1/2)": {"pools": _sampled(every)},
        "ties broken at random": {"pools": _sampled(every), "ties": "random"},
        "lowercase word tokens, no PTB": {"pools": _sampled(every), "tokens": _simple_tokens},
        "5 of the first 48 references": {"pools": _sampled(slice(0, 48))},
        "5 of the last 48 references": {"pools": _sampled(slice(2, None))},
        "all 50 references, no sampling": {"pools": lambda pairs, seed: pairs.references},
    }
    results = {}
    for name, kwargs in variants.items():
        seeds = args.seeds[:1] if name.startswith("all 50") else args.seeds
        results[name] = run_variant(pairs, args.metrics, seeds, **kwargs)
    margins = margin_rows(pairs, results["qace meta (5 of 50, PTB, tie 1/2)"])
    paper = {m: PUBLISHED["pascal50s"][m] for m in args.metrics if m in PUBLISHED["pascal50s"]}
    print("| variant | metric | " + " | ".join([*CATEGORIES, "mean"]) + " | tied pairs |")
    print("|---" * (len(CATEGORIES) + 4) + "|")
    for m, cells in paper.items():
        print(f"| CLIPScore paper, Table 4 | {m} | " + " | ".join(f"{cells[c]:.1f}" for c in cells) + " | |")
    for name, per_metric in results.items():
        for m, r in per_metric.items():
            values = " | ".join(f"{r[c]:.1f}" for c in [*CATEGORIES, "mean"])
            print(f"| {name} | {m} | {values} | {100 * r['tied_pairs']:.2f}% |")
    for label, per_metric in margins.items():
        for m, r in per_metric.items():
            print(f"| HC / MM at {label} ({r['HC_pairs']} / {r['MM_pairs']} pairs) | {m} | "
                  f"{r['HC']:.1f} | | | {r['MM']:.1f} | | |")  # fmt: skip
    record = {
        "paper": paper,
        "variants": {
            name: {m: {k: v for k, v in r.items() if k != "runs"} for m, r in per_metric.items()}
            for name, per_metric in results.items()
        },
        "vote_margins": margins,
        "pairs": len(pairs),
        "seeds": args.seeds,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()
