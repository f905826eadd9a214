"""Preprocessing: an image resized for the detector, and a batch of them uploaded.

`resize_for_detector`: RGB to BGR, the shorter side resized to 600 and the longer capped at 1,000
(bilinear, on uint8, as the LXMERT demo does); `upload_batch` then subtracts the BGR pixel mean
(102.9801, 115.9465, 122.7717) on the device; no scaling by a standard deviation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from qace.features.detector.backbone import memory_layout, valid_mask
from qace.features.detector.config import DetectorConfig

PIXEL_MEAN_BGR = (102.9801, 115.9465, 122.7717)


class ImageError(ValueError):
    """An image the detector cannot take (too small, too thin); the message says why."""


def resize_for_detector(image: Any, config: DetectorConfig) -> tuple[np.ndarray, int, int]:
    """A PIL image (any mode: CMYK, grey, palette, alpha are converted to RGB) -> (resized BGR uint8 array
    HxWx3, original width, original height); `ImageError` when it is too small to detect in."""
    from PIL import Image

    width, height = image.size
    scale = config.min_size / min(width, height) if min(width, height) > 0 else 0.0
    if max(width, height) * scale > config.max_size:
        scale = config.max_size / max(width, height)
    new_w, new_h = int(width * scale + 0.5), int(height * scale + 0.5)
    if min(width, height) < config.min_image_side or min(new_w, new_h) < 32:
        raise ImageError(
            f"image is {width}x{height} pixels: too small or too thin for region features (needs "
            f"{config.min_image_side} pixels a side, and 32 after resizing to {new_w}x{new_h})"
        )
    rgb = image.convert("RGB").resize((new_w, new_h), Image.Resampling.BILINEAR)
    return np.ascontiguousarray(np.asarray(rgb)[:, :, ::-1]), width, height


class Staging:
    """The host buffer `upload_batch` sends batches through, kept from batch to batch (allocating pinned
    memory each batch is slow) and grown when a batch needs more: pinned for a GPU. A batch's copy to the GPU
    is asynchronous, so the next batch waits for it (an event recorded after it) before filling the buffer
    again. The copy lands in a device tensor of its own, so the buffer is free once the copy is done,
    whatever the detector is still doing with earlier batches: one buffer serves any number of uploaded
    batches waiting for the detector (`qace.features.extract` uploads ahead of it). One uploading thread
    at a time: two threads uploading at once would fill the same buffer."""

    def __init__(self) -> None:
        self.buffer: Tensor | None = None
        self.sent: Any = None  # a torch.cuda.Event after the last copy out of ``buffer``, until waited on

    def __deepcopy__(self, memo: dict[int, Any]) -> Staging:
        return Staging()  # a copied detector gets a buffer of its own

    def host(self, shape: tuple[int, ...], device: torch.device) -> Tensor:
        """A uint8 host tensor of ``shape`` to fill (its contents are whatever the last batch left)."""
        if self.sent is not None:
            self.sent.synchronize()
            self.sent = None
        pinned, size = device.type == "cuda", math.prod(shape)
        if self.buffer is None or self.buffer.numel() < size or self.buffer.is_pinned() != pinned:
            self.buffer = None  # free the old one first
            self.buffer = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
        return self.buffer[:size].view(shape)

    def copy(self, host: Tensor, device: torch.device) -> Tensor:
        """``host`` (from `host`) on ``device``; on a GPU asynchronously, remembered for the next `host`."""
        if device.type != "cuda":
            return host.to(device)
        on_device = host.to(device, non_blocking=True)
        self.sent = torch.cuda.Event()
        self.sent.record(torch.cuda.current_stream(device))
        return on_device


def upload_batch(
    images: Sequence[np.ndarray | Tensor], device: torch.device, staging: Staging | None = None
) -> tuple[Tensor, Tensor]:
    """The images zero-padded into one (N, 3, H, W) float32 batch on ``device`` (in `memory_layout`), the BGR
    mean subtracted inside each image, and their (N, 2) (h, w) there: one host-to-device copy of uint8
    through ``staging`` (a fresh one if None). The padding of the host buffer is left as it is: the mask
    below sets it to zero on the device."""
    staging = staging or Staging()
    h, w = (max(im.shape[k] for im in images) for k in (0, 1))
    sizes = _small_to(torch.tensor([im.shape[:2] for im in images], dtype=torch.long), device)
    host = staging.host((len(images), h, w, 3), device)
    for i, im in enumerate(images):
        host[i, : im.shape[0], : im.shape[1]] = torch.as_tensor(im)
    pixels = staging.copy(host, device).permute(0, 3, 1, 2).float()
    mean = _small_to(torch.tensor(PIXEL_MEAN_BGR), device).view(1, 3, 1, 1)
    batch = torch.where(valid_mask(pixels, sizes) > 0, pixels - mean, 0.0)
    return batch.contiguous(memory_format=memory_layout(device)), sizes


def _small_to(values: Tensor, device: torch.device) -> Tensor:
    """A small host tensor on ``device``; to a GPU through pinned memory and asynchronously, so the caller
    does not wait for the work already queued there (a plain copy from pageable memory would: `upload`
    runs beside the detector). PyTorch's pinned-memory cache keeps the pinned copy until the transfer
    has finished."""
    if device.type != "cuda":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)
