"""The scorer registry: every metric (QACE-Ref, QACE-Img, VisCE², the regeneration score, and any metric
added later) is one `ScorerEntry`, and every entry point reads it: ``qace score --metric`` (one process,
``--gpus`` shards), ``qace score-ray``, ``qace serve``, ``qace demo`` and ``qace meta report``.

An entry names its code as ``"module:attr"`` strings and imports them only when used, so importing
this module imports no torch and no judge. A scorer is anything with the `Scorer` protocol;
`qace.scoring.FileScorer` gives it the file loop. Adding a metric is one module (the scorer, its
options and settings) and one `register` call.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from qace.errors import BackendUnavailableError, ConfigError
from qace.extras import require_extra

if TYPE_CHECKING:
    from qace.data.records import Record, RecordError

log = logging.getLogger(__name__)


class Scorer(Protocol):
    """What `qace.scoring.score_file` / ``write_results`` and the reward service need of a scorer."""

    signature: str
    """Everything that changes its numbers (`qace.signature.Signature`); every row carries it."""
    score_key: str
    """Its main score column."""
    uses_test_models: bool
    """True when it runs on qace's tiny test models (its scores mean nothing)."""

    @property
    def chunk_size(self) -> int:
        """Captions per committed output chunk."""
        ...

    @property
    def progress(self) -> bool:
        """Whether file runs show progress."""
        ...

    def score_records(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        """One row (with ``id``, ``score_key``, ``flags``, ``signature``) or `RecordError` per record, in
        order; a list of records in, one result each out: the list API the reward service uses."""
        ...

    def score_committed(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        """`score_records` with chunks cut where the file writer commits (resumed runs score alike)."""
        ...


@dataclass(frozen=True)
class ScorerEntry:
    """One metric: its name on the command line, where its code is, what it reads and writes."""

    name: str
    """Its ``--metric`` name."""
    factory: str
    """``module:attr`` building the scorer, called as ``f(device=..., **settings)``; importable in a fresh
    process (``--gpus`` workers and Ray actors build from it)."""
    settings: str
    """``module:attr``: ``f(args) -> dict``, the factory's keyword arguments but ``device`` from parsed
    command-line arguments; raises `ConfigError` on arguments that cannot work, before any model loads."""
    score_key: str
    """Its main score column (the summary's mean, the default reward)."""
    columns: tuple[str, ...]
    """Its numeric output columns, the score first: reward components, Ray output columns."""
    parts: tuple[str, ...]
    """The columns its score is made of, or that qualify it: shown beside it (``qace report``) and
    logged beside a reward (OpenRLHF's ``extra_logs``)."""
    signature: str
    """The metric name heading its signatures (VisCE²'s ablations add a suffix)."""
    options: str | None = None
    """``module:attr``: ``f(parser)`` adds its own options (entries naming one function share them)."""
    reads: str | None = None
    """The record field a caption is scored against: ``references``, ``image_id`` (region features) or
    ``image`` (the image file); None for the caption alone."""
    extra: str = ""
    """The ``qace[extra]`` that installs what it needs (empty: the core install)."""
    needs: tuple[str, ...] = ()
    """Top-level modules of that extra it runs with, checked before anything loads."""
    demo: str | None = None
    """``module:attr``: ``f(device=..., download=...)``, the scorer ``qace demo --metric`` runs: real
    models when loadable, else test models (``uses_test_models`` says which)."""
    hint: str | None = None
    """How to score with real models, printed under the test-model warning (None: QACE's warning)."""
    preset: tuple[tuple[str, Any], ...] = ()
    """Settings the name fixes (``qace-img``: ``variant="img"``); explicit settings override them."""
    cpu_pool: str | None = None
    """The setting that sizes its CPU worker processes (QACE: ``spacy_workers``): ``--gpus`` shards share
    the host's cores through it, Ray actors set it to 0 (Ray reserves their CPUs)."""
    reward: str | None = None
    """``module:attr`` building its RL reward as ``f(device=..., invalid_reward=..., [component=...],
    **settings)``; None: `qace.reward.ScorerReward` around the scorer."""
    help: str = ""
    """One line for ``--help``."""

    def require(self) -> None:
        """`BackendUnavailableError` with the install line when its extra's modules are missing."""
        require_extra(self.extra, self.needs, f"--metric {self.name}")

    def load(self, path: str) -> Callable[..., Any]:
        """The callable ``path`` (one of this entry's ``module:attr``) names; a module that cannot be
        imported is a `BackendUnavailableError` naming it and the extra that installs it."""
        module = path.partition(":")[0]
        try:
            importlib.import_module(module)
        except ImportError as exc:
            extra = self.extra
            install = f"; install the {extra} extra: pip install 'qace[{extra}]'" if extra else ""
            raise BackendUnavailableError(
                f"--metric {self.name} needs {module}, which cannot be imported here ({exc}){install}"
            ) from exc
        return load_callable(path, f"--metric {self.name}")

    def settings_from(self, args: argparse.Namespace) -> dict[str, Any]:
        """The factory's keyword arguments (all but ``device``) from parsed command-line arguments."""
        return self._preset(self.load(self.settings)(args))

    def build(self, device: str = "cpu", **settings: Any) -> Scorer:
        """The scorer on ``device`` (its extra checked first)."""
        self.require()
        return self.load(self.factory)(device=device, **self._preset(settings))

    def build_demo(self, *, device: str = "cpu", download: bool = False) -> Scorer:
        """The scorer ``qace demo --metric`` runs; `ConfigError` for an entry without a demo."""
        if self.demo is None:
            raise ConfigError(f"--metric {self.name} has no demo; choose from {sorted(demo_names())}")
        self.require()
        return self.load(self.demo)(device=device, download=download)

    def build_reward(
        self,
        device: str = "cpu",
        *,
        invalid_reward: float = 0.0,
        component: str | None = None,
        **settings: Any,
    ) -> Any:
        """Its RL reward (`qace.reward`): ``component`` picks the column (default: the score)."""
        chosen = {} if component is None else {"component": component}
        if self.reward is None:
            reward = load_callable("qace.reward:ScorerReward", "the reward")
            scorer = self.build(device, **settings)
            described = {"reads": self.reads, "columns": self.columns, "parts": self.parts}
            return reward(scorer, invalid_reward=invalid_reward, **described, **chosen)
        self.require()
        build = self.load(self.reward)
        return build(device=device, invalid_reward=invalid_reward, **chosen, **self._preset(settings))

    def _preset(self, settings: dict[str, Any]) -> dict[str, Any]:
        """``settings`` over the ones the name fixes."""
        return {**dict(self.preset), **settings}


_ENTRIES: dict[str, ScorerEntry] = {}


def register(entry: ScorerEntry, *, replace: bool = False) -> ScorerEntry:
    """Add ``entry`` (``replace`` an entry of the same name); every entry point offers it from then on."""
    if entry.name in _ENTRIES and not replace:
        raise ConfigError(f"a scorer named {entry.name!r} is already registered; pass replace=True")
    if entry.score_key not in entry.columns[:1]:
        raise ConfigError(f"{entry.name}: columns must start with the score key {entry.score_key!r}")
    _ENTRIES[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove the entry ``name`` (tests that registered one)."""
    _ENTRIES.pop(name, None)


def get(name: str) -> ScorerEntry:
    """The entry ``name``; `ConfigError` listing the registered names when there is none."""
    try:
        return _ENTRIES[name]
    except KeyError:
        raise ConfigError(f"unknown metric {name!r}; choose from {', '.join(names())}") from None


def names() -> list[str]:
    """Registered ``--metric`` names, in registration order."""
    return list(_ENTRIES)


def demo_names() -> list[str]:
    """Names of the entries with a demo."""
    return [name for name, entry in _ENTRIES.items() if entry.demo is not None]


def add_options(parser: argparse.ArgumentParser) -> None:
    """Add every entry's own options (each options function once); an entry whose module cannot be
    imported here (its extra is missing) adds none and says so when it is chosen."""
    for path in dict.fromkeys(e.options for e in _ENTRIES.values() if e.options is not None):
        try:
            load_callable(path, "scorer options")(parser)
        except (ImportError, ConfigError) as exc:
            log.debug("options of %s unavailable: %s", path, exc)


def load_callable(path: str, what: str = "scorer_factory") -> Callable[..., Any]:
    """The callable that ``"package.module:function"`` names (a `ConfigError` naming ``what`` if none)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{what} must look like 'package.module:function', got {path!r}")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load {what} {path!r}: {exc}") from exc
    if not callable(target):
        raise ConfigError(f"{what} {path!r} is not callable")
    return target


TEST_MODEL_WARNING = """
!!! WARNING: scoring with qace's TINY TEST MODELS (random weights, trained for seconds on a toy task).
!!! These scores MEAN NOTHING. They only show that the pipeline runs.
!!! For real QACE scores, give the paper's models: either let qace download them once
!!!   (hf download mrm8488/t5-base-finetuned-question-generation-ap / valhalla/t5-base-qa-qg-hl)
!!! or pass --models DIR with qg/, tqa/ and vqa/ checkpoints (see README, "Real models").
"""
JUDGE_TEST_MODEL_WARNING = """
!!! WARNING: scoring with qace's TINY TEST MODELS (random weights, built locally in a second).
!!! These {metric} scores MEAN NOTHING. They only show that the pipeline runs.
!!! {hint}
"""


def warn_if_test_models(scorer: Any, entry: ScorerEntry) -> None:
    """Log the loud test-model warning (a JSON record with ``--log-format json``) when ``scorer`` runs on
    qace's test models: QACE's own, or the entry's hint on how to get real models. A combined run
    (`qace.combined.CombinedScorer`) warns for each of its metrics that does."""
    for member_entry, member in getattr(scorer, "members", ()):
        warn_if_test_models(member, member_entry)
    if hasattr(scorer, "members") or not getattr(scorer, "uses_test_models", False):
        return
    if entry.hint is None:
        log.warning(TEST_MODEL_WARNING)
    else:
        log.warning(JUDGE_TEST_MODEL_WARNING.format(metric=entry.score_key, hint=entry.hint))


def _qace(variant: str, reads: str) -> ScorerEntry:
    return ScorerEntry(
        name=f"qace-{variant}",
        factory="qace.api:QACE",
        settings="qace.options:qace_settings",
        options="qace.options:add_qace_options",
        score_key="qace",
        columns=("qace", "qace_f1", "qace_bs", "qace_an", "qace_max"),
        parts=("qace_f1", "qace_bs", "qace_an"),
        signature=f"QACE-{variant.capitalize()}",
        reads=reads,
        preset=(("variant", variant),),
        cpu_pool="spacy_workers",
        reward="qace.reward:QACEReward",
        help=f"QACE-{variant.capitalize()} (same as --variant {variant})",
    )


register(_qace("ref", "references"))
register(_qace("img", "image_id"))
register(
    ScorerEntry(
        name="visce2",
        factory="qace.judges.visce2:VisCE2",
        settings="qace.judges.visce2:cli_settings",
        options="qace.judges.visce2:add_cli_arguments",
        score_key="visce2",
        columns=("visce2", "visce2_expected"),
        parts=("visce2_expected",),
        signature="VisCE2",
        reads="image",
        extra="judges",
        needs=("PIL",),
        demo="qace.testing.demos:visce2_demo",
        hint="For real VisCE² scores, pass --vlm with a VLM you have (default llava-hf/llava-1.5-7b-hf; "
        "`hf download llava-hf/llava-1.5-7b-hf` while online).",
        help="a VLM judge rating each caption 0-100 on its image",
    )
)
register(
    ScorerEntry(
        name="regen",
        factory="qace.judges.regen:RegenScore",
        settings="qace.judges.regen:cli_settings",
        options="qace.judges.regen:add_cli_arguments",
        score_key="regen",
        columns=("regen",),
        parts=(),
        signature="Regen",
        reads="image",
        extra="judges",
        needs=("PIL", "diffusers"),
        demo="qace.testing.demos:regen_demo",
        hint="pass --generator and --image-encoder (hub ids or local directories), or run `qace demo "
        "--metric regen --download` once to fetch stable-diffusion-v1-5/stable-diffusion-v1-5 and "
        "openai/clip-vit-large-patch14 (about 6 GB)",
        help="image regeneration score: redraw the caption, compare with the image",
    )
)


def _clip(name: str, family: str, references: bool) -> ScorerEntry:
    metric = {"clip": "CLIP-S", "pac": "PAC-S"}[family]
    key = ("ref" if references else "") + f"{family}_s"
    parts = (f"{family}_s", f"{family}_ref") if references else ()
    hint = (
        "pass --clip-model with the PAC-S checkpoint (`python -m qace.judges.clip_convert "
        "clip_ViT-B-32.pth DIR` makes the release's file a Transformers CLIP directory)"
        if family == "pac"
        else "pass --clip-model (hub id or directory), or `hf download "
        "openai/clip-vit-base-patch32` while online (the default, ViT-B/32)"
    )
    return ScorerEntry(
        name=name,
        factory=f"qace.judges.clip:{key}",
        settings="qace.judges.clip:" + ("pac_cli_settings" if family == "pac" else "cli_settings"),
        options="qace.judges.clip:add_cli_arguments",
        score_key=key,
        columns=(key, *parts),
        parts=parts,
        signature=("Ref" if references else "") + metric,
        reads="image",
        extra="judges",
        needs=("PIL",),
        demo=f"qace.testing.demos:{key}_demo",
        hint=hint,
        cpu_pool="workers",
        help=("the harmonic mean of " if references else "")
        + f"{metric}: CLIP cosine of caption and image"
        + (" and the best reference cosine" if references else ""),
    )


register(_clip("clip-s", "clip", False))
register(_clip("refclip-s", "clip", True))
register(_clip("pac-s", "pac", False))
register(_clip("refpac-s", "pac", True))
