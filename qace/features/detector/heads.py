"""The region heads: RoIPool of the proposals, res5 and the Visual Genome classes, and region selection.

Region selection follows the release's ``generate_tsv.py`` with 36 boxes: the boxes are the RPN
proposals the features were pooled from; each is scored by class-wise NMS (IoU 0.3, per object
class, background excluded): its confidence is its highest class probability among the classes
in which it survives; the 36 most confident are kept, most confident first (ties by proposal
rank). The release's score threshold (0.2) plays no part when exactly 36 are kept. An image with
fewer than 36 proposals yields fewer boxes; the release then wrote a shorter row, and Visual-T5
needs 36, so `BottomUpDetector.detect_resized` reports such an image as an error instead of padding it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qace.features.detector.backbone import Stage, memory_layout
from qace.features.detector.config import DetectorConfig
from qace.features.ops import greedy_nms, roi_pool


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
        computes in (autocast's, else float32) and laid out as `memory_layout` says, cast once instead of once
        in each of the two convolutions that read it (a res4 in that dtype is pooled as it is:
        `qace.features.ops.roi_pool`)."""
        n, p = proposals.shape[:2]
        image = torch.arange(n, device=res4.device, dtype=torch.float32).repeat_interleave(p)
        rois = torch.cat([image[:, None], proposals.reshape(-1, 4).float()], dim=1)
        autocast = torch.is_autocast_enabled(res4.device.type)
        dtype = torch.get_autocast_dtype(res4.device.type) if autocast else torch.float32
        res4 = res4 if res4.dtype == dtype else res4.float()
        x = roi_pool(res4, rois, self.config.pooler_resolution, 1.0 / 16)
        return x.to(dtype=dtype, memory_format=memory_layout(x.device))

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
