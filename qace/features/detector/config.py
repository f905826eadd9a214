"""The detector's sizes and test-time settings, and the regions it returns for one image."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
