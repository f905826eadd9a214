"""The region proposal network on res4: anchors, objectness, box decoding and greedy NMS."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from qace.features.detector.backbone import valid_mask
from qace.features.detector.config import DetectorConfig
from qace.features.ops import greedy_nms


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
        inside = valid_mask(res4, valid)[:, 0, :, :, None] > 0
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
