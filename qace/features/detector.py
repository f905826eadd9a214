"""The bottom-up-attention Faster R-CNN (Anderson et al. 2018) that made the release's region features.

Architecture (`DetectorConfig`'s defaults): a ResNet-101 C4 backbone (Caffe-style stem, stride in the
1x1 convolutions, frozen batch norm), a region proposal network on res4 (512 hidden channels, 12
anchors: sizes 64-512 at ratios 0.5, 1, 2), RoIPool 14x14 at 1/16, res5 with stride 1 and dilation 2
run per region and mean-pooled to 2,048 values, then Visual Genome heads: 1,600 object classes plus
background (last) and 400 attributes. Module and parameter names are those of the public PyTorch
conversion ``unc-nlp/frcnn-vg-finetuned`` (the LXMERT demo's ``modeling_frcnn.py``), so its
``pytorch_model.bin`` loads as it is (`BottomUpDetector.from_pretrained`).

Preprocessing (`resize_for_detector`): RGB to BGR, the shorter side resized to 600 and the longer
capped at 1,000 (bilinear, on uint8, as the LXMERT demo does), then the BGR pixel mean
(102.9801, 115.9465, 122.7717) subtracted; no scaling by a standard deviation.

Region selection follows the release's ``generate_tsv.py`` with 36 boxes: the boxes are the RPN
proposals the features were pooled from; each is scored by class-wise NMS (IoU 0.3, per object
class, background excluded): its confidence is its highest class probability among the classes
in which it survives; the 36 most confident are kept, most confident first (ties by proposal
rank). The release's score threshold (0.2) plays no part when exactly 36 are kept. An image with
fewer than 36 proposals yields fewer boxes; the release then wrote a shorter row, and Visual-T5
needs 36, so `detect` reports such an image as an error instead of padding it.

Batching: images of different sizes are zero-padded into one tensor; activations beyond each image's
own extent are zeroed before every spatial convolution and the proposal network ignores anchors
there, so an image gets the same regions alone as in any batch (features equal to fp32 rounding).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from qace.errors import ConfigError, ModelNotFoundError
from qace.features import DEFAULT_DETECTOR
from qace.features.ops import greedy_nms, roi_pool

log = logging.getLogger(__name__)

WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "qace-detector.json"
PIXEL_MEAN_BGR = (102.9801, 115.9465, 122.7717)


@dataclass(frozen=True)
class DetectorConfig:
    """Sizes and test-time settings; the defaults are the released model's."""

    blocks: tuple[int, int, int, int] = (3, 4, 23, 3)
    """Bottleneck blocks in res2..res5 (ResNet-101)."""
    stem_channels: int = 64
    res2_channels: int = 256
    """res2's output channels; res3/res4/res5 double them."""
    bottleneck_divisor: int = 4
    """A block's inner width is its output channels over this (4 in ResNets)."""
    rpn_hidden: int = 512
    anchor_sizes: tuple[int, ...] = (64, 128, 256, 512)
    anchor_ratios: tuple[float, ...] = (0.5, 1.0, 2.0)
    num_classes: int = 1600
    num_attrs: int = 400
    pooler_resolution: int = 14
    pre_nms_topk: int = 6000
    post_nms_topk: int = 300
    rpn_nms: float = 0.7
    class_nms: float = 0.3
    num_regions: int = 36
    min_size: int = 600
    max_size: int = 1000
    min_image_side: int = 10
    """Images with a side shorter than this many pixels are reported, not detected."""
    pair_budget: int = 8192
    """(box, class) pairs the class-wise NMS starts from (grown until 36 boxes are decided exactly)."""

    @property
    def feature_dim(self) -> int:
        return self.res2_channels * 8

    @classmethod
    def tiny(cls) -> DetectorConfig:
        """The same architecture at toy sizes, for tests: one block a stage, narrow, small images."""
        return cls(
            blocks=(1, 1, 1, 1),
            stem_channels=8,
            bottleneck_divisor=64,  # the real 2,048-d output, narrow inside
            rpn_hidden=8,
            anchor_sizes=(16, 32, 64),
            num_classes=11,
            num_attrs=5,
            pooler_resolution=2,
            pre_nms_topk=400,
            post_nms_topk=48,
            min_size=96,
            max_size=160,
            pair_budget=64,
        )


