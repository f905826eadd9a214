"""VisCE² (Maeda et al., 2024): a vision-language model rates a caption, given a visual context.

Two steps. **Context**: once per image, the VLM writes a structured description (objects, their
features, their relationships; prompts in `qace.judges.visce2_prompts`). **Rating**: per caption,
the VLM rates 0-100 how well the caption fits the image and that context.

What the engine adds to the paper's release (temperature 0.2, one caption at a time):

- greedy decoding, so the same input always gives the same score;
- each image's context is computed once and reused by every caption of the image: an in-memory
  cache keyed by the image file's content hash, the model fingerprint, the variant and the context
  length, so a run never computes one image's context twice;
- captions are rated in batches (left-padded ``generate``), longest first, cut by a padded-token
  budget (``max_batch_tokens``) and a row cap (``max_batch_rows``);
- the score ``visce2`` is the first integer 0-100 in the answer, as a float on the paper's 0-100
  scale; with ``expected=True`` also ``visce2_expected``, the probability-weighted rating over the
  number tokens at the rating position (`qace.judges.rating`), which is smoother than the argmax;
- ``visce2_raw`` keeps the answer text, and with ``explain=True`` ``context`` keeps the context;
- an answer without an integer 0-100 is an error naming the record and quoting the answer (written to
  the errors file), never a silent 0; a missing or unreadable image is an error naming the file.

Variants (the paper's ablation): ``visce2`` (default), ``vanilla`` (no context), ``cot`` (vanilla +
"Let's think step by step."), ``description`` (a free description as context).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qace.config import given_speed_settings
from qace.data.records import Record, RecordError
from qace.engine.scheduler import plan_batches
from qace.errors import ConfigError
from qace.judges.images import ImageError, load_image
from qace.judges.rating import expected_rating, parse_rating
from qace.judges.visce2_prompts import VARIANTS, Variant, rating_text
from qace.judges.vlm import Generation, VLMRunner, load_vlm, vlm_fingerprint
from qace.precision import check_precision
from qace.scoring import FileScorer, list_ids
from qace.signature import Signature

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

log = logging.getLogger(__name__)

DEFAULT_VLM = "llava-hf/llava-1.5-7b-hf"
"""The documented default judge (the paper used LLaVA-1.5-13B; any image-text-to-text model fits)."""
METRIC_NAMES = {
    "visce2": "VisCE2",
    "vanilla": "VisCE2-Vanilla",
    "cot": "VisCE2-CoT",
    "description": "VisCE2-Description",
}
RATING_TOKENS = {"visce2": 8, "vanilla": 8, "description": 8, "cot": 256}
"""Default answer lengths of step 2: a number needs a few tokens, step-by-step reasoning many."""
RAW_IN_ERROR = 200
"""Characters of an unparseable answer quoted in its error."""


@dataclass(frozen=True)
class VisCE2Config:
    """Settings of a VisCE² scorer; those that change scores feed the signature."""

    model: str = DEFAULT_VLM
    """The VLM: a hub id or a local directory in Hugging Face layout."""
    variant: str = "visce2"
    """``visce2``, or one of the paper's ablations: ``vanilla``, ``cot``, ``description``."""
    precision: str = "fp32"
    """``fp32``, ``bf16`` or ``fp16`` weights and activations."""
    device: str = "cpu"
    """Torch device (``cuda``, ``cuda:1``)."""
    expected: bool = False
    """Also report ``visce2_expected``, the probability-weighted rating."""
    explain: bool = False
    """Keep the visual context in every row."""
    context_tokens: int = 512
    """Most tokens of a visual context (step 1)."""
    rating_tokens: int | None = None
    """Most tokens of a rating answer (step 2); None: 8, or 256 for ``cot``."""
    max_batch_tokens: int = 16384
    """Padded tokens (prompt + answer) per ``generate`` call."""
    max_batch_rows: int = 64
    """Rows per ``generate`` call."""
    chunk_size: int = 512
    """Captions per committed output chunk (and per batch plan)."""
    progress: bool = True
    """Show a progress bar on file runs."""

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ConfigError(f"unknown VisCE² variant {self.variant!r}; choose from {sorted(VARIANTS)}")
        check_precision(self.precision, what="VisCE² precision")
        for name in ("context_tokens", "max_batch_tokens", "max_batch_rows", "chunk_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.rating_tokens is not None and self.rating_tokens < 1:
            raise ConfigError(f"rating_tokens must be a positive integer, got {self.rating_tokens}")

    @property
    def answer_tokens(self) -> int:
        return self.rating_tokens or RATING_TOKENS[self.variant]


_CONFIG_FIELDS = {f.name for f in fields(VisCE2Config)}


def build_signature(config: VisCE2Config, model_fingerprint: str) -> str:
    """sacrebleu-style ``key:value`` signature (`qace.signature.Signature`)."""
    variant = VARIANTS[config.variant]
    context = [("ctx", config.context_tokens)] if variant.context_prompt is not None else []
    return str(
        Signature.of_scorer(
            METRIC_NAMES[config.variant],
            ("vlm", model_fingerprint),
            *context,
            ("rate", config.answer_tokens),
            ("exp", "yes" if config.expected else "no"),
            ("prec", config.precision),
            ("dec", "greedy"),
        )
    )


class ContextCache:
    """Visual contexts in memory, keyed by (image content hash, model fingerprint, variant, length)."""

    def __init__(self) -> None:
        self._contexts: dict[tuple[str, str, str, int], Generation] = {}
        self.computed = 0
        """How many contexts were generated (each image at most once per cache)."""
        self.reused = 0

    def __len__(self) -> int:
        return len(self._contexts)

    def get(self, key: tuple[str, str, str, int]) -> Generation | None:
        return self._contexts.get(key)

    def put(self, key: tuple[str, str, str, int], context: Generation) -> None:
        self._contexts[key] = context


@dataclass
class _Item:
    """A caption being scored, with its image once loaded (or why it cannot be)."""

    id: str
    caption: str
    source: str | PILImage | None
    digest: str = ""
    image: PILImage | None = None
    error: str | None = None
    flags: list[str] = field(default_factory=list)


class VisCE2(FileScorer):
    """A reusable VisCE² scorer: the VLM is loaded once, then any number of captions are scored.

    Pass a :class:`VisCE2Config` or its fields by keyword (``model="DIR"``, ``variant="vanilla"``,
    ``expected=True``, ``precision="bf16"``, ``device="cuda"``).
    """

    score_key = "visce2"

    def __init__(self, config: VisCE2Config | None = None, **settings: Any) -> None:
        unknown = set(settings) - _CONFIG_FIELDS
        if unknown:
            raise ConfigError(f"unknown VisCE² setting(s) {sorted(unknown)}; valid: {sorted(_CONFIG_FIELDS)}")
        self.config = replace(config or VisCE2Config(), **settings)
        from qace.models.sources import is_test_model

        model, processor = load_vlm(
            self.config.model, device=self.config.device, precision=self.config.precision
        )
        self._setup(model, processor, vlm_fingerprint(self.config.model), is_test_model(self.config.model))

    @classmethod
    def from_model(
        cls, model: Any, processor: Any, *, fingerprint: str, test_model: bool = False, **settings: Any
    ) -> VisCE2:
        """A scorer around an already loaded VLM (``model`` on ``device``, in ``precision``).

        ``fingerprint`` names the model in the signature (benchmarks use random weights they built).
        """
        unknown = set(settings) - _CONFIG_FIELDS
        if unknown:
            raise ConfigError(f"unknown VisCE² setting(s) {sorted(unknown)}; valid: {sorted(_CONFIG_FIELDS)}")
        scorer = cls.__new__(cls)
        scorer.config = VisCE2Config(**settings)
        scorer._setup(model, processor, fingerprint, test_model)
        return scorer

    def _setup(self, model: Any, processor: Any, fingerprint: str, test_model: bool) -> None:
        self.runner = VLMRunner(model, processor, device=self.config.device)
        self.fingerprint = fingerprint
        self.uses_test_models = test_model
        self.signature = build_signature(self.config, self.fingerprint)
        self.variant: Variant = VARIANTS[self.config.variant]
        self.contexts = ContextCache()
        if self.config.expected and not len(self.runner.numbers):
            raise ConfigError(f"the VLM {self.config.model!r} has no number tokens; expected=True needs them")

    # -- scoring -------------------------------------------------------------------------------

    def score(
        self,
        captions: Sequence[str],
        images: Sequence[str | Path | PILImage],
        ids: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Score captions of images (file paths or PIL images); one row per caption, in order.

        A caption that cannot be scored gets a row ``{"id", "error"}`` instead of raising; ``images`` or
        ``ids`` of another length than ``captions`` raise `InputError`.
        """
        ids = list_ids(captions, ids, images=images)
        items = [
            _Item(ids[i], captions[i], str(image) if isinstance(image, str | Path) else image)
            for i, image in enumerate(images)
        ]
        rows: list[dict[str, Any]] = []
        for start in range(0, len(items), self.chunk_size):
            for result in self._score_items(items[start : start + self.chunk_size]):
                rows.append(
                    {"id": result.id, "error": result.reason} if isinstance(result, RecordError) else result
                )
        return rows

    def score_records(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        """Stream rows (or errors naming the record) in input order, a chunk of captions at a time."""
        iterator = iter(records)
        while chunk := list(itertools.islice(iterator, self.chunk_size)):
            items: list[_Item | RecordError] = [
                r if isinstance(r, RecordError) else _Item(r.id, r.caption, r.image) for r in chunk
            ]
            scored = iter(self._score_items([i for i in items if isinstance(i, _Item)]))
            yield from (item if isinstance(item, RecordError) else next(scored) for item in items)

    def _score_items(self, items: list[_Item]) -> list[dict[str, Any] | RecordError]:
        self._load_images(items)
        ready = [item for item in items if item.error is None]
        contexts = self._contexts(ready) if self.variant.context_prompt is not None else {}
        ratings = self._ratings(ready, contexts)
        results: list[dict[str, Any] | RecordError] = []
        for item in items:
            if item.error is not None:
                results.append(RecordError(item.id, item.error))
            else:
                results.append(self._row(item, ratings[item.id], contexts.get(item.digest)))
        return results

    def _load_images(self, items: list[_Item]) -> None:
        """Decode each distinct image of the chunk once; a bad one fails only its own captions."""
        loaded: dict[int | str, tuple[str, PILImage] | str] = {}
        for item in items:
            if not isinstance(item.caption, str) or not item.caption.strip():
                item.error = "empty or whitespace-only caption"
                continue
            if item.source is None:
                item.error = "missing image (VisCE² needs the image file: give each record an 'image' path)"
                continue
            key = item.source if isinstance(item.source, str) else id(item.source)
            if key not in loaded:
                loaded[key] = _load(item.source)
            found = loaded[key]
            if isinstance(found, str):
                item.error = found
            else:
                item.digest, item.image = found

    def _cache_key(self, digest: str) -> tuple[str, str, str, int]:
        return (digest, self.fingerprint, self.variant.name, self.config.context_tokens)

    def _contexts(self, items: list[_Item]) -> dict[str, Generation]:
        """Step 1: the context of every distinct image among ``items``, from the cache or generated."""
        contexts: dict[str, Generation] = {}
        missing: dict[str, PILImage] = {}
        for item in items:
            if item.digest in contexts or item.digest in missing:
                continue
            cached = self.contexts.get(self._cache_key(item.digest))
            if cached is not None:
                contexts[item.digest] = cached
                self.contexts.reused += 1
            else:
                assert item.image is not None  # loaded by _load_images
                missing[item.digest] = item.image
        if missing:
            prompt = self.variant.context_prompt or ""
            digests = list(missing)
            generated = self._generate(
                [(missing[d], prompt) for d in digests], self.config.context_tokens, numbers=False
            )
            for digest, context in zip(digests, generated, strict=True):
                self.contexts.put(self._cache_key(digest), context)
                self.contexts.computed += 1
                contexts[digest] = context
        return contexts

    def _ratings(self, items: list[_Item], contexts: dict[str, Generation]) -> dict[str, Generation]:
        """Step 2: every caption's rating answer, batched across captions and images."""
        requests = []
        for item in items:
            context = contexts[item.digest].text if item.digest in contexts else None
            assert item.image is not None
            requests.append((item.image, rating_text(self.variant, item.caption, context)))
        answers = self._generate(requests, self.config.answer_tokens, numbers=self.config.expected)
        return {item.id: answer for item, answer in zip(items, answers, strict=True)}

    def _generate(
        self, requests: list[tuple[PILImage, str]], new_tokens: int, *, numbers: bool
    ) -> list[Generation]:
        """Greedy answers to (image, prompt) requests, in order, run in token-budgeted batches."""
        # the engine's planner, on each row's padded width: its prompt plus the answer it generates
        widths = np.asarray(self._lengths(requests), dtype=np.int64) + new_tokens
        cfg = self.config
        plan = [b.tolist() for b in plan_batches(widths, cfg.max_batch_tokens, cfg.max_batch_rows)]
        answers: list[Generation | None] = [None] * len(requests)
        for batch in plan:
            rows = [self.runner.encode(*requests[i]) for i in batch]
            for i, answer in zip(batch, self.runner.generate(rows, new_tokens, numbers=numbers), strict=True):
                answers[i] = answer
        return [a for a in answers if a is not None]

    def _lengths(self, requests: list[tuple[PILImage, str]]) -> list[int]:
        """Prompt lengths for the batch plan: text tokens plus the image's placeholder expansion,
        measured once per distinct image (so only the rows of a batch are ever encoded with pixels)."""
        extra: dict[int, int] = {}
        lengths = []
        for image, text in requests:
            tokens = len(
                self.runner.tokenizer(self.runner.prompt(text), add_special_tokens=True)["input_ids"]
            )
            if id(image) not in extra:
                encoded = self.runner.encode(image, text)
                extra[id(image)] = int(encoded["input_ids"].shape[1]) - tokens
            lengths.append(tokens + extra[id(image)])
        return lengths

    def _row(
        self, item: _Item, answer: Generation, context: Generation | None
    ) -> dict[str, Any] | RecordError:
        parsed = parse_rating(answer.text)
        if parsed is None:
            quoted = answer.text[:RAW_IN_ERROR] + ("..." if len(answer.text) > RAW_IN_ERROR else "")
            return RecordError(item.id, f"no rating 0-100 in the model's answer {quoted!r}")
        flags = list(item.flags)
        if context is not None and context.truncated:
            flags.append("context_truncated")
        row: dict[str, Any] = {"id": item.id, "visce2": float(parsed.value)}
        if self.config.expected:
            value = None
            if answer.number_probs is not None:
                steps, pieces = self.runner.pieces(answer.token_ids, parsed.start, parsed.end)
                value = expected_rating(pieces, answer.number_probs[steps], self.runner.numbers)
            row["visce2_expected"] = value
            if value is None:
                flags.append("expected_unavailable")
        row["visce2_raw"] = answer.text
        if self.config.explain and context is not None:
            row["context"] = context.text
        row["flags"] = sorted(flags)
        row["signature"] = self.signature
        return row


def _load(source: str | PILImage) -> tuple[str, PILImage] | str:
    """(content hash, RGB image) of a path or PIL image, or the reason it cannot be read."""
    if not isinstance(source, str):
        image = source.convert("RGB")
        digest = hashlib.sha256(f"{image.size}".encode() + image.tobytes()).hexdigest()
        return f"pixels-{digest}", image
    try:
        image = load_image(source)
        digest = hashlib.sha256(Path(source).read_bytes()).hexdigest()
    except ImageError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot read image {source!r}: {exc}"
    return f"file-{digest}", image


# -- command line ------------------------------------------------------------------------------


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """VisCE²'s options on ``qace score`` (device, precision, batch and chunk sizes are shared)."""
    group = parser.add_argument_group("VisCE² (--metric visce2)")
    group.add_argument(
        "--vlm", default=DEFAULT_VLM, help=f"the VLM judge: hub id or directory (default {DEFAULT_VLM})"
    )
    group.add_argument(
        "--visce2-variant",
        default="visce2",
        choices=sorted(VARIANTS),
        help="VisCE² or one of the paper's ablations",
    )
    group.add_argument(
        "--visce2-expected", action="store_true", help="also report the probability-weighted rating"
    )
    group.add_argument(
        "--visce2-context-tokens", type=int, default=512, help="most tokens of a visual context"
    )
    group.add_argument(
        "--visce2-rating-tokens", type=int, help="most tokens of a rating answer (default 8; cot: 256)"
    )


def cli_settings(args: argparse.Namespace) -> dict[str, Any]:
    """`VisCE2` keyword arguments but ``device`` from parsed arguments (the shared options included);
    the registry's ``visce2`` entry (`qace.scorers`) names it."""
    precision = getattr(args, "precision", "fp32")
    check_precision(precision, what="VisCE² --precision")
    return {
        "model": args.vlm,
        "variant": args.visce2_variant,
        "expected": args.visce2_expected,
        "explain": getattr(args, "explain", False),
        "context_tokens": args.visce2_context_tokens,
        "rating_tokens": args.visce2_rating_tokens,
        "precision": precision,
        "progress": not getattr(args, "no_progress", False),
        # the speed settings given; VisCE2Config's defaults for the others
        **given_speed_settings(args, ("max_batch_tokens", "max_batch_rows", "chunk_size")),
    }
