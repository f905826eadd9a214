"""``qace models check [DIR]``: do the models here reproduce the authors' demo outputs?

The release's demo notebook (``qace_demo.ipynb``) prints what the real models give on one caption and
one image's region features (``butd_sample.npz``). This check runs the same example on the engine with
the models a user has, prints every expected and actual (question, answer) pair, and ends with a verdict
naming the likely cause of a mismatch. The notebook built its candidates with a Python ``set``, so pairs
are compared as sets. The `real_models` pytest marker runs the same check (`tests/vqa/test_check.py`).
"""

from __future__ import annotations

import argparse
import logging
import os
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from qace.errors import ConfigError, FeatureError

logger = logging.getLogger(__name__)

CAPTION = "Two men are riding horses on the ground"
"""The demo notebook's caption."""
TEXT_PAIRS = (
    ("What do the two men ride on the ground?", "horses"),
    ("How many men are riding horses on the ground?", "two"),
    ("Where are the horses?", "ground"),
)
"""The notebook's questions (QG on the caption's candidates) and text-QA answers on the caption."""
VISUAL_PAIRS = (
    ("What do the two men ride on the ground?", "horses"),
    ("How many men are riding horses on the ground?", "two"),
    ("Where are the horses?", "field"),
)
"""The notebook's Visual-T5 answers to the same questions on ``butd_sample.npz``."""
SAMPLE_FEATURES_URL = "https://raw.githubusercontent.com/hwanheelee1993/QACE/master/butd_sample.npz"
"""The demo image's region features in the authors' release."""
SAMPLE_FEATURES = Path("~/.cache/qace/butd_sample.npz")
"""Where the check looks for (and downloads) those features; ``--features`` overrides."""
RELEASE_VOCAB = 32100
"""Pieces of the T5 tokenizer every release model uses (t5-small's and t5-base's are the same)."""
RELEASE_UNANSWERABLE_ID = 73
"""The first piece of ``unanswerable`` in that tokenizer (spec section 5)."""

Pair = tuple[str, str]


@dataclass
class StageCheck:
    """Expected and actual (question, answer) pairs of one stage, compared as sets."""

    name: str
    expected: tuple[Pair, ...]
    actual: list[Pair]

    @property
    def ok(self) -> bool:
        return set(self.expected) == set(self.actual)

    def lines(self) -> list[str]:
        """The stage's report: every expected pair with what came back for its question, then any pair
        the models gave that the notebook did not."""
        got = dict(self.actual)
        out = [f"{self.name}: {'ok' if self.ok else 'MISMATCH'}"]
        for question, answer in self.expected:
            actual = got.get(question)
            mark = "ok" if actual == answer else "differs"
            shown = "(question not generated)" if actual is None else repr(actual)
            out.append(f"  {question!r}: expected {answer!r}, actual {shown}  [{mark}]")
        for question, answer in self.actual:
            if question not in dict(self.expected):
                out.append(f"  unexpected question {question!r} -> {answer!r}")
        return out


@dataclass
class CheckResult:
    """What `check_models` found, and what it makes of it."""

    stages: list[StageCheck]
    candidates: list[str]
    precision: str
    hints: list[str] = field(default_factory=list)
    """Tokenizer facts that differ from the release's, found whatever the outputs."""

    @property
    def ok(self) -> bool:
        return all(stage.ok for stage in self.stages)

    def causes(self) -> list[str]:
        """The likely causes of a mismatch, most specific first (empty when everything matches)."""
        if self.ok:
            return []
        causes = list(self.hints)
        by_name = {stage.name.split(" ")[0]: stage for stage in self.stages}
        text = by_name["QG+TQA"]
        expected_questions = {q for q, _ in text.expected}
        if not text.ok and {q for q, _ in text.actual} != expected_questions:
            causes.append(
                "wrong QG checkpoint or tokenizer (the release's is "
                "mrm8488/t5-base-finetuned-question-generation-ap), or another spaCy pipeline: "
                f"candidates found {self.candidates}"
            )
        elif not text.ok:
            causes.append("wrong TQA checkpoint or tokenizer (the release's is valhalla/t5-base-qa-qg-hl)")
        visual = by_name.get("Visual-T5")
        if visual is not None and not visual.ok:
            causes.append(
                "wrong Visual-T5 checkpoint or tokenizer (the release's ckpt.zip with t5-small's), or "
                "features other than the release's butd_sample.npz"
            )
        if self.precision != "fp32":
            causes.append(
                f"precision {self.precision} can change an answer: rerun with --precision fp32 to tell"
            )
        return causes

    def verdict(self) -> str:
        checked = ", ".join(stage.name for stage in self.stages)
        if self.ok:
            return f"verdict: MATCH: the models reproduce the authors' demo ({checked}, {self.precision})"
        return "verdict: MISMATCH; likely cause: " + "; ".join(self.causes())


