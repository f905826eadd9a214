"""The detector's two box operators: `roi_pool` and `greedy_nms`.

`roi_pool` is torchvision's compiled kernel when it loads (``pip install 'qace[features]'`` with a
torchvision built for the installed torch); otherwise an exact pure-PyTorch version of the same
definition runs, slower, so that the detector works wherever torch does. `BACKEND` says which.
`greedy_nms` is plain PyTorch on any device: greedy NMS of a whole batch at once, as a fixed point
(`batched_nms_reference` is its one-row definition, which the tests compare it with).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from qace.features import half_roi_pool


def _torchvision_roi_pool():  # noqa: ANN202
    try:
        from torchvision.ops import roi_pool

        # a torchvision built for another torch imports, then fails on its first kernel call
        roi_pool(torch.zeros(1, 1, 2, 2), torch.zeros(1, 5), (1, 1), 1.0)
    except (ImportError, RuntimeError, OSError):
        return None
    return roi_pool


_TV_ROI_POOL = _torchvision_roi_pool()
BACKEND = "torchvision" if _TV_ROI_POOL is not None else "torch"
"""What runs `roi_pool`: torchvision's kernel, or `roi_pool_reference` ("torch")."""


def roi_pool(features: Tensor, rois: Tensor, output_size: int, spatial_scale: float) -> Tensor:
    """Caffe's RoIPool (max over each bin; an empty bin gives 0): ``rois`` is (K, 5) of
    ``(batch index, x1, y1, x2, y2)`` in input pixels; returns (K, C, output_size, output_size) in
    ``features``' dtype.

    A half-precision map on a GPU is pooled as it is by one Triton kernel (`qace.features.half_roi_pool`,
    channels-last output); otherwise torchvision's kernel (or `roi_pool_reference` without it) pools a
    float32 copy, cast back. Both give the same values: a maximum of half values is one of them."""
    if half_roi_pool.fused_available(features):
        return half_roi_pool.roi_pool_half(features, rois, output_size, spatial_scale)
    pool = _TV_ROI_POOL if _TV_ROI_POOL is not None else _reference_pool
    return pool(features.float(), rois, (output_size, output_size), spatial_scale).to(features.dtype)


def _reference_pool(features: Tensor, rois: Tensor, size: tuple[int, int], spatial_scale: float) -> Tensor:
    """`roi_pool_reference` called as torchvision's kernel is."""
    return roi_pool_reference(features, rois, size[0], spatial_scale)


def roi_pool_reference(features: Tensor, rois: Tensor, output_size: int, spatial_scale: float) -> Tensor:
    """`roi_pool` in plain PyTorch, one region at a time (a masked max over its bins), with torchvision's
    arithmetic (float32 bin sizes, C ``round``) so that both put every bin edge on the same pixel."""
    _, channels, height, width = features.shape
    out = features.new_zeros((len(rois), channels, output_size, output_size))
    f32, size = np.float32, np.float32(output_size)
    steps = np.arange(output_size + 1, dtype=np.float32)
    for k, roi in enumerate(rois.float().cpu().numpy()):
        b, (x0, y0, x1, y1) = int(roi[0]), (int(np.floor(v * f32(spatial_scale) + f32(0.5))) for v in roi[1:])
        rows = _bins(steps * (f32(max(y1 - y0 + 1, 1)) / size), y0, height)
        cols = _bins(steps * (f32(max(x1 - x0 + 1, 1)) / size), x0, width)
        if rows is None or cols is None:
            continue  # every bin empty: zeros
        (r0, r1, row_in), (c0, c1, col_in) = rows, cols
        crop = features[b, :, r0:r1, c0:c1]
        row_in, col_in = row_in.to(crop.device), col_in.to(crop.device)
        low = torch.finfo(crop.dtype).min
        per_col = crop[:, :, None, :].masked_fill(~col_in[None, None], low).amax(dim=3)  # C, h, P
        pooled = per_col[:, None].masked_fill(~row_in[None, :, :, None], low).amax(dim=2)  # C, P, P
        empty = ~(row_in.any(1)[:, None] & col_in.any(1)[None, :])
        out[k] = pooled.masked_fill(empty[None], 0)
    return out


def _bins(points: np.ndarray, start: int, limit: int) -> tuple[int, int, Tensor] | None:
    """The span [first, last) the bins cover and each bin's membership mask (P, last - first), from the
    scaled bin boundaries shifted to the region and clipped; None when all bins are empty."""
    low = np.clip(np.floor(points[:-1]).astype(np.int64) + start, 0, limit)
    high = np.clip(np.ceil(points[1:]).astype(np.int64) + start, 0, limit)
    first, last = int(low.min()), int(high.max())
    if last <= first:
        return None
    span = np.arange(first, last)
    member = (span[None, :] >= low[:, None]) & (span[None, :] < high[:, None])
    return first, last, torch.from_numpy(member)


def batched_nms_reference(boxes: Tensor, scores: Tensor, groups: Tensor, iou_threshold: float) -> Tensor:
    """Greedy NMS of one list, the definition `greedy_nms` is tested against: within each group (boxes of
    different groups never suppress each other), by score descending, ties by lower index; returns the
    kept indices in that order. Vectorised: greedy NMS keeps box i exactly when no kept box ranked
    before it overlaps it, so iterating that rule from "keep all" fixes one more box in rank order per
    step and stops at the greedy result (in practice after a few steps)."""
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