@dataclass(frozen=True)
class Detection:
    """One image's regions, most confident first: ``boxes`` (36, 4) pixel x1, y1, x2, y2 in the original
    image, ``features`` (36, D) float32, ``scores`` (36,) and ``classes`` (36,) (object class of the best
    surviving score), with the original ``width`` and ``height``."""

    boxes: np.ndarray
    features: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    width: int
    height: int

    def norm_boxes(self) -> np.ndarray:
        """``(x1/W, y1/H, x2/W, y2/H, w/W, h/H)`` float32, the layout Visual-T5 reads."""
        b = self.boxes.astype(np.float64) / np.array([self.width, self.height, self.width, self.height])
        return np.concatenate([b, b[:, 2:] - b[:, :2]], axis=1).astype(np.float32)

    def regions(self) -> np.ndarray:
        """The (36, D + 6) float32 model input: features, then normalised boxes."""
        return np.concatenate([self.features, self.norm_boxes()], axis=1).astype(np.float32)


# -- preprocessing -----------------------------------------------------------------------------------


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


# -- backbone ----------------------------------------------------------------------------------------


class Conv2d(nn.Conv2d):
    """A convolution followed by its frozen batch norm (the checkpoint's ``<conv>.norm.*`` keys).

    While ``folded`` is set (`BottomUpDetector` sets it for a half-precision batch on a GPU) the two run
    as one convolution with `fold`'s weight and bias, and `relu` and `add_relu` run as one cuDNN kernel
    each (``torch.cudnn_convolution_relu``, ``torch.cudnn_convolution_add_relu``): the batch norm, ReLU and
    residual sum are no longer passes of their own over the activations (on a CPU, the folded
    convolution followed by them). A fold may have no bias: a shortcut's moves into its block's conv3
    (`Bottleneck.folds`)."""

    def __init__(self, *args: Any, norm: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.norm = nn.BatchNorm2d(norm) if norm else None
        self.folded: tuple[Tensor, Tensor | None] | None = None

    def fold(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """This convolution and its batch norm as one: (weight, bias) in ``dtype``, the weight in the
        layout of this one (computed in float32, rounded once)."""
        weight = self.weight.float()
        bias = self.bias.float() if self.bias is not None else torch.zeros_like(weight[:, 0, 0, 0])
        if self.norm is not None:
            n = self.norm  # frozen: its running statistics are always there
            mean, var = cast(Tensor, n.running_mean).float(), cast(Tensor, n.running_var).float()
            scale = n.weight.float() / torch.sqrt(var + n.eps)
            weight, bias = weight * scale[:, None, None, None], (bias - mean) * scale + n.bias.float()
        channels_last = self.weight.is_contiguous(memory_format=torch.channels_last)
        layout = torch.channels_last if channels_last else torch.contiguous_format
        return weight.to(dtype=dtype, memory_format=layout), bias.to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        if self.folded is not None:
            weight, bias = self.folded
            return self._conv_forward(x.to(weight.dtype), weight, bias)
        x = super().forward(x)
        return self.norm(x) if self.norm is not None else x

    @property
    def _pads(self) -> tuple[int, ...]:
        """The padding as numbers (the detector never gives a string)."""
        return cast(tuple[int, ...], self.padding)

    def relu(self, x: Tensor) -> Tensor:
        """ReLU of `forward`."""
        if self.folded is not None and x.is_cuda:
            weight, bias = self.folded
            return torch.cudnn_convolution_relu(
                x.to(weight.dtype), weight, bias, self.stride, self._pads, self.dilation, self.groups
            )
        return torch.relu(self(x))

    def add_relu(self, x: Tensor, residual: Tensor) -> Tensor:
        """ReLU of `forward` plus ``residual``."""
        if self.folded is not None and x.is_cuda:
            weight, bias = self.folded
            return torch.cudnn_convolution_add_relu(
                x.to(weight.dtype),
                weight,
                residual.to(weight.dtype),
                1.0,
                bias,
                self.stride,
                self._pads,
                self.dilation,
                self.groups,
            )
        return torch.relu(self(x) + residual)


class Bottleneck(nn.Module):
    def __init__(self, cin: int, cout: int, width: int, stride: int, dilation: int = 1) -> None:
        super().__init__()
        self.shortcut = Conv2d(cin, cout, 1, stride=stride, bias=False, norm=cout) if cin != cout else None
        self.conv1 = Conv2d(cin, width, 1, stride=stride, bias=False, norm=width)
        self.conv2 = Conv2d(width, width, 3, padding=dilation, dilation=dilation, bias=False, norm=width)
        self.conv3 = Conv2d(width, cout, 1, bias=False, norm=cout)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        out = self.conv1.relu(x)
        if mask is not None:
            out = out * mask
        out = self.conv2.relu(out)
        return self.conv3.add_relu(out, self.shortcut(x) if self.shortcut is not None else x)

    def folds(self, dtype: torch.dtype) -> list[tuple[Conv2d, tuple[Tensor, Tensor | None]]]:
        """Each convolution's `Conv2d.fold` in ``dtype``, except that a shortcut's bias moves into conv3's
        (summed in float32, rounded once): the shortcut only feeds conv3's residual sum, so conv3's fused
        kernel adds it, where the shortcut would add it in a pass of its own over the block's widest
        activation (1.9 billion values in res5 for a batch of 16 images)."""
        folds: list[tuple[Conv2d, tuple[Tensor, Tensor | None]]] = [
            (self.conv1, self.conv1.fold(dtype)),
            (self.conv2, self.conv2.fold(dtype)),
        ]
        if self.shortcut is None:
            return [*folds, (self.conv3, self.conv3.fold(dtype))]
        shortcut, (weight, bias) = self.shortcut.fold(torch.float32), self.conv3.fold(torch.float32)
        return [
            *folds,
            (self.shortcut, (shortcut[0].to(dtype), None)),
            (self.conv3, (weight.to(dtype), (bias + shortcut[1]).to(dtype))),
        ]


class Stage(nn.ModuleList):
    def __init__(
        self, cin: int, cout: int, blocks: int, stride: int, divisor: int, dilation: int = 1
    ) -> None:
        super().__init__(
            Bottleneck(cin if i == 0 else cout, cout, cout // divisor, stride if i == 0 else 1, dilation)
            for i in range(blocks)
        )
        self.stride = stride

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:  # type: ignore[override]
        for block in self:
            x = block(x, mask)
        return x


class Stem(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = Conv2d(3, channels, 7, stride=2, padding=3, bias=False, norm=channels)


class Backbone(nn.Module):
    """Stem and res2..res4, returning res4 (stride 16)."""

    def __init__(self, c: DetectorConfig) -> None:
        super().__init__()
        self.stem = Stem(c.stem_channels)
        r = c.res2_channels
        d = c.bottleneck_divisor
        self.res2 = Stage(c.stem_channels, r, c.blocks[0], 1, d)
        self.res3 = Stage(r, 2 * r, c.blocks[1], 2, d)
        self.res4 = Stage(2 * r, 4 * r, c.blocks[2], 2, d)

    def forward(self, x: Tensor, sizes: Tensor) -> tuple[Tensor, Tensor]:
        """``sizes`` (N, 2) valid (h, w) per image; returns res4 and its valid sizes."""
        x = self.stem.conv1.relu(x)
        sizes = (sizes + 1) // 2  # 7x7 stride-2 conv, padding 3
        x = nn.functional.max_pool2d(x * _mask(x, sizes), kernel_size=3, stride=2, padding=0, ceil_mode=True)
        sizes = _caffe_pool_size(sizes)
        for stage in (self.res2, self.res3, self.res4):
            if stage.stride == 2:
                sizes = (sizes + 1) // 2  # 1x1 stride-2 convolutions
            h, w = x.shape[2:]
            x = stage(
                x,
                _mask(
                    x, sizes, (h + stage.stride - 1) // stage.stride, (w + stage.stride - 1) // stage.stride
                ),
            )
        return x * _mask(x, sizes), sizes


def _caffe_pool_size(sizes: Tensor) -> Tensor:
    """Output extent of the 3x3 stride-2 ceil-mode max pool without padding."""
    out = torch.div(sizes - 2, 2, rounding_mode="floor") + 1  # ceil((s - 3) / 2) + 1
    return torch.where((out - 1) * 2 >= sizes, out - 1, out)


def _mask(x: Tensor, sizes: Tensor, height: int | None = None, width: int | None = None) -> Tensor:
    """(N, 1, H, W) ones inside each image's valid (h, w) and zeros in the padding, in ``x``'s dtype,
    for ``x``'s spatial size or the one given."""
    h = x.shape[-2] if height is None else height
    w = x.shape[-1] if width is None else width
    rows = torch.arange(h, device=x.device)[None, :] < sizes[:, :1]
    cols = torch.arange(w, device=x.device)[None, :] < sizes[:, 1:]
    return (rows[:, :, None] & cols[:, None, :])[:, None].to(x.dtype)


# -- proposals ---------------------------------------------------------------------------------------


class AnchorGenerator(nn.Module):
    def __init__(self, c: DetectorConfig) -> None:
        super().__init__()
        anchors = []
        for size in c.anchor_sizes:
            for ratio in c.anchor_ratios:
                w = math.sqrt(size**2 / ratio)
                h = ratio * w
                anchors.append([-w / 2, -h / 2, w / 2, h / 2])
        self.cell_anchors = nn.ParameterList([nn.Parameter(torch.tensor(anchors), requires_grad=False)])

    def grid(self, height: int, width: int, stride: int, device: torch.device) -> Tensor:
        """(H * W * A, 4) anchors, position-major then anchor, as the RPN's outputs are flattened."""
        ys = torch.arange(height, device=device, dtype=torch.float32) * stride
        xs = torch.arange(width, device=device, dtype=torch.float32) * stride
        sy, sx = torch.meshgrid(ys, xs, indexing="ij")
        shifts = torch.stack([sx, sy, sx, sy], dim=-1).reshape(-1, 1, 4)
        return (shifts + self.cell_anchors[0].float().to(device)[None]).reshape(-1, 4)


class RPNHead(nn.Module):
    def __init__(self, cin: int, hidden: int, anchors: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, hidden, 3, padding=1)
        self.objectness_logits = nn.Conv2d(hidden, anchors, 1)
        self.anchor_deltas = nn.Conv2d(hidden, anchors * 4, 1)


class RPN(nn.Module):
    def __init__(self, c: DetectorConfig) -> None:
        super().__init__()
        self.config = c
        self.anchor_generator = AnchorGenerator(c)
        self.rpn_head = RPNHead(4 * c.res2_channels, c.rpn_hidden, len(c.anchor_sizes) * len(c.anchor_ratios))

    def forward(self, res4: Tensor, valid: Tensor, image_sizes: Tensor) -> tuple[Tensor, Tensor]:
        """Each image's proposals, best first: (N, P, 4) x1, y1, x2, y2 in resized-image pixels, and (N,) how
        many are real (the rest are zeros); P is ``post_nms_topk`` unless fewer anchors fit in the batch.

        Candidates rank by objectness, ties by anchor index: the first ``pre_nms_topk`` of the anchors
        inside the image, decoded, clipped, without empty boxes, then greedy NMS (`_first_kept`)."""
        c = self.config
        t = torch.relu(self.rpn_head.conv(res4))
        n, a = res4.shape[0], self.rpn_head.objectness_logits.out_channels
        h, w = res4.shape[2:]
        logits = self.rpn_head.objectness_logits(t).float().permute(0, 2, 3, 1)  # N, H, W, A
        inside = _mask(res4, valid)[:, 0, :, :, None] > 0
        logits = logits.masked_fill(~inside, float("-inf")).reshape(n, -1)
        deltas = self.rpn_head.anchor_deltas(t).float().reshape(n, a, 4, h, w).permute(0, 3, 4, 1, 2)
        anchors = self.anchor_generator.grid(h, w, 16, res4.device)
        top = torch.sort(logits, dim=1, descending=True, stable=True).indices[:, : c.pre_nms_topk]
        deltas = deltas.reshape(n, -1, 4).gather(1, top[:, :, None].expand(-1, -1, 4))
        boxes = clip_boxes(apply_deltas(deltas, anchors[top]), image_sizes)
        candidates = torch.arange(top.shape[1], device=res4.device) < valid[:, :1] * valid[:, 1:] * a
        ok = candidates & ((boxes[..., 2] - boxes[..., 0]) > 0) & ((boxes[..., 3] - boxes[..., 1]) > 0)
        keep = _first_kept(boxes, logits.gather(1, top), ok, c.rpn_nms, c.post_nms_topk)
        count = keep.sum(dim=1)
        order = torch.sort(keep.byte(), dim=1, descending=True, stable=True).indices[:, : c.post_nms_topk]
        real = torch.arange(order.shape[1], device=res4.device) < count[:, None]
        return boxes.gather(1, order[:, :, None].expand(-1, -1, 4)) * real[:, :, None], count


_PREFIX = 8
"""`_first_kept` runs NMS on the first ``_PREFIX`` times ``limit`` candidates before it runs it on all."""


def _first_kept(boxes: Tensor, scores: Tensor, ok: Tensor, iou_threshold: float, limit: int) -> Tensor:
    """(N, n) mask of the first ``limit`` boxes greedy NMS keeps in each row of ``boxes`` (N, n, 4),
    whose ``scores`` are sorted (descending) and ``ok`` (N, n) marks real candidates.

    Greedy NMS decides a box from higher-ranked boxes alone, so once a prefix of the ranking keeps
    ``limit`` boxes, they are the whole list's first ``limit``: NMS runs on the first ``_PREFIX * limit``
    candidates, and on all of them only if some row needs more (one host synchronisation to decide)."""
    n = boxes.shape[1]
    prefix = min(n, _PREFIX * limit)
    keep = greedy_nms(boxes[:, :prefix], scores[:, :prefix], None, ok[:, :prefix], iou_threshold)
    if prefix < n and not bool(((keep.sum(dim=1) >= limit) | ~ok[:, prefix:].any(dim=1)).all()):
        keep = greedy_nms(boxes, scores, None, ok, iou_threshold)
    return keep & (keep.cumsum(dim=1) <= limit)


def apply_deltas(deltas: Tensor, boxes: Tensor, clamp: float = math.log(1000.0 / 16)) -> Tensor:
    """Box2BoxTransform with unit weights, on (..., 4): shift centres by (dx, dy) sizes, scale sizes by
    exp(dw, dh)."""
    widths, heights = boxes[..., 2] - boxes[..., 0], boxes[..., 3] - boxes[..., 1]
    cx, cy = boxes[..., 0] + 0.5 * widths, boxes[..., 1] + 0.5 * heights
    px, py = deltas[..., 0] * widths + cx, deltas[..., 1] * heights + cy
    pw = torch.exp(deltas[..., 2].clamp(max=clamp)) * widths
    ph = torch.exp(deltas[..., 3].clamp(max=clamp)) * heights
    return torch.stack([px - 0.5 * pw, py - 0.5 * ph, px + 0.5 * pw, py + 0.5 * ph], dim=-1)


def clip_boxes(boxes: Tensor, sizes: Tensor) -> Tensor:
    """Clip each image's (N, K, 4) x1, y1, x2, y2 to [0, w] x [0, h], ``sizes`` (N, 2) its (h, w)."""
    h, w = sizes[:, :1].float(), sizes[:, 1:].float()
    x1, y1, x2, y2 = (boxes[..., i].clamp(min=0) for i in range(4))
    return torch.stack([x1.minimum(w), y1.minimum(h), x2.minimum(w), y2.minimum(h)], dim=-1)


# -- region heads ------------------------------------------------------------------------------------


class BoxPredictor(nn.Module):
    """Object classes (background last), per-class box deltas, and attributes fed the best class."""

    def __init__(self, dim: int, classes: int, attrs: int) -> None:
        super().__init__()
        self.cls_score = nn.Linear(dim, classes + 1)
        self.bbox_pred = nn.Linear(dim, classes * 4)
        self.cls_embedding = nn.Embedding(classes + 1, dim // 8)
        self.fc_attr = nn.Linear(dim + dim // 8, dim // 4)
        self.attr_score = nn.Linear(dim // 4, attrs + 1)


class ROIHeads(nn.Module):
    def __init__(self, c: DetectorConfig) -> None:
        super().__init__()
        self.config = c
        self.res5 = Stage(
            4 * c.res2_channels, 8 * c.res2_channels, c.blocks[3], 1, c.bottleneck_divisor, dilation=2
        )
        self.box_predictor = BoxPredictor(8 * c.res2_channels, c.num_classes, c.num_attrs)

    def pool(self, res4: Tensor, proposals: Tensor) -> Tensor:
        """RoIPool of each image's (N, P, 4) proposals: (N * P, C, r, r), image-major, in the dtype res5
        computes in (autocast's, else float32) and laid out as `_layout` says, cast once instead of once
        in each of the two convolutions that read it (a res4 in that dtype is pooled as it is:
        `qace.features.ops.roi_pool`)."""
        n, p = proposals.shape[:2]
        image = torch.arange(n, device=res4.device, dtype=torch.float32).repeat_interleave(p)
        rois = torch.cat([image[:, None], proposals.reshape(-1, 4).float()], dim=1)
        autocast = torch.is_autocast_enabled(res4.device.type)
        dtype = torch.get_autocast_dtype(res4.device.type) if autocast else torch.float32
        res4 = res4 if res4.dtype == dtype else res4.float()
        x = roi_pool(res4, rois, self.config.pooler_resolution, 1.0 / 16)
        return x.to(dtype=dtype, memory_format=_layout(x.device))

    def forward(self, regions: Tensor) -> tuple[Tensor, Tensor]:
        """Pooled res5 features (K, D) and object logits (K, classes + 1) of `pool`'s regions."""
        pooled = self.res5(regions, None).mean(dim=(2, 3))
        return pooled, self.box_predictor.cls_score(pooled)


def select_regions(
    boxes: Tensor, probs: Tensor, count: Tensor, c: DetectorConfig
) -> tuple[Tensor, Tensor, Tensor]:
    """Each image's ``num_regions`` most confident boxes by class-wise NMS: (N, R) indices, scores and
    classes, R = min(num_regions, P), most confident first, ties by index.

    ``boxes`` (N, P, 4), ``probs`` (N, P, classes); the first ``count`` (N,) of each image are real. A
    box's confidence is its highest probability among the classes in which NMS keeps it (its class is
    that one's). (box, class) pairs rank by probability, ties by box then class; NMS decides a pair
    from higher pairs of its class alone, so only the ``pair_budget`` highest pairs are examined first,
    and the budget grows until each image with ``num_regions`` real boxes has that many confidences
    (exact then) or holds all its pairs. Images with fewer real boxes get no exact selection."""
    n, p, classes = probs.shape
    real = torch.arange(p, device=probs.device) < count[:, None]
    flat = probs.float().masked_fill(~real[:, :, None], -1.0).reshape(n, -1)
    values, pairs = torch.sort(flat, dim=1, descending=True, stable=True)
    budget = min(c.pair_budget, p * classes)
    while True:
        box, cls = pairs[:, :budget] // classes, pairs[:, :budget] % classes
        pair_boxes = boxes.gather(1, box[:, :, None].expand(-1, -1, 4))
        keep = greedy_nms(pair_boxes, values[:, :budget], cls, real.gather(1, box), c.class_nms, p)
        best = _best_kept_pair(keep, box, p)  # pairs are in rank order: a box's first kept is its best
        found = best < budget
        best = best.clamp(max=budget - 1)
        conf = torch.where(found, values.gather(1, best), 0.0)
        done = (
            (count < c.num_regions) | ((conf > 0).sum(dim=1) >= c.num_regions) | (count * classes <= budget)
        )
        if budget == p * classes or bool(done.all()):
            break
        budget = min(budget * 4, p * classes)
    order = torch.sort(conf, dim=1, descending=True, stable=True).indices[:, : c.num_regions]
    best_class = torch.where(found, cls.gather(1, best), 0)
    return order, conf.gather(1, order), best_class.gather(1, order)


def _best_kept_pair(keep: Tensor, box: Tensor, boxes: int) -> Tensor:
    """(N, boxes): the rank of each box's first kept pair (``keep`` and ``box`` (N, K) in rank order), K
    where it has none."""
    ranks = keep.shape[1]
    rank = torch.arange(ranks, device=keep.device).expand_as(box)
    first = torch.full((len(box), boxes), ranks, dtype=torch.long, device=box.device)
    return first.scatter_reduce(1, box, torch.where(keep, rank, ranks), reduce="amin")


class BottomUpDetector(nn.Module):
    """The whole detector; ``detect`` maps resized BGR images to `Detection` (or an error string)."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        super().__init__()
        self.config = config or DetectorConfig()
        self.backbone = Backbone(self.config)
        self.proposal_generator = RPN(self.config)
        self.roi_heads = ROIHeads(self.config)
        self._staging = _Staging()
        self._folds: dict[torch.dtype, list[tuple[Conv2d, tuple[Tensor, Tensor | None]]]] = {}
        """Per half-precision dtype, every `Conv2d` with its fold (`folds`), made at its first batch in it."""
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eval()

    @classmethod
    def from_pretrained(cls, source: str | Path = DEFAULT_DETECTOR) -> BottomUpDetector:
        """Load a directory holding ``pytorch_model.bin`` (and, for non-default sizes, ``qace-detector.json``)
        or a hub id, by the LXMERT demo's key names (old ``gamma``/``beta`` names are renamed)."""
        path = Path(source)
        if path.is_dir():
            weights = path / WEIGHTS_NAME
            if not weights.is_file():
                raise ModelNotFoundError(f"detector directory {str(path)!r} has no {WEIGHTS_NAME}")
            config_file = path / CONFIG_NAME
        else:
            try:
                from huggingface_hub import hf_hub_download

                weights = Path(hf_hub_download(str(source), WEIGHTS_NAME))
            except Exception as exc:  # noqa: BLE001 (offline, unknown id, no hub client: one message)
                raise ModelNotFoundError(
                    f"cannot load the detector {str(source)!r} ({exc}); download "
                    f"{DEFAULT_DETECTOR}'s {WEIGHTS_NAME} and pass its directory"
                ) from exc
            config_file = weights.parent / CONFIG_NAME
        config = DetectorConfig()
        if config_file.is_file():
            fields: dict[str, Any] = {
                k: tuple(v) if isinstance(v, list) else v
                for k, v in json.loads(config_file.read_text()).items()
            }
            try:
                config = DetectorConfig(**fields)
            except TypeError as exc:
                raise ConfigError(f"{config_file}: not a detector configuration ({exc})") from exc
        model = cls(config)
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_checkpoint(state, str(weights))
        return model.eval()

    def load_checkpoint(self, state: dict[str, Tensor], where: str) -> None:
        """Load a state dict by name; a missing or extra weight is an error naming it."""
        renamed = {k.replace("gamma", "weight").replace("beta", "bias"): v for k, v in state.items()}
        own = self.state_dict()
        missing = [k for k in own if k not in renamed and not k.endswith("num_batches_tracked")]
        unexpected = [k for k in renamed if k not in own]
        wrong = [k for k in own if k in renamed and tuple(renamed[k].shape) != tuple(own[k].shape)]
        if missing or unexpected or wrong:
            raise ConfigError(
                f"{where} does not fit the detector: missing {missing[:5]}, unexpected {unexpected[:5]}, "
                f"wrong shape {wrong[:5]} (of {len(missing)}, {len(unexpected)}, {len(wrong)})"
            )
        self.load_state_dict(renamed, strict=False)
        self._folds.clear()

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> BottomUpDetector:
        self._folds.clear()  # moved or cast: fold again from the new weights
        return super()._apply(fn, *args, **kwargs)

    @contextmanager
    def _folded(self, dtype: torch.dtype, device: torch.device) -> Iterator[None]:
        """Inside: on a GPU in half precision, every `Conv2d` with its batch norm folded in (see there);
        otherwise nothing changes. The folded weights are made from the weights at the first such batch
        (and again after `load_checkpoint` or a move), so weights changed in place later are not seen."""
        if device.type != "cuda" or dtype == torch.float32:
            yield
            return
        if dtype not in self._folds:
            self._folds[dtype] = self.folds(dtype)
        folds = self._folds[dtype]
        try:
            for conv, folded in folds:
                conv.folded = folded
            yield
        finally:
            for conv, _ in folds:
                conv.folded = None

    def folds(self, dtype: torch.dtype) -> list[tuple[Conv2d, tuple[Tensor, Tensor | None]]]:
        """Every `Conv2d` with its fold in ``dtype``: the stem's `Conv2d.fold`, the blocks'
        `Bottleneck.folds`."""
        blocks = [m for m in self.modules() if isinstance(m, Bottleneck)]
        folds = [fold for block in blocks for fold in block.folds(dtype)]
        done = {id(conv) for conv, _ in folds}
        rest = [m for m in self.modules() if isinstance(m, Conv2d) and id(m) not in done]
        return [(conv, conv.fold(dtype)) for conv in rest] + folds

    def placed(self, device: str) -> BottomUpDetector:
        """This model on ``device`` in eval mode, in `_layout` (channels-last on a GPU)."""
        model = self.to(device).to(memory_format=_layout(torch.device(device)))  # type: ignore[call-overload]
        return model.eval()

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``pytorch_model.bin`` and ``qace-detector.json`` (used for the tiny test detector)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), directory / WEIGHTS_NAME)
        (directory / CONFIG_NAME).write_text(json.dumps(asdict(self.config)))
        return directory

    @torch.no_grad()
    def detect_resized(
        self,
        images: Sequence[np.ndarray | Tensor],
        originals: list[tuple[int, int]],
        dtype: torch.dtype = torch.float32,
        on_stage: Callable[[str], None] | None = None,
    ) -> list[Detection | str]:
        """Regions of resized BGR uint8 images (`resize_for_detector`) with their original (width, height):
        `upload`, then `detect_uploaded`.

        ``dtype`` float32 is the exact mode; bfloat16/float16 run the convolutions and heads under
        autocast (features computed in that precision, returned as float32; RoIPool, a maximum, is exact
        in any; box decoding, class probabilities and NMS in float32). The whole batch goes through each
        stage at once and comes back to the host in one copy per output. ``on_stage``, if given, is called
        with each stage's name as it is issued (upload, backbone, rpn, roi_pool, res5, select, host): a
        profiler's hook."""
        batch, sizes = self.upload(images)
        (on_stage or _no_stage)("upload")
        return self.detect_uploaded(batch, sizes, images, originals, dtype, on_stage)

    @torch.no_grad()
    def upload(self, images: Sequence[np.ndarray | Tensor]) -> tuple[Tensor, Tensor]:
        """Resized BGR uint8 images as one padded, mean-subtracted batch on the detector's device and their
        (N, 2) valid (h, w) there (`_upload`), for `detect_uploaded`.

        On a GPU everything is queued on the calling thread's current stream without waiting for the GPU
        (the buffer the images pass through is reused once its previous copy has finished), so another
        thread may call this for the next batch while `detect_uploaded` runs on this one, provided both
        threads use the same stream (the default one, unless they set another) and only one thread
        uploads at a time."""
        return _upload(images, next(self.parameters()).device, self._staging)

    @torch.no_grad()
    def detect_uploaded(
        self,
        batch: Tensor,
        sizes: Tensor,
        images: Sequence[np.ndarray | Tensor],
        originals: list[tuple[int, int]],
        dtype: torch.dtype = torch.float32,
        on_stage: Callable[[str], None] | None = None,
    ) -> list[Detection | str]:
        """`detect_resized` on a batch from `upload` of ``images`` (whose shapes scale the boxes back)."""
        c = self.config
        device = batch.device
        stage = on_stage or _no_stage
        with (
            self._folded(dtype, device),
            torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32),
        ):
            res4, valid = self.backbone(batch, sizes)
            stage("backbone")
            proposals, count = self.proposal_generator(res4, valid, sizes)
            stage("rpn")
            regions = self.roi_heads.pool(res4, proposals)
            stage("roi_pool")
            pooled, logits = self.roi_heads(regions)
            stage("res5")
        n, p = proposals.shape[:2]
        probs = torch.softmax(logits.float(), dim=-1)[:, : c.num_classes].reshape(n, p, -1)
        order, scores, classes = select_regions(proposals, probs, count, c)
        boxes = proposals.gather(1, order[:, :, None].expand(-1, -1, 4))
        features = pooled.reshape(n, p, -1).gather(1, order[:, :, None].expand(-1, -1, pooled.shape[1]))
        stage("select")
        results = _detections(
            images,
            originals,
            count.cpu(),
            boxes.cpu(),
            features.float().cpu(),
            scores.cpu(),
            classes.cpu(),
            c,
        )
        stage("host")
        return results


def _no_stage(name: str) -> None:
    """`BottomUpDetector.detect_resized`'s default ``on_stage``: nothing."""


def _layout(device: torch.device) -> torch.memory_format:
    """The detector's memory format on ``device``: channels-last on a GPU (faster convolutions there)."""
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


class _Staging:
    """The host buffer `_upload` sends batches through, kept from batch to batch (allocating pinned memory
    each batch is slow) and grown when a batch needs more: pinned for a GPU. A batch's copy to the GPU is
    asynchronous, so the next batch waits for it (an event recorded after it) before filling the buffer
    again. The copy lands in a device tensor of its own, so the buffer is free once the copy is done,
    whatever the detector is still doing with earlier batches: one buffer serves any number of uploaded
    batches waiting for the detector (`qace.features.extract` uploads ahead of it). One uploading thread
    at a time: two threads uploading at once would fill the same buffer."""

    def __init__(self) -> None:
        self.buffer: Tensor | None = None
        self.sent: Any = None  # a torch.cuda.Event after the last copy out of ``buffer``, until waited on

    def __deepcopy__(self, memo: dict[int, Any]) -> _Staging:
        return _Staging()  # a copied detector gets a buffer of its own

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


def _upload(
    images: Sequence[np.ndarray | Tensor], device: torch.device, staging: _Staging | None = None
) -> tuple[Tensor, Tensor]:
    """The images zero-padded into one (N, 3, H, W) float32 batch on ``device`` (in `_layout`), the BGR
    mean subtracted inside each image, and their (N, 2) (h, w) there: one host-to-device copy of uint8
    through ``staging`` (a fresh one if None). The padding of the host buffer is left as it is: the mask
    below sets it to zero on the device."""
    staging = staging or _Staging()
    h, w = (max(im.shape[k] for im in images) for k in (0, 1))
    sizes = _small_to(torch.tensor([im.shape[:2] for im in images], dtype=torch.long), device)
    host = staging.host((len(images), h, w, 3), device)
    for i, im in enumerate(images):
        host[i, : im.shape[0], : im.shape[1]] = torch.as_tensor(im)
    pixels = staging.copy(host, device).permute(0, 3, 1, 2).float()
    mean = _small_to(torch.tensor(PIXEL_MEAN_BGR), device).view(1, 3, 1, 1)
    batch = torch.where(_mask(pixels, sizes) > 0, pixels - mean, 0.0)
    return batch.contiguous(memory_format=_layout(device)), sizes


def _small_to(values: Tensor, device: torch.device) -> Tensor:
    """A small host tensor on ``device``; to a GPU through pinned memory and asynchronously, so the caller
    does not wait for the work already queued there (a plain copy from pageable memory would: `upload`
    runs beside the detector). PyTorch's pinned-memory cache keeps the pinned copy until the transfer
    has finished."""
    if device.type != "cuda":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)


def _detections(
    images: Sequence[np.ndarray | Tensor],
    originals: list[tuple[int, int]],
    count: Tensor,
    boxes: Tensor,
    features: Tensor,
    scores: Tensor,
    classes: Tensor,
    c: DetectorConfig,
) -> list[Detection | str]:
    """Each image's `Detection` from the batch's selected regions on the host (boxes scaled back to the
    original image), or why there is none."""
    results: list[Detection | str] = []
    for i, (width, height) in enumerate(originals):
        if int(count[i]) < c.num_regions:
            results.append(f"the detector found {int(count[i])} regions, fewer than {c.num_regions}")
            continue
        scale = np.array([width / images[i].shape[1], height / images[i].shape[0]] * 2, dtype=np.float32)
        results.append(
            Detection(
                boxes=boxes[i].numpy() * scale,
                features=features[i].numpy(),
                scores=scores[i].numpy(),
                classes=classes[i].numpy(),
                width=width,
                height=height,
            )
        )
    return results
