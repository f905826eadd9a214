"""``qace models check [DIR]``: do the models here reproduce the authors' demo outputs?

The release's demo notebook (``qace_demo.ipynb``) prints what the real models give on one caption and
one image's region features (``butd_sample.npz``). This check runs the same example on the engine with
the models a user has, prints every expected and actual (question, answer) pair, and ends with a verdict
naming the likely cause of a mismatch. The notebook built its candidates with a Python ``set``, so pairs
are compared as sets. The `real_models` pytest marker runs the same check (`tests/vqa/test_check.py`).

Before any model loads, `missing_pieces` lists everything the check needs and cannot have here (the QG,
TQA and Visual-T5 checkpoints, t5-small's tokenizer for the release's Visual-T5, the sample features),
each with how to get it, all at once. It reads only local files and the Hugging Face cache; it asks the
network nothing with ``HF_HUB_OFFLINE`` set, and otherwise one ``HEAD`` per host, bounded in time, before
it counts on a download (the hub's own client would retry an unreachable host for half a minute).
Test models (`qace make-test-models`) are named as such, not taken for wrong checkpoints.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from qace.errors import ConfigError, FeatureError, ModelNotFoundError
from qace.models.sources import (
    DEFAULT_VQA,
    TOKENIZER_FILES,
    VQA_BASE,
    VQA_CHECKPOINT_URL,
    hub_cached,
    hub_endpoint,
    hub_offline,
    is_test_model,
    looks_like_hub_id,
    model_sources,
    reachable,
)

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
ROLES = ("qg", "tqa", "vqa")
"""The models the check runs, in its order (Visual-T5 only without ``--text-only``)."""
ROLE_NAMES = {"qg": "QG", "tqa": "TQA", "vqa": "Visual-T5"}
DOWNLOAD_TIMEOUT_S = 60.0
"""How long the sample features' download may wait for data before it fails."""

Pair = tuple[str, str]


@dataclass
class StageCheck:
    """Expected and actual (question, answer) pairs of one stage, compared as sets."""

    name: str
    expected: tuple[Pair, ...]
    actual: list[Pair]
    test_models: bool = False
    """A test model gave these pairs (random weights: a difference means nothing)."""

    @property
    def ok(self) -> bool:
        return set(self.expected) == set(self.actual)

    def lines(self) -> list[str]:
        """The stage's report: every expected pair with what came back for its question, then any pair
        the models gave that the notebook did not."""
        got = dict(self.actual)
        state = "ok" if self.ok else "test models (random outputs)" if self.test_models else "MISMATCH"
        out = [f"{self.name}: {state}"]
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
    test_models: tuple[str, ...] = ()
    """The checked roles (``qg``, ``tqa``, ``vqa``) whose model is a test model (`qace make-test-models`)."""

    @property
    def ok(self) -> bool:
        return all(stage.ok for stage in self.stages) and not self.test_models

    def causes(self) -> list[str]:
        """The likely causes of a mismatch, most specific first (empty when everything matches, and for
        test models, which `verdict` names instead)."""
        if self.ok or self.test_models:
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
        if self.test_models:
            checked_roles = ROLES if len(self.stages) > 1 else ROLES[:2]  # Visual-T5 has the second stage
            names = [ROLE_NAMES[role] for role in self.test_models]
            which = (
                "these are the test models"
                if set(self.test_models) == set(checked_roles)
                else f"{' and '.join(names)} {'is a test model' if len(names) == 1 else 'are test models'}"
            )
            return (
                f"verdict: TEST MODELS: {which} (`qace make-test-models`: random weights), so the outputs "
                "above mean nothing and cannot match the authors' demo; run the check on the paper's "
                "models (docs/visual_t5.md)"
            )
        if self.ok:
            return f"verdict: MATCH: the models reproduce the authors' demo ({checked}, {self.precision})"
        return "verdict: MISMATCH; likely cause: " + "; ".join(self.causes())


