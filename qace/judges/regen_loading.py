"""The regeneration score's two models: a text-to-image pipeline and an image encoder.

Both load offline-first like QACE's models (a local directory directly; a hub id from the cache,
then the hub unless ``HF_HUB_OFFLINE=1``); every failure is a ``ModelNotFoundError`` naming the
role, what was tried and the fix.

The encoder's preprocessing runs in torch on the model's device, following the checkpoint's
``preprocessor_config.json`` (resize, centre crop, rescale, normalise). transformers picks a
torchvision or a Pillow backend for the same config depending on what is installed, and the two
round differently; ours gives the same pixels everywhere, needs neither, and batches on the GPU.
It matches the Pillow backend to within a few 8-bit levels (the tests measure it).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from qace.errors import ConfigError, ModelNotFoundError
from qace.models.loading import _hub_attempts
from qace.models.sources import hub_offline, looks_like_hub_id

logger = logging.getLogger(__name__)

T = TypeVar("T")

FINGERPRINT_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")
"""Files of a local checkpoint that can change scores: weights, configs (scheduler included), BPE files."""
_RESAMPLE = {0: "nearest-exact", 2: "bilinear", 3: "bicubic"}
"""Pillow resample codes in preprocessor configs -> torch modes (Lanczos, box, Hamming: bicubic)."""


def _fix_hint(role: str) -> str:
    flag = "--generator" if role.endswith("generator") else "--image-encoder"
    return (
        f"Fix: pass {flag} DIR (a local checkpoint in Hugging Face layout), download the model with "
        "`hf download <id>` while online, or build tiny test models with "
        "qace.testing.regen.make_regen_test_models (their scores mean nothing)."
    )


def _not_found(role: str, tried: str, why: str, fix: str | None = None) -> ModelNotFoundError:
    return ModelNotFoundError(f"{role}: {why} (tried {tried}). {fix or _fix_hint(role)}")


def _load_offline_first(
    name_or_path: str, role: str, marker: str, load: Callable[[str, bool], T], fix: str | None = None
) -> T:
    """Run ``load(source, local_files_only)``: a directory once; a hub id cache first, then online.
    Failures name ``role`` and ``fix`` (default: the regeneration score's fix for that role)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / marker).is_file():
            raise _not_found(role, str(path), f"directory has no {marker}", fix)
        source, attempts = str(path), [True]
    elif path.exists() or not looks_like_hub_id(name_or_path):
        raise _not_found(role, str(path), "no such model directory", fix)
    else:
        source, attempts = name_or_path, _hub_attempts(name_or_path)
    errors: list[str] = []
    for local_only in attempts:
        try:
            return load(source, local_only)
        except ModelNotFoundError:
            raise
        except (OSError, ValueError, KeyError, RuntimeError, ImportError) as exc:
            where = "local files" if local_only else "the Hugging Face hub"
            first = str(exc).splitlines()[0] if str(exc) else ""
            errors.append(f"{where}: {type(exc).__name__}: {first}")
            logger.debug("loading %s from %s failed", role, where, exc_info=True)
    offline = " (HF_HUB_OFFLINE=1, so the hub was not asked)" if hub_offline() and not path.exists() else ""
    raise _not_found(role, source, "could not load it" + offline + "; " + "; ".join(errors), fix)


def load_generator(name_or_path: str, *, device: str, dtype: torch.dtype) -> Any:
    """A diffusers text-to-image pipeline (hub id or directory with ``model_index.json``) on ``device``.

    The safety checker is not loaded: it blacks out images it flags, which would score the checker,
    not the caption.
    """

    def load(source: str, local_only: bool) -> Any:
        from diffusers import DiffusionPipeline

        index = DiffusionPipeline.load_config(source, local_files_only=local_only)
        extra: dict[str, Any] = {}
        if "safety_checker" in index:
            extra["safety_checker"] = None
        if "requires_safety_checker" in index:
            extra["requires_safety_checker"] = False
        # cast after loading: the dtype keyword was renamed (torch_dtype -> dtype) across diffusers versions
        return DiffusionPipeline.from_pretrained(source, local_files_only=local_only, **extra)

    pipeline = _load_offline_first(name_or_path, "regeneration generator", "model_index.json", load)
    params = inspect.signature(pipeline.__call__).parameters
    missing = [p for p in ("prompt", "generator", "output_type", "num_inference_steps") if p not in params]
    if missing:
        raise _not_found(
            "regeneration generator",
            name_or_path,
            f"{type(pipeline).__name__} is not a text-to-image pipeline (its __call__ lacks {missing})",
        )
    pipeline.to(device)
    if dtype != torch.float32:  # (casting to the dtype it already has only earns a diffusers warning)
        pipeline.to(dtype=dtype)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


@dataclass(frozen=True)
class Preprocess:
    """A checkpoint's image preprocessing, applied in torch to uint8 ``(3, H, W)`` images."""

    shortest_edge: int | None = None
    """Resize so the shorter side has this length (aspect kept), as CLIP/DINOv2 processors do."""
    resize_to: tuple[int, int] | None = None
    """Resize to exactly (height, width), as ViT/SigLIP processors do."""
    crop: tuple[int, int] | None = None
    """Centre crop (height, width) after resizing."""
    mode: str = "bicubic"
    """Interpolation (antialiased when shrinking, rounded to 8 bits like Pillow)."""
    rescale: float | None = 1 / 255
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Preprocess:
        """Read a transformers ``preprocessor_config.json``."""
        shortest = resize_to = crop = None
        if config.get("do_resize", True) and config.get("size") is not None:
            size = config["size"]
            if isinstance(size, int):
                shortest = size
            elif "shortest_edge" in size and "longest_edge" not in size:
                shortest = int(size["shortest_edge"])
            elif "height" in size and "width" in size:
                resize_to = (int(size["height"]), int(size["width"]))
            else:
                raise ConfigError(
                    f"unsupported image processor size {size!r} (shortest_edge or height/width)"
                )
        if config.get("do_center_crop", False) and config.get("crop_size") is not None:
            cs = config["crop_size"]
            crop = (cs, cs) if isinstance(cs, int) else (int(cs["height"]), int(cs["width"]))
        if shortest is not None and crop is None:
            raise ConfigError(
                "image processor resizes by shortest edge without a centre crop: images of other "
                "aspect ratios would not batch; use an encoder with crop_size or height/width resizing"
            )
        normalize = config.get("do_normalize", True)
        return cls(
            shortest_edge=shortest,
            resize_to=resize_to,
            crop=crop,
            mode=_RESAMPLE.get(int(config.get("resample", 3)), "bicubic"),
            rescale=float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else None,
            mean=tuple(config["image_mean"]) if normalize and "image_mean" in config else None,
            std=tuple(config["image_std"]) if normalize and "image_std" in config else None,
        )

    def target_size(self, height: int, width: int) -> tuple[int, int]:
        """Size after resizing (transformers' rule: the long side is truncated, not rounded)."""
        if self.resize_to is not None:
            return self.resize_to
        if self.shortest_edge is None:
            return height, width
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 ``(N, 3, H, W)`` (one size) -> float32 pixel values for the encoder."""
        x = images.float()
        height, width = x.shape[-2:]
        size = self.target_size(height, width)
        if size != (height, width):
            antialias = self.mode in ("bilinear", "bicubic")
            x = F.interpolate(x, size=size, mode=self.mode, antialias=antialias, align_corners=None)
            x = x.round().clamp(0, 255)
        if self.crop is not None:
            x = _centre_crop(x, self.crop)
        if self.rescale is not None:
            x = x * self.rescale
        if self.mean is not None and self.std is not None:
            mean = torch.tensor(self.mean, device=x.device).view(1, -1, 1, 1)
            std = torch.tensor(self.std, device=x.device).view(1, -1, 1, 1)
            x = (x - mean) / std
        return x


def _centre_crop(x: torch.Tensor, crop: tuple[int, int]) -> torch.Tensor:
    """transformers' centre crop: offsets ``(size - crop) // 2``, zero padding where the image is smaller."""
    height, width = x.shape[-2:]
    ch, cw = crop
    pad_h, pad_w = max(ch - height, 0), max(cw - width, 0)
    if pad_h or pad_w:
        x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
        height, width = x.shape[-2:]
    top, left = (height - ch) // 2, (width - cw) // 2
    return x[..., top : top + ch, left : left + cw]


class ImageEncoder:
    """An image embedding model: transformers vision model + its preprocessing, one vector per image.

    The embedding is what the model family calls the image feature: ``get_image_features`` (CLIP,
    SigLIP), else ``image_embeds`` (CLIP vision with projection), else the pooled output, else the
    first token.
    """

    def __init__(self, model: Any, preprocess: Preprocess, *, device: str, dtype: torch.dtype) -> None:
        self.model = model.to(device=device, dtype=dtype).eval()
        self.preprocess = preprocess
        self.device = torch.device(device)
        self.dtype = dtype

    @classmethod
    def load(cls, name_or_path: str, *, device: str, dtype: torch.dtype) -> ImageEncoder:
        """Load from a hub id or a directory holding ``config.json`` and ``preprocessor_config.json``."""

        def load(source: str, local_only: bool) -> tuple[Any, dict[str, Any]]:
            import transformers
            from transformers import AutoConfig, AutoModel, ImageProcessingMixin

            config = AutoConfig.from_pretrained(source, local_files_only=local_only)
            arch = (getattr(config, "architectures", None) or [""])[0]
            model_cls = getattr(transformers, arch, None) if arch else None
            if model_cls is None or not hasattr(model_cls, "from_pretrained"):
                model_cls = AutoModel
            model = model_cls.from_pretrained(source, local_files_only=local_only)
            processor_config, _ = ImageProcessingMixin.get_image_processor_dict(
                source, local_files_only=local_only
            )
            return model, processor_config

        model, processor_config = _load_offline_first(
            name_or_path, "regeneration image encoder", "config.json", load
        )
        return cls(model, Preprocess.from_config(processor_config), device=device, dtype=dtype)

    @torch.inference_mode()
    def embed(self, images: Sequence[torch.Tensor] | torch.Tensor, batch_size: int = 64) -> torch.Tensor:
        """L2-normalised float32 embeddings (on CPU) of uint8 ``(3, H, W)`` images, in order."""
        if isinstance(images, torch.Tensor):
            batches = [images[i : i + batch_size] for i in range(0, len(images), batch_size)]
            pixels = [self.preprocess(b.to(self.device)) for b in batches]
        else:
            each = [self.preprocess(img.to(self.device).unsqueeze(0)) for img in images]
            pixels = [torch.cat(each[i : i + batch_size]) for i in range(0, len(each), batch_size)]
        out = [self.features(p.to(self.dtype)).float() for p in pixels]
        if not out:
            return torch.zeros(0, 0)
        return F.normalize(torch.cat(out), dim=-1).cpu()

    def features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Raw (unnormalised) image features, one row per image."""
        model = self.model
        if hasattr(model, "get_image_features"):
            out = model.get_image_features(pixel_values=pixel_values)
        else:
            out = model(pixel_values=pixel_values)
        if isinstance(out, torch.Tensor):
            return out.flatten(1)
        for name in ("image_embeds", "pooler_output"):
            value = getattr(out, name, None)
            if isinstance(value, torch.Tensor):
                return value.flatten(1)
        return out.last_hidden_state[:, 0]


def tree_fingerprint(name_or_path: str | Path) -> str:
    """Hub id for hub models; ``sha256-<12 hex>`` of the score-relevant files of a local checkpoint.

    Covers the top level and one folder down (a diffusers pipeline keeps unet/, vae/, scheduler/...
    there), so two directories of the same name but other weights or another scheduler differ.
    """
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        return str(name_or_path)
    files = sorted(
        f
        for f in [*path.glob("*"), *path.glob("*/*")]
        if f.is_file() and f.suffix in FINGERPRINT_SUFFIXES and not f.name.startswith(".")
    )
    if not any(f.suffix in (".safetensors", ".bin") for f in files):
        raise ModelNotFoundError(f"{path}: no weight files (.safetensors, .bin) to fingerprint")
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return f"sha256-{digest.hexdigest()[:12]}"
