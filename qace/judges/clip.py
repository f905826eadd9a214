"""CLIP-S and RefCLIP-S (Hessel et al., 2021), PAC-S and RefPAC-S (Sarto et al., 2023) on the engine.

- CLIP-S(c, v) = w * max(cos(E(prompt + " " + c), E(v)), 0), w = 2.5, prompt ``A photo depicts``;
- RefCLIP-S(c, R, v) = the harmonic mean of CLIP-S(c, v) and max(max_r cos(E(prompt + " " + c),
  E(prompt + " " + r)), 0) (the release gives references the prompt too); 0 when both are 0;
- PAC-S and RefPAC-S: the same on the PAC-S checkpoint (a CLIP fine-tuned by Sarto et al.) with
  w = 2.0, as their release computes it.

The model is any Transformers ``CLIPModel`` (`qace.judges.clip_model`). Images come from the
record's ``image`` path, or from its ``image_id`` looked up in ``images`` (a folder, a list file or a
records file, as ``qace features extract`` reads them). Each image is embedded once per run and
cached; a chunk's texts (captions and references) are embedded in shared batches. The signature
names the checkpoint (``sha256-`` of a local directory's files, ``id@revision`` of a hub model), w,
the prompt and the precision.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from qace.data.records import Record, RecordError
from qace.errors import ConfigError
from qace.precision import check_precision
from qace.scoring import FileScorer, list_ids
from qace.signature import Signature

if TYPE_CHECKING:
    from qace.judges.clip_model import ClipEncoder

DEFAULT_CLIP = "openai/clip-vit-base-patch32"
"""ViT-B/32, the CLIPScore paper's model (Transformers' copy of OpenAI's weights)."""
PROMPT = "A photo depicts"
WEIGHTS = {"clip": 2.5, "pac": 2.0}
"""w of each family, as the releases compute it."""
METRIC_NAMES = {("clip", False): "CLIP-S", ("clip", True): "RefCLIP-S", ("pac", False): "PAC-S",
                ("pac", True): "RefPAC-S"}  # fmt: skip
SPEC_VERSION = "1"
"""Version of our decisions (prompt joining, truncation, the harmonic mean at 0); bump when one changes."""
PAC_HINT = (
    "pac-s needs the PAC-S checkpoint: pass --clip-model DIR, a Transformers CLIPModel directory (convert "
    "the release's clip_ViT-B-32.pth with `python -m qace.judges.clip_convert clip_ViT-B-32.pth DIR`)"
)


