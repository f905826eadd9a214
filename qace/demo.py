"""``qace demo``: score the bundled example with QACE-Ref and QACE-Img and show the results.

It uses the paper's models when they can be loaded (``--models DIR``, the Hugging Face cache, or the
hub with ``--download``).
Offline and without them it builds the tiny test models instead and says loudly that those scores
mean nothing, so the demo always shows the whole pipeline working.
"""

from __future__ import annotations

import json
import logging
import sys
from importlib import resources
from pathlib import Path

from qace.data.output import errors_path
from qace.errors import ModelNotFoundError
from qace.scorers import TEST_MODEL_WARNING, get, warn_if_test_models
from qace.testing.home import test_models_home

__all__ = ["example_path", "run_demo", "run_judge_demo", "test_models_home"]

log = logging.getLogger(__name__)


def example_path() -> Path:
    """The bundled example: 12 captions of 4 images, each with 5 references, some deliberately bad."""
    return Path(str(resources.files("qace").joinpath("examples/captions.jsonl")))


def run_demo(
    output_dir: Path,
    *,
    models: str | None = None,
    device: str = "cpu",
    download: bool = False,
    metric: str = "qace",
) -> int:
    """Score the example; without ``download``, the paper's models come only from a directory or cache.

    ``metric`` is ``qace`` (QACE-Ref and QACE-Img) or a registered metric with a demo (`qace.scorers`:
    ``visce2``, ``regen``), which scores the example's images (``qace/examples/images/``).
    """
    if metric != "qace":
        return run_judge_demo(output_dir, metric, device=device, download=download)
    import os

    from qace.api import QACE
    from qace.data.features import RandomFeatureStore
    from qace.testing.qace_models import make_test_models

    output_dir.mkdir(parents=True, exist_ok=True)
    features = RandomFeatureStore(seed=0)
    if not download:  # don't wait on network retries for models that are not cached
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        scorers = {
            v: QACE(models=models, variant=v, features=features, device=device, explain=True)
            for v in ("ref", "img")
        }
    except ModelNotFoundError as exc:
        if models is not None:
            raise
        log.warning("the paper's models are not available here (%s)", str(exc).splitlines()[0])
        test_dir = make_test_models(test_models_home())
        scorers = {
            v: QACE(models=test_dir, variant=v, features=features, device=device, explain=True)
            for v in ("ref", "img")
        }
        print(TEST_MODEL_WARNING, file=sys.stderr)
    print(
        "NOTE: QACE-Img uses deterministic RANDOM region features here (no image features ship with qace).",
        file=sys.stderr,
    )
    captions = _example_captions()
    for variant, scorer in scorers.items():
        out = output_dir / f"example.{variant}.jsonl"
        for stale in (out, errors_path(out)):
            stale.unlink(missing_ok=True)
        summary = scorer.score_file(example_path(), out)
        print(f"\n{scorer.signature}")
        print(f"{'id':6} {'qace':>7} {'f1':>7} {'bs':>7} {'an':>7}  n_q flags  caption")
        for line in out.open():
            row = json.loads(line)
            print(
                f"{row['id']:6} {row['qace']:7.3f} {row['qace_f1']:7.3f} {row['qace_bs']:7.3f} "
                f"{row['qace_an']:7.3f}  {row['n_questions']:3d} {','.join(row['flags']) or '-':5}  "
                f"{captions[row['id']][:60]}"
            )
        _print_errors(out)
        print(summary.line())
    print(f"\nfull results with per-question explanations: {output_dir}/")
    _write_reports([output_dir / f"example.{variant}.jsonl" for variant in scorers])
    return 0


def run_judge_demo(output_dir: Path, metric: str, *, device: str = "cpu", download: bool = False) -> int:
    """Score the example with a registered metric's demo scorer: its real models if loadable, else its
    test models (loudly)."""
    from qace.scoring import score_file

    entry = get(metric)
    output_dir.mkdir(parents=True, exist_ok=True)
    scorer = entry.build_demo(device=device, download=download)
    warn_if_test_models(scorer, entry)
    out = output_dir / f"example.{metric}.jsonl"
    for stale in (out, errors_path(out)):
        stale.unlink(missing_ok=True)
    summary = score_file(scorer, example_path(), out)
    key = scorer.score_key
    print(f"\n{scorer.signature}")
    captions = _example_captions()
    rows = [json.loads(line) for line in out.open()]
    extra = [k for k in (rows[0] if rows else {}) if k.startswith(f"{key}_") and _is_number(rows[0][k])]
    print(f"{'id':6} {key:>8} " + " ".join(f"{k:>16}" for k in extra) + "  caption")
    for row in rows:
        cells = " ".join(f"{'-' if row[k] is None else f'{row[k]:.3f}':>16}" for k in extra)
        print(f"{row['id']:6} {row[key]:8.3f} {cells}  {captions[row['id']][:60]}")
    _print_errors(out, limit=150)
    print(summary.line())
    print(f"\nfull results with explanations: {out}")
    _write_reports([out])
    return 0


def _write_reports(outputs: list[Path]) -> None:
    """Write each output's HTML report (`qace.report`) next to it and print where it is."""
    from qace.report.page import build_report

    for out in outputs:
        report = build_report([out], out.with_suffix(".html"), inputs=[example_path()])
        print(f"report (open in a browser): {report}")


def _example_captions() -> dict[str, str]:
    """Caption text of each example record, by id (the tables print it beside the scores)."""
    rows = (json.loads(line) for line in example_path().open())
    return {row["id"]: row["caption"] for row in rows}


def _print_errors(out: Path, limit: int | None = None) -> None:
    """The records of ``out``'s errors file, each with its reason (cut to ``limit`` characters)."""
    errors = errors_path(out)
    if errors.exists():
        for line in errors.open():
            err = json.loads(line)
            print(f"{err['id']:6} error: {err['reason'][:limit]}")


def _is_number(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))
