"""`ops.greedy_nms` (whole batches, a fixed point) against `ops.batched_nms_reference` row by row, and
against torchvision's kernel where it loads."""

from __future__ import annotations

import pytest
import torch

from qace.features import ops


def _boxes(g: torch.Generator, rows: int, n: int, spread: float = 100.0) -> torch.Tensor:
    xy = torch.rand(rows, n, 2, generator=g) * spread
    return torch.cat([xy, xy + 1 + torch.rand(rows, n, 2, generator=g) * 40], dim=2)


def _by_reference(
    boxes: torch.Tensor, scores: torch.Tensor, groups: torch.Tensor | None, valid: torch.Tensor, iou: float
) -> torch.Tensor:
    """`batched_nms_reference` on each row's valid boxes, as a (B, n) mask."""
    keep = torch.zeros_like(valid)
    for b in range(len(valid)):
        index = valid[b].nonzero().flatten()
        group = groups[b, index] if groups is not None else torch.zeros(len(index), dtype=torch.long)
        keep[b, index[ops.batched_nms_reference(boxes[b, index], scores[b, index], group, iou)]] = True
    return keep


@pytest.mark.parametrize(("chunk", "round_"), [(1 << 24, 8), (7, 1), (300, 3)])
def test_greedy_nms_equals_the_reference(monkeypatch: pytest.MonkeyPatch, chunk: int, round_: int) -> None:
    """Random rows with groups, tied scores and invalid boxes; IoUs in chunks of any size, convergence
    tested after any number of iterations."""
    monkeypatch.setattr(ops, "_CHUNK", chunk)
    monkeypatch.setattr(ops, "_ROUND", round_)
    g = torch.Generator().manual_seed(0)
    for trial in range(60):
        rows, n = int(torch.randint(1, 4, (), generator=g)), int(torch.randint(1, 70, (), generator=g))
        boxes = _boxes(g, rows, n)
        scores = (
            torch.randint(0, 6, (rows, n), generator=g).float()
            if trial % 2
            else torch.rand(rows, n, generator=g)
        )
        groups = torch.randint(0, 4, (rows, n), generator=g) if trial % 3 else None
        valid = torch.rand(rows, n, generator=g) > 0.2
        iou = 0.1 + 0.7 * float(torch.rand((), generator=g))
        max_group = None
        if groups is not None and trial % 4:  # the tightest bound the contract allows
            max_group = int((torch.nn.functional.one_hot(groups) * valid[:, :, None]).sum(dim=1).max())
        keep = ops.greedy_nms(boxes, scores, groups, valid, iou, max_group)
        assert torch.equal(keep, _by_reference(boxes, scores, groups, valid, iou)), trial


def test_greedy_nms_edge_cases() -> None:
    g = torch.Generator().manual_seed(1)
    for rows, n in ((2, 0), (0, 5), (3, 1)):
        valid = torch.ones(rows, n, dtype=torch.bool)
        keep = ops.greedy_nms(_boxes(g, rows, n), torch.rand(rows, n, generator=g), None, valid, 0.5)
        assert keep.shape == (rows, n) and torch.equal(keep, valid)
    same = torch.tensor([[10.0, 10, 50, 50]]).repeat(1, 6, 1)
    scores = torch.tensor([[0.1, 0.9, 0.3, 0.9, 0.2, 0.0]])
    valid = torch.ones(1, 6, dtype=torch.bool)
    all_but_one = ops.greedy_nms(same, scores, None, valid, 0.5)
    assert all_but_one.nonzero()[:, 1].tolist() == [1]  # the best; of the tied two, the lower index
    groups = torch.arange(6)[None]
    assert ops.greedy_nms(same, scores, groups, valid, 0.5, max_group=1).all()  # each its own group
    assert ops.greedy_nms(same, scores, groups, valid, 0.5).all()
    nothing = torch.zeros(1, 6, dtype=torch.bool)
    assert not ops.greedy_nms(same, scores, None, nothing, 0.5).any()
    first_invalid = valid.clone()
    first_invalid[0, 1] = False  # an invalid box suppresses nothing: the other 0.9 is kept
    assert ops.greedy_nms(same, scores, None, first_invalid, 0.5).nonzero()[:, 1].tolist() == [3]


@pytest.mark.gpu
def test_greedy_nms_on_cuda_equals_the_cpu() -> None:
    """The same elementwise arithmetic on both devices: the same masks, tied scores included."""
    g = torch.Generator().manual_seed(3)
    boxes, scores = _boxes(g, 4, 500, spread=80.0), torch.randint(0, 20, (4, 500), generator=g).float()
    groups, valid = torch.randint(0, 6, (4, 500), generator=g), torch.rand(4, 500, generator=g) > 0.1
    for iou in (0.3, 0.7):
        on_cpu = ops.greedy_nms(boxes, scores, groups, valid, iou)
        on_cuda = ops.greedy_nms(boxes.cuda(), scores.cuda(), groups.cuda(), valid.cuda(), iou)
        assert torch.equal(on_cuda.cpu(), on_cpu)


@pytest.mark.skipif(ops.BACKEND != "torchvision", reason="torchvision's kernels do not load here")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_greedy_nms_equals_torchvision(device: str) -> None:
    """Distinct scores (torchvision's sort is not stable), dense overlaps, several groups."""
    from torchvision.ops import batched_nms

    g = torch.Generator().manual_seed(2)
    boxes, scores = _boxes(g, 3, 300, spread=60.0).to(device), torch.rand(3, 300, generator=g).to(device)
    groups = torch.randint(0, 5, (3, 300), generator=g).to(device)
    valid = torch.ones(3, 300, dtype=torch.bool, device=device)
    for iou in (0.3, 0.7):
        keep = ops.greedy_nms(boxes, scores, groups, valid, iou)
        for b in range(3):
            expected = batched_nms(boxes[b], scores[b], groups[b], iou)
            assert keep[b].nonzero().flatten().tolist() == sorted(expected.tolist())