@dataclass(frozen=True)
class ClipScoreConfig:
    """Settings of a CLIP-S / PAC-S scorer; those that change scores feed the signature."""

    model: str | None = None
    """A ``CLIPModel`` hub id or directory; None: ViT-B/32 for ``clip``, required for ``pac``."""
    family: str = "clip"
    """``clip`` (CLIP-S, w 2.5) or ``pac`` (PAC-S, w 2.0): names the metric and its default w."""
    references: bool = False
    """Score RefCLIP-S / RefPAC-S (records need references)."""
    w: float | None = None
    """The rescaling weight; None: the family's."""
    prompt: str = PROMPT
    """Put before every caption and reference, joined by one space; empty: none (torchmetrics' CLIPScore)."""
    images: str | None = None
    """Where records without an ``image`` path find their ``image_id``: a folder, list or records file."""
    precision: str = "fp32"
    device: str = "cpu"
    workers: int | None = None
    """Processes decoding images; None: 0 on the CPU, else the cores less two (at most 8)."""
    image_batch: int | None = None
    """Images per vision-encoder call, always that many (speed, and the last float bits); None: 8 on
    the CPU, else 64."""
    text_batch: int | None = None
    """Texts per text-encoder call, always that many (likewise); None: 32 on the CPU, else 512
    (measured against 256 and 1,024: docs/clip.md)."""
    chunk_size: int = 4096
    """Captions per committed output chunk."""
    progress: bool = True

    def __post_init__(self) -> None:
        if self.family not in WEIGHTS:
            raise ConfigError(f"unknown CLIP score family {self.family!r}; choose from {sorted(WEIGHTS)}")
        if self.family == "pac" and not self.model:
            raise ConfigError(PAC_HINT)
        check_precision(self.precision, what="CLIP-S precision")
        if self.w is not None and not self.w > 0:
            raise ConfigError(f"w must be positive, got {self.w}")
        if "|" in self.prompt:
            raise ConfigError(f"the prompt may not contain '|' (it goes into the signature): {self.prompt!r}")
        for name in ("image_batch", "text_batch", "chunk_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"workers must be 0 or more, got {self.workers}")
        if self.images is not None and not Path(self.images).exists():
            raise ConfigError(
                f"--images {self.images!r} does not exist (a folder, list file or records file)"
            )

    @property
    def name(self) -> str:
        return METRIC_NAMES[(self.family, self.references)]

    @property
    def weight(self) -> float:
        return WEIGHTS[self.family] if self.w is None else self.w

    @property
    def checkpoint(self) -> str:
        return self.model or DEFAULT_CLIP

    @property
    def images_per_batch(self) -> int:
        return self.image_batch or (8 if self.device == "cpu" else 64)

    @property
    def texts_per_batch(self) -> int:
        return self.text_batch or (32 if self.device == "cpu" else 512)

    @property
    def decode_workers(self) -> int:
        if self.workers is not None:
            return self.workers
        return 0 if self.device == "cpu" else max(0, min(8, (os.cpu_count() or 2) - 2))


_CONFIG_FIELDS = {f.name for f in fields(ClipScoreConfig)}


def build_signature(config: ClipScoreConfig, fingerprint: str) -> str:
    """sacrebleu-style signature (`qace.signature.Signature`): checkpoint, w, prompt, precision."""
    return str(
        Signature.of_scorer(
            config.name,
            ("clip", fingerprint),
            ("w", f"{config.weight:g}"),
            ("prompt", quote(config.prompt) if config.prompt else "none"),
            ("prec", config.precision),
            spec=SPEC_VERSION,
        )
    )


def with_prompt(prompt: str, text: str) -> str:
    """``prompt`` and ``text`` joined by one space (the release's rule), or ``text`` alone."""
    return f"{prompt.rstrip(' ')} {text}" if prompt else text


def image_index(source: str) -> dict[str, str]:
    """Image id -> file of a folder, list file or records file (`qace.features.extract.gather_images`)."""
    from qace.features.extract import gather_images

    return {item.key: item.path for item in gather_images(source)}


class ClipScore(FileScorer):
    """CLIP-S, RefCLIP-S, PAC-S or RefPAC-S: the model loads once (shared by the scorers of a process
    with the same checkpoint, device and precision), then any number of captions are scored.

    Any `ClipScoreConfig` field can be passed by keyword; ``encoder`` takes a `ClipEncoder` already built.
    """

    def __init__(
        self, config: ClipScoreConfig | None = None, *, encoder: ClipEncoder | None = None, **settings: Any
    ) -> None:
        unknown = set(settings) - _CONFIG_FIELDS
        if unknown:
            raise ConfigError(f"unknown setting(s) {sorted(unknown)}; valid: {sorted(_CONFIG_FIELDS)}")
        self.config = cfg = replace(config or ClipScoreConfig(), **settings)
        self.score_key = cfg.name.lower().replace("-", "_")
        self.base_key = f"{cfg.family}_s"
        self._index = image_index(cfg.images) if cfg.images else {}
        from qace.judges.clip_model import shared_encoder
        from qace.models.sources import is_test_model

        self.encoder = encoder or shared_encoder(
            cfg.checkpoint, device=cfg.device, precision=cfg.precision, workers=cfg.decode_workers
        )
        self.uses_test_models = is_test_model(cfg.checkpoint)
        self.signature = build_signature(cfg, self.encoder.fingerprint)

    def score(
        self,
        captions: Sequence[str],
        images: Sequence[str | Path] | None = None,
        references: Sequence[Sequence[str]] | None = None,
        ids: Sequence[str] | None = None,
        image_ids: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Score captions given as lists (image files, or image ids found in ``images``); one row per
        caption, in order; a caption that cannot be scored gets ``{"id", "error"}``."""
        ids = list_ids(captions, ids, images=images, references=references, image_ids=image_ids)
        records: list[Record | RecordError] = []
        for n, (record_id, caption) in enumerate(zip(ids, captions, strict=True)):
            if not isinstance(caption, str):
                records.append(
                    RecordError(record_id, f"caption must be a string, got {type(caption).__name__}")
                )
                continue
            image = None if images is None or images[n] is None else str(images[n])
            refs = None if references is None else tuple(references[n])
            image_id = None if image_ids is None else str(image_ids[n])
            records.append(Record(record_id, caption, image_id, refs, image))
        return self._rows(records)

    def _image_of(self, record: Record) -> str | None:
        if record.image:
            return record.image
        if record.image_id is None:
            return None
        return self._index.get(record.image_id) or self._index.get(Path(record.image_id).stem)

    def _check(self, record: Record) -> str | None:
        """Why ``record`` cannot be scored (before any model work), else None."""
        if not record.caption.strip():
            return "empty or whitespace-only caption"
        if self._image_of(record) is None:
            where = (
                f"image_id {record.image_id!r} is not in --images {self.config.images!r}"
                if record.image_id and self.config.images
                else "no image: give the record an 'image' file path, or an image_id and --images "
                "(a folder, list or records file of the images)"
            )
            return f"{self.config.name} needs the image: {where}"
        if self.config.references and not [r for r in record.references or () if r.strip()]:
            return (
                f"{self.config.name} needs reference captions: add 'references' to the record "
                "(or --references FILE for COCO results), or score the reference-free metric"
            )
        return None

    def _score_chunk(self, chunk: list[Record | RecordError]) -> list[dict[str, Any] | RecordError]:
        import torch

        cfg = self.config
        results: list[dict[str, Any] | RecordError | None] = [None] * len(chunk)
        valid: list[tuple[int, Record, str]] = []
        for pos, item in enumerate(chunk):
            reason = None if isinstance(item, RecordError) else self._check(item)
            if isinstance(item, RecordError):
                results[pos] = item
            elif reason is not None:
                results[pos] = RecordError(item.id, reason, item.line)
            else:
                valid.append((pos, item, self._image_of(item) or ""))
        embedded = self.encoder.image_embeddings([path for _, _, path in valid], cfg.images_per_batch)
        work = []
        for pos, record, path in valid:
            found = embedded[path]
            if isinstance(found, str):
                results[pos] = RecordError(record.id, found, record.line)
            else:
                work.append((pos, record, found))
        if work:
            captions = [with_prompt(cfg.prompt, record.caption) for _, record, _ in work]
            refs = [[with_prompt(cfg.prompt, r) for r in record.references or () if r.strip()]
                    for _, record, _ in work] if cfg.references else []  # fmt: skip
            texts, cut = self.encoder.embed_texts(
                captions + [r for rs in refs for r in rs], cfg.texts_per_batch
            )
            image = torch.stack([e for _, _, e in work])
            caption = texts[: len(work)]
            cosine = (caption.double() * image.double()).sum(-1).float()  # fp64: the same bits in any N
            clip = (cfg.weight * cosine.clamp(min=0)).tolist()
            ref = self._ref_cosines(caption, texts[len(work) :], refs) if cfg.references else None
            for n, (pos, record, _) in enumerate(work):
                flags = ["truncated_caption"] if cut[n] else []
                results[pos] = self._row(
                    record, self._image_of(record), clip[n], None if ref is None else ref[n], flags
                )
        return [r for r in results if r is not None]

    @staticmethod
    def _ref_cosines(caption: Any, refs: Any, groups: list[list[str]]) -> list[float]:
        """max(max over a caption's references of the cosine, 0), per caption."""
        import torch

        width = max(len(g) for g in groups)
        index = torch.zeros((len(groups), width), dtype=torch.long, device=caption.device)
        valid = torch.zeros((len(groups), width), dtype=torch.bool, device=caption.device)
        start = 0
        for n, group in enumerate(groups):
            index[n, : len(group)] = torch.arange(start, start + len(group), device=caption.device)
            valid[n, : len(group)] = True
            start += len(group)
        cosines = torch.einsum("nd,nrd->nr", caption.double(), refs[index].double()).float()
        cosines = cosines.masked_fill(~valid, float("-inf"))
        return cosines.max(dim=1).values.clamp(min=0).tolist()

    def _row(
        self, record: Record, image: str | None, clip: float, ref: float | None, flags: list[str]
    ) -> dict[str, Any]:
        row: dict[str, Any] = {"id": record.id, "image_id": record.image_id, "image": image}
        if ref is None:
            row[self.score_key] = clip
        else:
            row[self.score_key] = 2 * clip * ref / (clip + ref) if clip + ref > 0 else 0.0
            row[self.base_key], row[f"{self.config.family}_ref"] = clip, ref
        row["flags"] = flags
        row["signature"] = self.signature
        return row


# -- registry entries ----------------------------------------------------------------------------


def clip_s(**settings: Any) -> ClipScore:
    """``clip-s``."""
    return ClipScore(family="clip", references=False, **settings)


def refclip_s(**settings: Any) -> ClipScore:
    """``refclip-s``."""
    return ClipScore(family="clip", references=True, **settings)


def pac_s(**settings: Any) -> ClipScore:
    """``pac-s`` (``model`` is the PAC-S checkpoint)."""
    return ClipScore(family="pac", references=False, **settings)


def refpac_s(**settings: Any) -> ClipScore:
    """``refpac-s`` (``model`` is the PAC-S checkpoint)."""
    return ClipScore(family="pac", references=True, **settings)


def add_cli_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``--metric clip-s / refclip-s / pac-s / refpac-s`` (device, precision, chunk size
    and progress are the generic ``qace score`` options; ``--batch-rows`` sizes text batches)."""
    g = parser.add_argument_group("CLIP-S, RefCLIP-S, PAC-S, RefPAC-S (--metric clip-s ...)")
    g.add_argument(
        "--clip-model", help=f"CLIPModel hub id or directory (default {DEFAULT_CLIP}; pac-s: required)"
    )
    g.add_argument("--clip-w", type=float, help="the rescaling weight w (default 2.5, PAC-S 2.0)")
    g.add_argument(
        "--clip-prompt", default=PROMPT, help=f"text before each caption (default {PROMPT!r}; '' for none)"
    )
    g.add_argument(
        "--images", help="where records' image ids are found: a folder, a list file or a records file"
    )
    g.add_argument(
        "--image-workers", type=int, help="processes decoding images (CPU 0; GPU the cores less two, <= 8)"
    )


def cli_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``clip-s`` / ``refclip-s`` keyword arguments but ``device`` from parsed arguments, checked
    before any model loads."""
    return _settings(args, "clip")


def pac_cli_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ``pac-s`` / ``refpac-s`` keyword arguments (``--clip-model`` required), checked likewise."""
    return _settings(args, "pac")


def _settings(args: argparse.Namespace, family: str) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "model": args.clip_model, "w": args.clip_w, "prompt": args.clip_prompt, "images": args.images,
        "precision": getattr(args, "precision", None) or "fp32",
        "progress": not getattr(args, "no_progress", False),
    }  # fmt: skip
    if args.image_workers is not None:  # else left to the device, or to --gpus / Ray (the entry's cpu_pool)
        settings["workers"] = args.image_workers
    if getattr(args, "chunk_size", None):
        settings["chunk_size"] = args.chunk_size
    if getattr(args, "batch_rows", None):
        settings["text_batch"] = args.batch_rows
    ClipScoreConfig(family=family, **settings)
    return settings