def sample_features(path: str | Path | None) -> np.ndarray:
    """The demo image's (36, 2054) region features from ``path`` (a release ``.npz``), else from the cache,
    downloading the release's file there when missing and ``HF_HUB_OFFLINE`` is not set."""
    from qace.data.features import combine, read_npz, validate

    target = Path(path or SAMPLE_FEATURES).expanduser()
    if not target.is_file():
        if path is not None or hub_offline():
            why = "HF_HUB_OFFLINE is set, so it was not downloaded; " if path is None else ""
            raise FeatureError(
                f"no sample features at {target}: {why}download {SAMPLE_FEATURES_URL} and pass "
                "--features FILE"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        partial_file = target.with_suffix(".part")
        logger.info("downloading %s to %s", SAMPLE_FEATURES_URL, target)
        try:
            with (
                urllib.request.urlopen(SAMPLE_FEATURES_URL, timeout=DOWNLOAD_TIMEOUT_S) as answer,
                partial_file.open("wb") as out,
            ):
                shutil.copyfileobj(answer, out)
        except OSError as exc:
            raise FeatureError(
                f"cannot download {SAMPLE_FEATURES_URL} ({exc}); fetch it by hand and pass --features FILE"
            ) from exc
        partial_file.replace(target)
    features, norm_bb = read_npz("butd_sample", target)
    return validate("butd_sample", combine("butd_sample", features, norm_bb, str(target)), str(target))


@dataclass(frozen=True)
class Missing:
    """A piece the check needs and cannot have here, why, and how to get it."""

    piece: str
    why: str
    fix: str

    def line(self) -> str:
        return f"{self.piece}: {self.why}; get it: {self.fix}"


@dataclass(frozen=True)
class _Download:
    """A piece that is not here but could be downloaded from ``url``'s host, if it answers."""

    url: str
    piece: str
    why: str
    fix: str


Probe = Callable[[Sequence[str]], dict[str, bool]]
"""`qace.models.sources.reachable`'s signature: which of some URLs answer."""


def missing_pieces(
    *,
    models: str | Path | None = None,
    qg: str | None = None,
    tqa: str | None = None,
    vqa: str | None = None,
    features: str | Path | None = None,
    visual: bool = True,
    probe: Probe = reachable,
) -> list[Missing]:
    """Every piece `check_models` needs and cannot have here, each with how to get it (empty when all are
    at hand or can be downloaded), found without loading a model: the QG and TQA checkpoints, and unless
    not ``visual`` the Visual-T5, t5-small's tokenizer for one that has none (the release's), and the
    sample features. Reads local files and the Hugging Face cache; a piece that is not there counts as
    downloadable only where ``HF_HUB_OFFLINE`` is not set and ``probe`` (default `reachable`: one ``HEAD``
    per host, all at once, bounded in time) finds its host answering."""
    roles = ROLES if visual else ROLES[:2]
    explicit = {"qg": qg, "tqa": tqa, "vqa": vqa}
    sources = model_sources(models, explicit, roles)
    pieces: list[Missing | _Download] = []
    for role in roles:
        given = f"--{role}" if explicit[role] else f"{models}/{role}" if models else None
        pieces += (_visual_t5 if role == "vqa" else _text_model)(role, sources[role], given)
    if visual and features is not None and not Path(features).expanduser().is_file():
        pieces.append(Missing("sample features", f"no file {features}", _FEATURES_FIX))
    elif visual and features is None and not SAMPLE_FEATURES.expanduser().is_file():
        pieces.append(_Download(SAMPLE_FEATURES_URL, "sample features", f"not at {SAMPLE_FEATURES}",
                                _FEATURES_FIX))  # fmt: skip
    urls = [x.url for x in pieces if isinstance(x, _Download)]
    offline = hub_offline()
    answering = probe(urls) if urls and not offline else {}
    missing = []
    for x in pieces:
        if isinstance(x, Missing):
            missing.append(x)
        elif not answering.get(x.url, False):
            cut = "HF_HUB_OFFLINE is set" if offline else f"{x.url.split('/')[2]} does not answer (offline?)"
            missing.append(Missing(x.piece, f"{x.why}, and {cut}", x.fix))
    return missing


_FEATURES_FIX = f"download {SAMPLE_FEATURES_URL} to {SAMPLE_FEATURES}, or anywhere and pass --features FILE"


def _text_model(role: str, source: str, given: str | None) -> list[Missing | _Download]:
    """What QG's or TQA's ``source`` lacks (``given``: the flag or folder that named it; None: the
    paper's hub id)."""
    name, flag = f"{ROLE_NAMES[role]} model {source}", f"--{role}"
    path = Path(source).expanduser()
    if path.is_dir():
        return []
    in_models_dir = given is not None and not given.startswith("--")  # --models is local only
    if path.exists() or in_models_dir or not looks_like_hub_id(source):
        why = "not a checkpoint directory" if path.exists() else "no such directory"
        fix = f"pass {flag} DIR, a checkpoint in Hugging Face layout, or leave it out for the paper's"
        return [Missing(name, why, fix)]
    if hub_cached(source):
        return []
    fix = f"`hf download {source}` while online (here, or elsewhere and copy ~/.cache/huggingface here)"
    fix += f", or pass {flag} DIR"
    return [_Download(hub_endpoint(), name, "not in the Hugging Face cache", fix)]


def _visual_t5(role: str, source: str, given: str | None) -> list[Missing | _Download]:
    """What the Visual-T5 at ``source`` lacks (``role`` is ``vqa``; ``given`` as for `_text_model`): the
    checkpoint itself, or, for one without a tokenizer (the release's, or a state-dict file), t5-small's."""
    path = Path(source).expanduser()
    if not path.exists():
        where = given or (
            "QACE_VQA" if os.environ.get("QACE_VQA") else "the default place; QACE_VQA is unset"
        )
        fix = (
            f"download the authors' checkpoint {VQA_CHECKPOINT_URL}, unzip it and point QACE_VQA (or --vqa) "
            "at the folder holding config.json and pytorch_model.bin, or put that folder at "
            f"{DEFAULT_VQA}; or train one with `qace vqa-train` (docs/visual_t5.md)"
        )
        return [Missing("Visual-T5", f"nothing at {path} ({where})", fix)]
    if path.is_dir() and any((path / name).is_file() for name in TOKENIZER_FILES):
        return []
    if hub_cached(VQA_BASE, tokenizer_only=True):
        return []
    why = f"the Visual-T5 at {path} has no tokenizer of its own (the release's has none); {VQA_BASE}'s is"
    why += " not in the Hugging Face cache"
    fix = f"`hf download {VQA_BASE}` while online (here, or elsewhere and copy ~/.cache/huggingface here)"
    return [_Download(hub_endpoint(), f"{VQA_BASE} tokenizer", why, fix)]


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
    """Run the demo example on the given models (defaults: the paper's, as `qace score` finds them).

    First `missing_pieces`: when any piece is missing, a `ModelNotFoundError` lists them all, each with
    how to get it, before any model loads."""
    missing = missing_pieces(models=models, qg=qg, tqa=tqa, vqa=vqa, features=features, visual=visual)
    if missing:
        raise ModelNotFoundError(
            f"the check needs {len(missing)} piece(s) this machine does not have:\n"
            + "\n".join(f"  - {x.line()}" for x in missing)
        )
    from qace.config import QACEConfig
    from qace.engine.engine import BatchLimits, run_stages, visual_stage
    from qace.metric.candidates import extract_candidates
    from qace.metric.prompts import MAX_NEW_TOKENS
    from qace.metric.runners import build_models
    from qace.metric.text import filter_stopwords_all
    from qace.models.visual_inputs import visual_question_inputs
    from qace.vqa.qgqa import caption_qa

    config = QACEConfig().with_(variant="img" if visual else "ref", device=device, precision=precision)
    regions = sample_features(features) if visual else None  # downloaded before the models load
    runners, _, _ = build_models(config, models_dir=models, qg=qg, tqa=tqa, vqa=vqa)
    sources = model_sources(models, {"qg": qg, "tqa": tqa, "vqa": vqa}, ROLES if visual else ROLES[:2])
    test_models = tuple(role for role, source in sources.items() if is_test_model(source))
    limits = BatchLimits()
    (candidates,) = extract_candidates([CAPTION])
    (asked,) = caption_qa([CAPTION], [candidates], runners, limits=limits)
    text_pairs = [(x.question, x.answer) for x in asked]
    stages = [
        StageCheck("QG+TQA on the caption", TEXT_PAIRS, text_pairs, bool({"qg", "tqa"} & set(test_models)))
    ]
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
        stages.append(StageCheck("Visual-T5 on butd_sample.npz", VISUAL_PAIRS, pairs, "vqa" in test_models))
        tokenizers["vqa"] = runners.vqa_tokenizer
    return CheckResult(stages, candidates, precision, tokenizer_hints(tokenizers), test_models)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``qace models check`` (`qace.cli` imports this module only when ``models`` runs)."""
    p = subparsers.add_parser("models", help="check the installed models against the authors' outputs")
    sub = p.add_subparsers(dest="models_command", required=True)
    c = sub.add_parser(
        "check",
        help="run the release's demo example on your models and say whether they reproduce it",
        description="Runs the caption and image of the authors' demo notebook through QG, TQA and "
        "Visual-T5, prints every expected and actual (question, answer) pair and a verdict; exits 1 on "
        "a mismatch, naming the likely cause, or on test models. Anything missing (a model, t5-small's "
        "tokenizer, the sample features) is listed at once, with how to get it, before any model loads "
        "(exit 2); with HF_HUB_OFFLINE=1 the network is not asked.",
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
        help=f"the demo image's butd_sample.npz (default {SAMPLE_FEATURES}, downloaded if missing and "
        "online)",
    )
    c.add_argument("--text-only", action="store_true", help="check QG and TQA only (no Visual-T5)")
    c.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    c.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="model precision")
    c.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    """Print the comparison and the verdict; 0 on a match, 1 on a mismatch or test models."""
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