_CHUNK = 1 << 24
"""IoUs `greedy_nms` computes at once (float32): its temporaries stay under a few hundred MB."""
_ROUND = 8
"""Fixed-point iterations of `greedy_nms` between two convergence tests (each a host synchronisation)."""


def greedy_nms(
    boxes: Tensor,
    scores: Tensor,
    groups: Tensor | None,
    valid: Tensor,
    iou_threshold: float,
    max_group: int | None = None,
) -> Tensor:
    """Greedy NMS of B independent rows at once: ``boxes`` (B, n, 4) x1, y1, x2, y2, ``scores`` (B, n),
    ``groups`` (B, n) integers (boxes of different groups never suppress each other; None: one group),
    ``valid`` (B, n) (an invalid box is neither kept nor suppresses); returns the (B, n) mask of
    kept boxes. A row's result is `batched_nms_reference`'s on its valid boxes: rank by score
    descending, ties by lower index. ``max_group`` must bound the valid boxes of one group in one row
    (default n): a box is compared with the ``max_group - 1`` boxes ranked just before it in its group.

    Memory: B x n x (max_group - 1) booleans, plus IoUs in chunks of `_CHUNK`. The host waits on the
    device once every `_ROUND` iterations of the fixed point, to test for convergence."""
    rows, n = valid.shape
    reach = min(n if max_group is None else max_group, n) - 1
    if rows == 0 or reach <= 0:
        return valid.clone()  # at most one box a group: nothing to suppress
    order = _rank_order(scores, groups, valid)
    ranked = boxes.float().gather(1, order[:, :, None].expand(-1, -1, 4))
    ranked_valid = valid.gather(1, order)
    ranked_groups = None if groups is None else groups.gather(1, order)
    suppress = _suppression(ranked, ranked_groups, ranked_valid, iou_threshold, reach)
    return torch.zeros_like(valid).scatter_(1, order, _fixed_point(suppress, ranked_valid))


def _rank_order(scores: Tensor, groups: Tensor | None, valid: Tensor) -> Tensor:
    """(B, n) positions sorted by group, then valid before invalid, then score descending, then index."""
    order = torch.sort(scores.float(), dim=1, descending=True, stable=True).indices
    key = (~valid).long() if groups is None else groups.long() * 2 + (~valid).long()
    return order.gather(1, torch.sort(key.gather(1, order), dim=1, stable=True).indices)


def _windows(x: Tensor, reach: int) -> Tensor:
    """(B, n, ..., reach) view of (B, n, ...) ``x``: entry [b, s, ..., w] is x[b, s - reach + w], zero
    (False) before the row's start."""
    padded = torch.cat([x.new_zeros((x.shape[0], reach, *x.shape[2:])), x], dim=1)
    return padded.unfold(1, reach, 1)[:, : x.shape[1]]


def _suppression(
    boxes: Tensor, groups: Tensor | None, valid: Tensor, iou_threshold: float, reach: int
) -> Tensor:
    """(B, n, reach) booleans: [b, s, w] when box s - reach + w of row b (ranked before s) suppresses box s:
    both valid, same group, IoU above the threshold (`batched_nms_reference`'s arithmetic)."""
    rows, n, _ = boxes.shape
    area = (boxes[..., 2] - boxes[..., 0]).clamp(min=0) * (boxes[..., 3] - boxes[..., 1]).clamp(min=0)
    earlier, earlier_area = _windows(boxes, reach).transpose(2, 3), _windows(area, reach)
    earlier_valid = _windows(valid, reach)
    earlier_groups = None if groups is None else _windows(groups, reach)
    suppress = torch.zeros((rows, n, reach), dtype=torch.bool, device=boxes.device)
    step = max(1, _CHUNK // (rows * reach))
    for start in range(0, n, step):
        stop = min(start + step, n)
        first = max(0, reach - stop + 1)  # window slots before the row's start for all of this chunk
        mine, theirs = boxes[:, start:stop, None], earlier[:, start:stop, first:]
        w = torch.minimum(mine[..., 2], theirs[..., 2]).sub_(torch.maximum(mine[..., 0], theirs[..., 0]))
        h = torch.minimum(mine[..., 3], theirs[..., 3]).sub_(torch.maximum(mine[..., 1], theirs[..., 1]))
        inter = w.clamp_(min=0).mul_(h.clamp_(min=0))
        union = (earlier_area[:, start:stop, first:] + area[:, start:stop, None]).sub_(inter)
        over = inter.div_(union) > iou_threshold
        over &= earlier_valid[:, start:stop, first:] & valid[:, start:stop, None]
        if groups is not None and earlier_groups is not None:
            over &= earlier_groups[:, start:stop, first:] == groups[:, start:stop, None]
        suppress[:, start:stop, first:] = over
    return suppress


def _fixed_point(suppress: Tensor, valid: Tensor) -> Tensor:
    """Iterate "keep box s iff it is valid and no kept box suppresses it" from "keep all valid" until it
    holds: since only earlier boxes suppress, step t fixes the boxes whose suppression chains are
    shorter than t, and the fixed point is the greedy result."""
    keep, reach = valid, suppress.shape[2]
    while True:
        for _ in range(_ROUND):
            keep, before = valid & ~(suppress & _windows(keep, reach)).any(dim=2), keep
        if torch.equal(keep, before):
            return keep
