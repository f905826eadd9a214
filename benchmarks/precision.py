"""Half precision against fp32 on the same captions: how many questions and answers equal fp32's, and how
far QACE moves.

    python -m benchmarks.precision --out benchmarks/results/precision_h200.json                 # one GPU
    python -m benchmarks.precision --before /tmp/old@COMMIT --out ...   # an older tree beside, same inputs
    python -m benchmarks.precision --device cpu --captions 8 --precisions fp32 --out /tmp/p.json  # smoke

Random-weight models have no meaningful margins between tokens (the throughput workload forces their
outputs), so this scores with the test models (`qace.testing.qace_models`: tiny T5s trained on a synthetic
world, built if absent) ``--captions`` captions of that world, each with the next five as references
(QACE-Ref) and seeded random region features (QACE-Img). Per variant, the captions are scored once in fp32
and once in each of ``--precisions``, with explanations; against fp32:

- ``questions_identical``: the share of questions (by candidate, in order) whose text equals fp32's;
- ``answers_identical``: the share of answers (on the caption and on each reference or the image) equal;
- ``mean_abs_dqace`` / ``max_abs_dqace``: |QACE - fp32's QACE| over the captions.

A change to a half-precision kernel must keep these at least as good as before: ``--before DIR[@COMMIT]``
runs the same measurement on an older checkout (this file, its ``qace`` package imported from DIR) in a
subprocess, on the same inputs, and puts it under ``before``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REFERENCES = 5


def _captions(n: int) -> tuple[list[str], list[list[str]]]:
    from qace.testing.qace_models import world_captions

    pool = world_captions(n + REFERENCES, seed=3)
    return pool[:n], [pool[i + 1 : i + 1 + REFERENCES] for i in range(n)]


def _score(models: Path, variant: str, precision: str, device: str, n: int) -> list[dict[str, Any]]:
    from qace.api import QACE
    from qace.data.features import RandomFeatureStore

    captions, references = _captions(n)
    scorer = QACE(
        models=models,
        variant=variant,
        features=RandomFeatureStore(seed=0) if variant == "img" else None,
        device=device,
        precision=precision,
        explain=True,
        progress=False,
    )
    if variant == "img":
        return scorer.score(captions, image_ids=[f"img{i % 97}" for i in range(n)])
    return scorer.score(captions, references=references)


def _questions(row: dict[str, Any]) -> list[str]:
    return [q["question"] for q in row["explanation"]["questions"]]


def _answers(row: dict[str, Any]) -> list[str]:
    return [
        a for q in row["explanation"]["questions"] for a in [q["answer_on_caption"], *q["answers_on_context"]]
    ]


def _share_equal(rows: list[dict[str, Any]], base: list[dict[str, Any]], items: Any) -> float:
    same = total = 0
    for a, b in zip(rows, base, strict=True):
        x, y = items(a), items(b)
        total += max(len(x), len(y))
        same += sum(p == q for p, q in zip(x, y, strict=False))
    return same / max(total, 1)


def compare(rows: list[dict[str, Any]], base: list[dict[str, Any]]) -> dict[str, float]:
    """The module docstring's figures of ``rows`` against fp32's ``base``."""
    deltas = [abs(a["qace"] - b["qace"]) for a, b in zip(rows, base, strict=True)]
    return {
        "questions_identical": round(_share_equal(rows, base, _questions), 5),
        "answers_identical": round(_share_equal(rows, base, _answers), 5),
        "mean_abs_dqace": sum(deltas) / len(deltas),
        "max_abs_dqace": max(deltas),
    }


def measure(models: Path, variants: list[str], precisions: list[str], device: str, n: int) -> dict[str, Any]:
    """Per variant: fp32's question and answer counts, and each half precision against it."""
    out: dict[str, Any] = {}
    for variant in variants:
        base = _score(models, variant, "fp32", device, n)
        cell: dict[str, Any] = {
            "questions": sum(len(_questions(r)) for r in base),
            "answers": sum(len(_answers(r)) for r in base),
        }
        for precision in precisions:
            if precision != "fp32":
                cell[precision] = compare(_score(models, variant, precision, device, n), base)
        out[variant] = cell
    return out


def _before(tree: str, args: argparse.Namespace, models: Path) -> dict[str, Any]:
    """`measure` on another checkout, in a subprocess that imports its ``qace``."""
    path, _, commit = tree.partition("@")
    out = Path(tempfile.mkdtemp(prefix="qace-precision-")) / "before.json"
    argv = ["--measure-only", "--models", str(models.resolve()), "--out", str(out), "--device", args.device]
    argv += ["--captions", str(args.captions), "--variants", *args.variants, "--precisions", *args.precisions]
    # run as a file, not a module (the older tree may lack it), and not by path: that would put this
    # folder first on sys.path, where profile.py hides the standard library's
    code = "import runpy, sys; sys.argv = {!r}; runpy.run_path({!r}, run_name='__main__')"
    command = [sys.executable, "-c", code.format([__file__, *argv], __file__)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, cwd=path, env=env)
    return {"tree": path, "commit": commit or None, **json.loads(out.read_text())}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results/precision_<gpu>.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--captions", type=int, default=2000)
    parser.add_argument("--variants", nargs="+", default=["img", "ref"], choices=["img", "ref"])
    parser.add_argument("--precisions", nargs="+", default=["bf16", "fp16"])
    parser.add_argument("--models", type=Path, default=None, help="the test models (built if absent)")
    parser.add_argument("--before", metavar="DIR[@COMMIT]", default=None, help="an older checkout beside")
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.measure_only:  # `_before`'s subprocess: this tree's qace, no run record
        import qace

        result = measure(args.models, args.variants, args.precisions, args.device, args.captions)
        args.out.write_text(json.dumps({"qace_imported_from": str(Path(qace.__file__).parents[1]), **result}))
        return 0
    from benchmarks.run_info import record, write_result
    from qace.testing.qace_models import make_test_models

    cache = os.environ.get("QACE_TEST_MODELS") or Path(tempfile.gettempdir()) / "qace-test-models"
    models = args.models or make_test_models(cache)
    result: dict[str, Any] = {
        **record("benchmarks.precision", argv, device=args.device),
        "models": "qace test models (tiny T5s trained on a synthetic world)",
        "captions": args.captions,
        "references_per_caption": REFERENCES,
        "results": measure(models, args.variants, args.precisions, args.device, args.captions),
    }
    if args.before:
        result["before"] = _before(args.before, args, models)
    write_result(result, args.out, "precision", args.device)
    print(json.dumps(result["results"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