def sample_features(path: str | Path | None) -> np.ndarray:
    """The demo image's (36, 2054) region features from ``path`` (a release ``.npz``), else from the cache,
    downloading the release's file there when missing and ``HF_HUB_OFFLINE`` is not set."""
    from qace.data.features import combine, read_npz, validate

    target = Path(path or SAMPLE_FEATURES).expanduser()
    if not target.is_file():
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}
        if path is not None or offline:
            why = "HF_HUB_OFFLINE is set, so it was not downloaded; " if path is None else ""
            raise FeatureError(
                f"no sample features at {target}: {why}download {SAMPLE_FEATURES_URL} and pass "
                "--features FILE"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        partial_file = target.with_suffix(".part")
        logger.info("downloading %s to %s", SAMPLE_FEATURES_URL, target)
        try:
            urllib.request.urlretrieve(SAMPLE_FEATURES_URL, partial_file)
        except OSError as exc:
            raise FeatureError(
                f"cannot download {SAMPLE_FEATURES_URL} ({exc}); fetch it by hand and pass --features FILE"
            ) from exc
        partial_file.replace(target)
    features, norm_bb = read_npz("butd_sample", target)
    return validate("butd_sample", combine("butd_sample", features, norm_bb, str(target)), str(target))


def tokenizer_hints(tokenizers: dict[str, Any]) -> list[str]:
    """Each model's tokenizer that is not the release's T5 one, said plainly."""
    from qace.metric.prompts import unanswerable_id

    hints = []
    for role, tokenizer in tokenizers.items():
        size, unanswerable = len(tokenizer), unanswerable_id(tokenizer)
        if size != RELEASE_VOCAB or unanswerable != RELEASE_UNANSWERABLE_ID:
            hints.append(
                f"wrong tokenizer for {role.upper()}: {size} pieces and 'unanswerable' at id "
                f"{unanswerable}, where the release's T5 tokenizer has {RELEASE_VOCAB} and "
                f"{RELEASE_UNANSWERABLE_ID}"
            )
    return hints


def check_models(
    *,
    models: str | Path | None = None,
    qg: str | None = None,
    tqa: str | None = None,
    vqa: str | None = None,
    features: str | Path | None = None,
    visual: bool = True,
    device: str = "cpu",
    precision: str = "fp32",
) -> CheckResult:
    """Run the demo example on the given models (defaults: the paper's, as `qace score` finds them)."""
    from qace.config import QACEConfig
    from qace.engine.engine import BatchLimits, run_stages, visual_stage
    from qace.metric.candidates import extract_candidates
    from qace.metric.prompts import MAX_NEW_TOKENS
    from qace.metric.runners import build_models
    from qace.metric.text import filter_stopwords_all
    from qace.models.visual_t5 import visual_question_inputs
    from qace.vqa.qgqa import caption_qa

    config = QACEConfig().with_(variant="img" if visual else "ref", device=device, precision=precision)
    regions = sample_features(features) if visual else None  # a missing file fails before models load
    runners, _, _ = build_models(config, models_dir=models, qg=qg, tqa=tqa, vqa=vqa)
    limits = BatchLimits()
    (candidates,) = extract_candidates([CAPTION])
    (asked,) = caption_qa([CAPTION], [candidates], runners, limits=limits)
    stages = [StageCheck("QG+TQA on the caption", TEXT_PAIRS, [(x.question, x.answer) for x in asked])]
    tokenizers = {"qg": runners.qg_tokenizer, "tqa": runners.tqa_tokenizer}
    if regions is not None:
        questions = [q for q, _ in VISUAL_PAIRS]  # the notebook's questions, whatever QG gave here
        stage = visual_stage(
            runners.vqa,
            runners.vqa_tokenizer,
            questions,
            ["butd_sample"] * len(questions),
            lambda _: regions,
            encode_questions=partial(visual_question_inputs, runners.vqa_tokenizer, compose=True),
            limits=limits,
            unanswerable_id=runners.vqa_unanswerable,
        )
        (answers,) = run_stages([stage], runners.device_lock, max_new_tokens=MAX_NEW_TOKENS)
        pairs = list(zip(questions, filter_stopwords_all(answers.texts), strict=True))
        stages.append(StageCheck("Visual-T5 on butd_sample.npz", VISUAL_PAIRS, pairs))
        tokenizers["vqa"] = runners.vqa_tokenizer
    return CheckResult(stages, candidates, precision, tokenizer_hints(tokenizers))


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``qace models check`` (`qace.cli` imports this module only when ``models`` runs)."""
    p = subparsers.add_parser("models", help="check the installed models against the authors' outputs")
    sub = p.add_subparsers(dest="models_command", required=True)
    c = sub.add_parser(
        "check",
        help="run the release's demo example on your models and say whether they reproduce it",
        description="Runs the caption and image of the authors' demo notebook through QG, TQA and "
        "Visual-T5, prints every expected and actual (question, answer) pair and a verdict; exits 1 on "
        "a mismatch, naming the likely cause.",
    )
    c.add_argument(
        "models", nargs="?", help="directory holding qg/, tqa/, vqa/ (default: the paper's models)"
    )
    c.add_argument("--qg", help="question-generation model (hub id or directory)")
    c.add_argument("--tqa", help="text-QA model (hub id or directory)")
    c.add_argument(
        "--vqa", help="Visual-T5 directory or release state-dict file (default: QACE_VQA or ~/.cache)"
    )
    c.add_argument(
        "--features",
        help=f"the demo image's butd_sample.npz (default {SAMPLE_FEATURES}, downloaded if missing)",
    )
    c.add_argument("--text-only", action="store_true", help="check QG and TQA only (no Visual-T5)")
    c.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    c.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="model precision")
    c.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    """Print the comparison and the verdict; 0 on a match, 1 on a mismatch."""
    from qace.checks import check_device

    check_device(args.device)
    if args.models and not Path(args.models).expanduser().is_dir():
        raise ConfigError(
            f"models directory {args.models} does not exist; pass a directory with qg/, tqa/, vqa/"
        )
    result = check_models(
        models=args.models,
        qg=args.qg,
        tqa=args.tqa,
        vqa=args.vqa,
        features=args.features,
        visual=not args.text_only,
        device=args.device,
        precision=args.precision,
    )
    print(report(result))
    return 0 if result.ok else 1


def report(result: CheckResult) -> str:
    """The printed report: the caption, each stage's pairs, then the one-line verdict."""
    lines: list[str] = [f"caption: {CAPTION!r}; answer candidates: {result.candidates}"]
    for stage in result.stages:
        lines += stage.lines()
    return "\n".join([*lines, result.verdict()])


def missing_real_models(features: Path = SAMPLE_FEATURES) -> list[str]:
    """Why the `real_models` check cannot run here: the paper's QG/TQA not in the Hugging Face cache, no
    Visual-T5 at its default place (or, for one without tokenizer files, no t5-small tokenizer cached), no
    sample features at ``features`` (empty when everything is present)."""
    from huggingface_hub import try_to_load_from_cache

    from qace.models.loading import TOKENIZER_FILES, VQA_BASE, default_sources

    def cached(hub_id: str) -> bool:
        return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)

    sources = default_sources()
    missing = [
        f"{sources[role]} is not in the Hugging Face cache (run `qace models check` online once)"
        for role in ("qg", "tqa")
        if not cached(sources[role])
    ]
    vqa = Path(sources["vqa"]).expanduser()
    if not vqa.exists():
        missing.append(f"no Visual-T5 at {vqa} (set QACE_VQA)")
    elif not any((vqa / name).is_file() for name in TOKENIZER_FILES) and not cached(VQA_BASE):
        missing.append(f"the Visual-T5 at {vqa} has no tokenizer and {VQA_BASE}'s is not cached")
    if not features.expanduser().is_file():
        missing.append(f"no sample features at {features} (download {SAMPLE_FEATURES_URL})")
    return missing
