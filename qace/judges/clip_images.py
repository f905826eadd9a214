"""A CLIP checkpoint's image preprocessing up to 8-bit pixels, light enough for worker processes.

`ClipPixels` reads the checkpoint's ``preprocessor_config.json`` (CLIP's: resize the shorter side with
Pillow, bicubic by default, then centre crop; or resize to a fixed height and width) and turns an
image file into uint8 ``(3, H, W)`` pixels, as Transformers' Pillow image processor does before it
rescales and normalises (`qace.judges.clip_model` does those two on the model's device). It imports
Pillow and NumPy only, so decoding processes start in a fraction of a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from qace.errors import ConfigError, InputError
from qace.judges.images import load_image


@dataclass(frozen=True)
class ClipPixels:
    """Resize and centre crop of a CLIP image processor config, and its normalisation constants."""

    shortest_edge: int | None
    """Resize so the shorter side has this length (the longer one truncated, as Transformers does)."""
    resize_to: tuple[int, int] | None
    """Or resize to exactly (height, width)."""
    crop: tuple[int, int] | None
    """Centre crop (height, width) after resizing."""
    resample: int
    """Pillow's resampling filter (3: bicubic)."""
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rescale: float

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ClipPixels:
        """Read a ``preprocessor_config.json``; `ConfigError` for a layout whose images would not batch."""
        size = config.get("size") if config.get("do_resize", True) else None
        shortest = resize_to = crop = None
        if isinstance(size, int):
            shortest = size
        elif isinstance(size, dict) and "shortest_edge" in size and "longest_edge" not in size:
            shortest = int(size["shortest_edge"])
        elif isinstance(size, dict) and "height" in size and "width" in size:
            resize_to = (int(size["height"]), int(size["width"]))
        elif size is not None:
            raise ConfigError(
                f"unsupported CLIP image processor size {size!r} (shortest_edge or height/width)"
            )
        crop_size = config.get("crop_size") if config.get("do_center_crop", True) else None
        if crop_size is not None:
            crop = (
                (crop_size, crop_size)
                if isinstance(crop_size, int)
                else (crop_size["height"], crop_size["width"])
            )
        if crop is None and resize_to is None:
            raise ConfigError("the CLIP image processor neither crops nor resizes to a fixed size")
        return cls(
            shortest_edge=shortest,
            resize_to=resize_to,
            crop=None if crop is None else (int(crop[0]), int(crop[1])),
            resample=int(config.get("resample", 3)),
            mean=tuple(float(v) for v in config.get("image_mean", (0.48145466, 0.4578275, 0.40821073))),
            std=tuple(float(v) for v in config.get("image_std", (0.26862954, 0.26130258, 0.27577711))),
            rescale=float(config.get("rescale_factor", 1 / 255)),
        )

    def target_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) after resizing."""
        if self.resize_to is not None:
            return self.resize_to[1], self.resize_to[0]
        assert self.shortest_edge is not None
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(self.shortest_edge * long / short)
        return (self.shortest_edge, new_long) if width <= height else (new_long, self.shortest_edge)

    def __call__(self, path: str) -> np.ndarray | str:
        """The uint8 ``(3, H, W)`` pixels of the image file ``path``, or why it cannot be read."""
        try:
            image = load_image(path)
        except InputError as exc:
            return getattr(exc, "reason", None) or str(exc)
        size = self.target_size(*image.size)
        if size != image.size:
            image = image.resize(size, resample=self.resample)
        pixels = np.asarray(image, dtype=np.uint8)
        if self.crop is not None:
            pixels = centre_crop(pixels, self.crop)
        return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def centre_crop(pixels: np.ndarray, crop: tuple[int, int]) -> np.ndarray:
    """Transformers' centre crop of ``(H, W, C)`` pixels: offsets ``(size - crop) // 2``, zero padding
    where the image is smaller than the crop."""
    height, width = pixels.shape[:2]
    ch, cw = crop
    if ch > height or cw > width:
        padded = np.zeros((max(ch, height), max(cw, width), pixels.shape[2]), dtype=pixels.dtype)
        top, left = (padded.shape[0] - height) // 2, (padded.shape[1] - width) // 2
        padded[top : top + height, left : left + width] = pixels
        pixels, (height, width) = padded, padded.shape[:2]
    top, left = (height - ch) // 2, (width - cw) // 2
    return pixels[top : top + ch, left : left + cw]
