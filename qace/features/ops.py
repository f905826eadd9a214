"""The detector's two box operators: `roi_pool` and `batched_nms`.

torchvision's compiled kernels are used when they load (``pip install 'qace[features]'`` with a
torchvision built for the installed torch); otherwise exact pure-PyTorch versions of the same
definitions run, slower, so that the detector works wherever torch does. `BACKEND` says which.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _torchvision_ops():  # noqa: ANN202
    try:
        from torchvision.ops import batched_nms, roi_pool

        # a torchvision built for another torch imports, then fails on its first kernel call
        roi_pool(torch.zeros(1, 1, 2, 2), torch.zeros(1, 5), (1, 1), 1.0)
        batched_nms(torch.zeros(1, 4), torch.zeros(1), torch.zeros(1, dtype=torch.long), 0.5)
    except (ImportError, RuntimeError, OSError):
        return None
    return roi_pool, batched_nms


_TV = _torchvision_ops()
BACKEND = "torchvision" if _TV is not None else "torch"


def roi_pool(features: Tensor, rois: Tensor, output_size: int, spatial_scale: float) -> Tensor:
    """Caffe's RoIPool (max over each bin; an empty bin gives 0): ``rois`` is (K, 5) of
    ``(batch index, x1, y1, x2, y2)`` in input pixels; returns (K, C, output_size, output_size)."""
    if _TV is not None:
        return _TV[0](features, rois, (output_size, output_size), spatial_scale)
    return roi_pool_reference(features, rois, output_size, spatial_scale)


def roi_pool_reference(features: Tensor, rois: Tensor, output_size: int, spatial_scale: float) -> Tensor:
    """`roi_pool` in plain PyTorch, one region at a time (torchvision's ``roi_pool`` definition)."""
    _, channels, height, width = features.shape
    out = features.new_zeros((len(rois), channels, output_size, output_size))
    for k, (b, x1, y1, x2, y2) in enumerate(rois.tolist()):
        x0, y0 = round(x1 * spatial_scale), round(y1 * spatial_scale)
        roi_w = max(round(x2 * spatial_scale) - x0 + 1, 1)
        roi_h = max(round(y2 * spatial_scale) - y0 + 1, 1)
        image = features[int(b)]
        for ph in range(output_size):
            hs = min(max(math.floor(ph * roi_h / output_size) + y0, 0), height)
            he = min(max(math.ceil((ph + 1) * roi_h / output_size) + y0, 0), height)
            if he <= hs:
                continue
            rows = image[:, hs:he]
            for pw in range(output_size):
                ws = min(max(math.floor(pw * roi_w / output_size) + x0, 0), width)
                we = min(max(math.ceil((pw + 1) * roi_w / output_size) + x0, 0), width)
                if we > ws:
                    out[k, :, ph, pw] = rows[:, :, ws:we].amax(dim=(1, 2))
    return out


def batched_nms(boxes: Tensor, scores: Tensor, groups: Tensor, iou_threshold: float) -> Tensor:
    """Greedy NMS within each group (boxes of different groups never suppress each other); returns the
    kept indices by decreasing score."""
    if _TV is not None:
        return _TV[1](boxes.float(), scores.float(), groups, iou_threshold)
    return batched_nms_reference(boxes, scores, groups, iou_threshold)


def batched_nms_reference(boxes: Tensor, scores: Tensor, groups: Tensor, iou_threshold: float) -> Tensor:
    """`batched_nms` in plain PyTorch, vectorised: greedy NMS keeps box i exactly when no kept box
    ranked before it overlaps it, so iterating that rule from "keep all" fixes one more box in rank
    order per step and stops at the greedy result (in practice after a few steps)."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.long, device=boxes.device)
    order = torch.sort(scores.float(), descending=True, stable=True).indices
    b = boxes.float()[order]
    area = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lt = torch.maximum(b[:, None, :2], b[None, :, :2])
    rb = torch.minimum(b[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    iou = inter / (area[:, None] + area[None, :] - inter)
    g = groups[order]
    n = len(b)
    suppresses = (iou > iou_threshold) & (g[:, None] == g[None, :])
    suppresses &= torch.ones(n, n, dtype=torch.bool, device=b.device).triu(diagonal=1)  # earlier -> later
    keep = torch.ones(n, dtype=torch.bool, device=b.device)
    for _ in range(n):
        new = ~(suppresses & keep[:, None]).any(dim=0)
        if torch.equal(new, keep):
            break
        keep = new
    return order[keep]
