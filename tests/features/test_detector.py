"""The bottom-up-attention detector, structurally: random weights of the real architecture at a tiny size.

Nothing here checks agreement with the real weights (none exist on this machine); see docs/features.md.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from qace.errors import ConfigError
from qace.features import half_roi_pool, ops
from qace.features.detector import (
    BottomUpDetector,
    Detection,
    DetectorConfig,
    ImageError,
    resize_for_detector,
)
from qace.features.detector import proposals as proposal_module
from qace.features.detector.backbone import Bottleneck, Conv2d
from qace.features.detector.heads import select_regions
from qace.features.detector.preprocess import Staging, upload_batch
from qace.features.detector.proposals import RPN, apply_deltas, clip_boxes
from qace.testing.detector import make_test_detector

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> BottomUpDetector:
    return BottomUpDetector.from_pretrained(make_test_detector(tmp_path_factory.mktemp("det")))


def _image(seed: int, width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, (height // 4 + 1, width // 4 + 1, 3), dtype=np.uint8)  # blocky: edges
    return Image.fromarray(np.kron(base, np.ones((4, 4, 1), np.uint8))[:height, :width])


def _detect(detector: BottomUpDetector, images: list[Image.Image]) -> list[Detection | str]:
    resized = [resize_for_detector(im, detector.config) for im in images]
    return detector.detect_resized([r[0] for r in resized], [(r[1], r[2]) for r in resized])


def test_shapes_dtypes_and_box_normalisation(detector: BottomUpDetector) -> None:
    (det,) = _detect(detector, [_image(0, 64, 48)])
    assert isinstance(det, Detection) and (det.width, det.height) == (64, 48)
    assert det.boxes.shape == (36, 4) and det.boxes.dtype == np.float32
    assert det.features.shape == (36, 2048) and det.features.dtype == np.float32
    assert (det.features >= 0).all()  # mean of ReLU outputs
    assert det.scores.shape == (36,) and det.classes.max() < detector.config.num_classes
    regions = det.regions()
    assert regions.shape == (36, 2054) and regions.dtype == np.float32
    norm = regions[:, 2048:].astype(np.float64)
    np.testing.assert_allclose(norm[:, :4], det.boxes / np.array([64, 48, 64, 48]), rtol=1e-6)
    np.testing.assert_allclose(norm[:, 4], norm[:, 2] - norm[:, 0], atol=1e-6)
    np.testing.assert_allclose(norm[:, 5], norm[:, 3] - norm[:, 1], atol=1e-6)
    assert (norm[:, :4] >= 0).all() and (norm[:, :4] <= 1 + 1e-6).all() and (norm[:, 4:] > 0).all()


def test_deterministic(detector: BottomUpDetector) -> None:
    first, second = _detect(detector, [_image(1, 70, 50)]), _detect(detector, [_image(1, 70, 50)])
    np.testing.assert_array_equal(first[0].regions(), second[0].regions())


def test_batch_invariance(detector: BottomUpDetector) -> None:
    """One image alone and in a batch of 8 of other sizes: the same boxes, features to fp32 rounding."""
    sizes = [(64, 48), (48, 64), (100, 40), (30, 90), (64, 64), (80, 50), (33, 44), (120, 90)]
    batch = [_image(10 + i, w, h) for i, (w, h) in enumerate(sizes)]
    together = _detect(detector, batch)
    for i in (0, 3, 7):
        (alone,) = _detect(detector, [batch[i]])
        np.testing.assert_allclose(alone.boxes, together[i].boxes, atol=1e-3)  # pixels
        np.testing.assert_array_equal(alone.classes, together[i].classes)
        np.testing.assert_allclose(alone.scores, together[i].scores, rtol=1e-5)
        np.testing.assert_allclose(alone.features, together[i].features, rtol=1e-4, atol=1e-5)


def _classwise_reference(
    boxes: torch.Tensor, probs: torch.Tensor, iou: float, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The release's generate_tsv.py selection, spelled out: per-class greedy NMS, max confidence; the
    k most confident boxes and each one's class."""
    n, classes = probs.shape
    conf, best = torch.zeros(n), torch.zeros(n, dtype=torch.long)
    for c in range(classes):
        order = torch.argsort(probs[:, c], descending=True, stable=True).tolist()
        kept: list[int] = []
        for i in order:
            if all(_iou(boxes[i], boxes[j]) <= iou for j in kept):
                kept.append(i)
                if probs[i, c] > conf[i]:
                    conf[i], best[i] = probs[i, c], c
    top = torch.argsort(conf, descending=True, stable=True)[:k]
    return top, best[top]


def _iou(a: torch.Tensor, b: torch.Tensor) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    area = lambda x: float((x[2] - x[0]) * (x[3] - x[1]))  # noqa: E731
    return inter / (area(a) + area(b) - inter)


@pytest.mark.parametrize("budget", [4, 10_000])
def test_selection_is_classwise_nms_ordered_by_confidence(budget: int) -> None:
    """The pair budget (grown as needed) gives exactly the exhaustive per-class selection, for each image
    of a batch whose images have different numbers of real boxes (the rest padding)."""
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(3, 60, 2, generator=g) * 80
    boxes = torch.cat([xy, xy + 5 + torch.rand(3, 60, 2, generator=g) * 40], dim=2)
    probs = torch.softmax(torch.randn(3, 60, 8, generator=g) * 3, dim=2)[:, :, :7]
    count = torch.tensor([60, 41, 52])
    config = replace(DetectorConfig.tiny(), pair_budget=budget, num_regions=36)
    order, scores, classes = select_regions(boxes, probs, count, config)
    for i, n in enumerate(count.tolist()):
        expected, expected_classes = _classwise_reference(boxes[i, :n], probs[i, :n], config.class_nms, 36)
        assert torch.equal(order[i], expected) and torch.equal(classes[i], expected_classes)
        assert (scores[i, :-1] >= scores[i, 1:]).all() and (scores[i] > 0).all()


def _rpn_one_image(
    rpn: RPN, objectness: torch.Tensor, deltas: torch.Tensor, valid: tuple[int, int], size: torch.Tensor
) -> torch.Tensor:
    """The RPN for one image written out from its head's outputs, ``objectness`` (A, H, W) and ``deltas``
    (4A, H, W): rank the anchors inside the image by objectness (ties by anchor index), decode, clip,
    drop empty boxes, reference NMS."""
    c, (h, w) = rpn.config, valid
    a, height, width = objectness.shape
    logits = objectness[:, :h, :w].permute(1, 2, 0).reshape(-1)
    inside = deltas.reshape(a, 4, height, width)[:, :, :h, :w].permute(2, 3, 0, 1).reshape(-1, 4)
    anchors = rpn.anchor_generator.grid(height, width, 16, deltas.device).reshape(height, width, a, 4)
    top = torch.argsort(logits, descending=True, stable=True)[: c.pre_nms_topk]
    boxes = clip_boxes(apply_deltas(inside[top], anchors[:h, :w].reshape(-1, 4)[top])[None], size[None])[0]
    ok = ((boxes[:, 2] - boxes[:, 0]) > 0) & ((boxes[:, 3] - boxes[:, 1]) > 0)
    boxes, scores = boxes[ok], logits[top][ok]
    keep = ops.batched_nms_reference(boxes, scores, torch.zeros(len(boxes), dtype=torch.long), c.rpn_nms)
    return boxes[keep[: c.post_nms_topk]]


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("prefix", [1, 8])
def test_batched_rpn_equals_one_image_at_a_time(
    monkeypatch: pytest.MonkeyPatch, tied: bool, prefix: int
) -> None:
    """Images of different valid sizes in one batch, objectness with or without ties, NMS first on a
    prefix of the ranking that is too short (1 x post_nms_topk: all rows fall back) or long enough."""
    monkeypatch.setattr(proposal_module, "_PREFIX", prefix)
    torch.manual_seed(5)
    rpn = RPN(replace(DetectorConfig.tiny(), pre_nms_topk=300, post_nms_topk=30)).eval()
    if tied:
        torch.nn.init.zeros_(rpn.rpn_head.objectness_logits.weight)
    res4 = torch.randn(3, 1024, 7, 9)
    valid = torch.tensor([[7, 9], [5, 6], [2, 3]])
    sizes = valid * 16 - 5
    with torch.no_grad():
        proposals, count = rpn(res4, valid, sizes)
        hidden = torch.relu(rpn.rpn_head.conv(res4))  # the whole batch's, as the RPN computes them
        objectness, deltas = rpn.rpn_head.objectness_logits(hidden), rpn.rpn_head.anchor_deltas(hidden)
        for i in range(3):
            expected = _rpn_one_image(rpn, objectness[i], deltas[i], tuple(valid[i].tolist()), sizes[i])
            assert int(count[i]) == len(expected) and torch.equal(proposals[i, : len(expected)], expected)
            assert not proposals[i, len(expected) :].any()  # padding is zeros


def test_pooled_regions_are_cast_once_to_the_autocast_dtype(detector: BottomUpDetector) -> None:
    """RoIPool runs in float32; under half-precision autocast its output is cast once, exactly as each
    convolution would have cast it; without autocast it is RoIPool's output as it is."""
    res4 = torch.randn(2, 1024, 6, 8)
    proposals = torch.tensor([[[0.0, 0, 40, 30], [10, 20, 90, 70]], [[5, 5, 120, 90], [0, 0, 0, 0]]])
    rois = torch.tensor([[0.0, 0, 0, 40, 30], [0, 10, 20, 90, 70], [1, 5, 5, 120, 90], [1, 0, 0, 0, 0]])
    pooled = ops.roi_pool(res4, rois, detector.config.pooler_resolution, 1 / 16)
    assert torch.equal(detector.roi_heads.pool(res4, proposals), pooled)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = detector.roi_heads.pool(res4, proposals)
    assert half.dtype == torch.bfloat16 and torch.equal(half, pooled.bfloat16())


def _uploads(device: str, staging: object) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of decreasing then increasing size through ``upload_batch``, each batch on the host
    afterwards."""
    rng = np.random.default_rng(7)
    shapes = [[(40, 60), (52, 30)], [(20, 24)], [(64, 80), (10, 90), (70, 12)], [(33, 47)]]
    batches = [[rng.integers(0, 255, (*hw, 3), dtype=np.uint8) for hw in shape] for shape in shapes]
    out = [upload_batch(images, torch.device(device), staging) for images in batches]
    return [(batch.cpu(), sizes.cpu()) for batch, sizes in out]


def test_upload_reuses_its_host_buffer_with_the_same_batches() -> None:
    """The staging buffer is kept from batch to batch, grown when needed, and its stale padding does
    not reach the batch: each batch equals one sent through a fresh buffer."""
    staging = Staging()
    shared = _uploads("cpu", staging)
    fresh = _uploads("cpu", None)
    for (batch, sizes), (alone, alone_sizes) in zip(shared, fresh, strict=True):
        assert torch.equal(batch, alone) and torch.equal(sizes, alone_sizes)
    assert staging.buffer is not None and staging.buffer.numel() == 3 * 70 * 90 * 3  # the largest batch
    assert copy.deepcopy(staging).buffer is None


@pytest.mark.gpu
def test_upload_through_a_pinned_buffer_on_cuda() -> None:
    staging = Staging()
    shared = _uploads("cuda", staging)
    assert staging.buffer is not None and staging.buffer.is_pinned()
    for (batch, sizes), (alone, alone_sizes) in zip(shared, _uploads("cpu", None), strict=True):
        assert torch.equal(batch, alone) and torch.equal(sizes, alone_sizes)


@pytest.mark.gpu
def test_detector_on_cuda(detector: BottomUpDetector) -> None:
    """fp32 and bf16 on a GPU (pinned upload, channels-last, torchvision's RoIPool where it loads): 36
    regions for every image of a batch; the pooled regions cast once, to bf16 and channels-last."""
    model = copy.deepcopy(detector).placed("cuda")
    sizes = [(64, 48), (48, 64), (100, 40), (120, 90)]
    resized = [resize_for_detector(_image(20 + i, w, h), model.config) for i, (w, h) in enumerate(sizes)]
    for dtype in (torch.float32, torch.bfloat16):
        found = model.detect_resized([r[0] for r in resized], [(r[1], r[2]) for r in resized], dtype=dtype)
        for det in found:
            assert isinstance(det, Detection) and det.regions().shape == (36, 2054)
            assert np.isfinite(det.regions()).all() and (det.scores[:-1] >= det.scores[1:]).all()
    res4 = torch.randn(2, 1024, 6, 8, device="cuda").contiguous(memory_format=torch.channels_last)
    proposals = torch.tensor([[[0.0, 0, 40, 30], [10, 20, 90, 70]], [[5, 5, 120, 90], [0, 0, 0, 0]]]).cuda()
    rois = torch.tensor(
        [[0.0, 0, 0, 40, 30], [0, 10, 20, 90, 70], [1, 5, 5, 120, 90], [1, 0, 0, 0, 0]]
    ).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        half = model.roi_heads.pool(res4, proposals)
    assert half.dtype == torch.bfloat16 and half.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(half, ops.roi_pool(res4, rois, model.config.pooler_resolution, 1 / 16).bfloat16())
    with torch.autocast("cuda", dtype=torch.bfloat16):  # a bf16 res4, as the backbone gives: pooled in bf16
        pooled = model.roi_heads.pool(res4.bfloat16(), proposals)
    assert pooled.dtype == torch.bfloat16 and pooled.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(pooled, half_roi_pool.roi_pool_half(res4.bfloat16(), rois, 2, 1 / 16))
    assert torch.equal(pooled, ops.roi_pool(res4.bfloat16().float(), rois, 2, 1 / 16).bfloat16())


def _convs(model: BottomUpDetector) -> list[Conv2d]:
    return [m for m in model.modules() if isinstance(m, Conv2d)]


def test_folded_batch_norms_compute_what_the_convolutions_and_norms_did(detector: BottomUpDetector) -> None:
    """Every batch norm folded into its convolution and each shortcut's bias moved into its block's
    conv3 (`BottomUpDetector.folds`, float32, on the CPU: the folded convolution, then ReLU and the
    residual sum): the same regions, features to fp32 rounding."""
    images = [_image(40 + i, w, h) for i, (w, h) in enumerate([(64, 48), (48, 64), (100, 40)])]
    expected = _detect(detector, images)
    model = copy.deepcopy(detector)
    assert any(not torch.allclose(c.norm.running_var, torch.ones(1)) for c in _convs(model) if c.norm)
    folds = dict(model.folds(torch.float32))
    assert set(folds) == set(_convs(model))
    blocks = [m for m in model.modules() if isinstance(m, Bottleneck)]
    shortcuts = [block.shortcut for block in blocks if block.shortcut is not None]
    assert len(shortcuts) == 4 and all(folds[s][1] is None for s in shortcuts)
    for conv, fold in folds.items():
        conv.folded = fold
    for det, ref in zip(_detect(model, images), expected, strict=True):
        assert isinstance(det, Detection) and isinstance(ref, Detection)
        np.testing.assert_allclose(det.boxes, ref.boxes, atol=1e-3)
        np.testing.assert_array_equal(det.classes, ref.classes)
        np.testing.assert_allclose(det.features, ref.features, rtol=1e-4, atol=1e-5)


def test_folding_is_for_half_precision_on_a_gpu_and_undone_after_the_batch(
    detector: BottomUpDetector,
) -> None:
    """`_folded` folds nothing in float32 or on a CPU; on a GPU in half precision it sets every
    convolution's fold inside and clears it after, keeps the folds per dtype, and drops them when the
    weights move or are loaded again."""
    model = copy.deepcopy(detector)
    for dtype, device in ((torch.float32, "cuda"), (torch.bfloat16, "cpu")):
        with model._folded(dtype, torch.device(device)):
            assert all(c.folded is None for c in _convs(model)) and not model._folds
    with model._folded(torch.bfloat16, torch.device("cuda")):  # folds on whatever device the weights are
        assert all(c.folded is not None and c.folded[0].dtype == torch.bfloat16 for c in _convs(model))
    assert all(c.folded is None for c in _convs(model)) and list(model._folds) == [torch.bfloat16]
    model.float()
    assert not model._folds


@pytest.mark.gpu
def test_fused_half_precision_is_as_close_to_fp32_as_autocast_alone(detector: BottomUpDetector) -> None:
    """On a GPU in bf16 and fp16, the backbone and res5 with folded batch norms and cuDNN's fused
    convolution-ReLU and convolution-add-ReLU kernels stay as close to fp32 as autocast without them
    (within twice its largest error): the fused kernels round once where autocast rounded after each
    pass."""
    model = copy.deepcopy(detector).placed("cuda")
    torch.manual_seed(3)
    images = torch.randn(3, 3, 96, 128, device="cuda").contiguous(memory_format=torch.channels_last) * 50
    sizes = torch.tensor([[96, 128], [80, 100], [64, 128]], device="cuda")
    regions = torch.randn(40, 1024, 14, 14, device="cuda").contiguous(memory_format=torch.channels_last)

    def run(dtype: torch.dtype, fused: bool) -> list[torch.Tensor]:
        folded = model._folded(dtype, torch.device("cuda")) if fused else contextlib.nullcontext()
        with torch.no_grad(), folded, torch.autocast("cuda", dtype=dtype):
            res4 = model.backbone(images, sizes)[0]
            return [res4.float(), model.roi_heads(regions.to(dtype))[0].float()]

    exact = run(torch.float32, False)
    for dtype in (torch.bfloat16, torch.float16):
        plain, fused = run(dtype, False), run(dtype, True)
        for e, p, f in zip(exact, plain, fused, strict=True):
            scale = e.abs().max()
            assert (f - e).abs().max() / scale <= 2 * (p - e).abs().max() / scale + 1e-3


def test_batches_uploaded_ahead_detect_as_they_do_one_call_at_a_time(detector: BottomUpDetector) -> None:
    """`detect_resized` is `upload` then `detect_uploaded`; uploading two more batches (through the same
    host buffer) before detecting the first changes nothing."""
    shapes = [[(64, 48), (48, 64)], [(100, 40)], [(120, 90), (64, 48), (40, 100)]]
    batches = [
        [resize_for_detector(_image(30 + 3 * k + i, w, h), detector.config) for i, (w, h) in enumerate(shape)]
        for k, shape in enumerate(shapes)
    ]
    alone = [detector.detect_resized([r[0] for r in b], [(r[1], r[2]) for r in b]) for b in batches]
    uploaded = [detector.upload([r[0] for r in b]) for b in batches]
    for (batch, sizes), resized, expected in zip(uploaded, batches, alone, strict=True):
        images, originals = [r[0] for r in resized], [(r[1], r[2]) for r in resized]
        found = detector.detect_uploaded(batch, sizes, images, originals)
        for det, ref in zip(found, expected, strict=True):
            assert isinstance(det, Detection) and isinstance(ref, Detection)
            np.testing.assert_array_equal(det.regions(), ref.regions())


def test_stages_are_reported_in_order(detector: BottomUpDetector) -> None:
    names: list[str] = []
    pixels, width, height = resize_for_detector(_image(6, 64, 48), detector.config)
    detector.detect_resized([pixels], [(width, height)], on_stage=names.append)
    assert names == ["upload", "backbone", "rpn", "roi_pool", "res5", "select", "host"]


def test_fewer_than_36_regions_is_reported_not_padded(tmp_path: Path) -> None:
    """The release wrote a shorter row; Visual-T5 needs 36, so such an image is an error."""
    model = BottomUpDetector(replace(DetectorConfig.tiny(), post_nms_topk=20)).eval()
    (result,) = _detect(model, [_image(2, 64, 48)])
    assert isinstance(result, str) and "found 20 regions, fewer than 36" in result


def test_tiny_and_odd_images(detector: BottomUpDetector) -> None:
    with pytest.raises(ImageError, match="5x40 pixels"):
        resize_for_detector(_image(3, 5, 40), detector.config)
    with pytest.raises(ImageError, match="too small or too thin"):
        resize_for_detector(_image(3, 2000, 40), detector.config)  # 1,000 px long, 20 px tall
    cmyk = _image(4, 64, 48).convert("CMYK")
    pixels, width, height = resize_for_detector(cmyk, detector.config)
    assert pixels.shape == (96, 128, 3) and pixels.dtype == np.uint8 and (width, height) == (64, 48)
    grey = resize_for_detector(_image(4, 64, 48).convert("L"), detector.config)[0]
    assert grey.shape == (96, 128, 3)


def test_preprocessing_resizes_as_documented() -> None:
    """Shorter side to 600, longer side at most 1,000, BGR channel order."""
    config = DetectorConfig()
    red = Image.new("RGB", (640, 480), (255, 0, 0))
    pixels, _, _ = resize_for_detector(red, config)
    assert pixels.shape == (600, 800, 3) and tuple(pixels[0, 0]) == (0, 0, 255)
    assert resize_for_detector(Image.new("RGB", (2000, 500)), config)[0].shape == (250, 1000, 3)


def test_state_dict_names_match_the_published_conversion() -> None:
    """Key names and shapes of unc-nlp/frcnn-vg-finetuned (LXMERT demo's modeling_frcnn.py)."""
    with torch.device("meta"):
        model = BottomUpDetector(DetectorConfig())
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = {
        "backbone.stem.conv1.weight": (64, 3, 7, 7),
        "backbone.stem.conv1.norm.running_var": (64,),
        "backbone.res2.0.shortcut.weight": (256, 64, 1, 1),
        "backbone.res2.0.conv1.norm.weight": (64,),
        "backbone.res3.3.conv3.weight": (512, 128, 1, 1),
        "backbone.res4.22.conv2.weight": (256, 256, 3, 3),
        "proposal_generator.anchor_generator.cell_anchors.0": (12, 4),
        "proposal_generator.rpn_head.conv.weight": (512, 1024, 3, 3),
        "proposal_generator.rpn_head.objectness_logits.weight": (12, 512, 1, 1),
        "proposal_generator.rpn_head.anchor_deltas.weight": (48, 512, 1, 1),
        "roi_heads.res5.0.shortcut.weight": (2048, 1024, 1, 1),
        "roi_heads.res5.2.conv2.weight": (512, 512, 3, 3),
        "roi_heads.box_predictor.cls_score.weight": (1601, 2048),
        "roi_heads.box_predictor.bbox_pred.weight": (6400, 2048),
        "roi_heads.box_predictor.cls_embedding.weight": (1601, 256),
        "roi_heads.box_predictor.fc_attr.weight": (512, 2304),
        "roi_heads.box_predictor.attr_score.weight": (401, 512),
    }
    for key, shape in expected.items():
        assert shapes.get(key) == shape, key
    assert not any(k.startswith("backbone.res5") for k in shapes)  # res5 runs per region, in the heads
    assert model.roi_heads.res5[0].conv2.dilation == (2, 2) and model.roi_heads.res5[0].conv1.stride == (1, 1)
    assert model.backbone.res3[0].conv1.stride == (2, 2)  # stride in the 1x1 (Caffe / MSRA)


def test_checkpoint_loading_renames_and_rejects(tmp_path: Path) -> None:
    source = BottomUpDetector(DetectorConfig.tiny())
    state = {k.replace("norm.weight", "norm.gamma").replace("norm.bias", "norm.beta"): v for k, v in
             source.state_dict().items() if not k.endswith("num_batches_tracked")}  # fmt: skip
    target = BottomUpDetector(DetectorConfig.tiny())
    target.load_checkpoint(state, "old-style checkpoint")
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key
    state.pop("roi_heads.box_predictor.cls_score.weight")
    with pytest.raises(ConfigError, match="missing.*cls_score.weight"):
        target.load_checkpoint(state, "broken checkpoint")


def _roi_pool_by_definition(x: torch.Tensor, rois: torch.Tensor, size: int, scale: float) -> torch.Tensor:
    """torchvision's roi_pool kernel written out bin by bin (float32 bin sizes, C round)."""
    f = np.float32
    out = torch.zeros(len(rois), x.shape[1], size, size)
    for k, (b, *coords) in enumerate(rois.numpy()):
        x0, y0, x1, y1 = (int(np.floor(f(v) * f(scale) + f(0.5))) for v in coords)
        bin_h, bin_w = f(max(y1 - y0 + 1, 1)) / f(size), f(max(x1 - x0 + 1, 1)) / f(size)
        for ph in range(size):
            hs = min(max(int(np.floor(f(ph) * bin_h)) + y0, 0), x.shape[2])
            he = min(max(int(np.ceil(f(ph + 1) * bin_h)) + y0, 0), x.shape[2])
            for pw in range(size):
                ws = min(max(int(np.floor(f(pw) * bin_w)) + x0, 0), x.shape[3])
                we = min(max(int(np.ceil(f(pw + 1) * bin_w)) + x0, 0), x.shape[3])
                if he > hs and we > ws:
                    out[k, :, ph, pw] = x[int(b), :, hs:he, ws:we].amax(dim=(1, 2))
    return out


def test_reference_operators_match_their_definitions() -> None:
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    pooled = ops.roi_pool_reference(x, torch.tensor([[0.0, 0, 0, 3, 3]]), 2, 1.0)
    assert pooled.flatten().tolist() == [5.0, 7.0, 13.0, 15.0]
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(2, 3, 9, 11, generator=g)
    xy = torch.rand(40, 2, generator=g) * 200 - 20  # some regions reach past the map, some lie outside
    rois = torch.cat(
        [torch.randint(0, 2, (40, 1), generator=g).float(), xy, xy + torch.rand(40, 2, generator=g) * 90], 1
    )
    for size in (2, 7):
        torch.testing.assert_close(
            ops.roi_pool_reference(feats, rois, size, 1 / 16),
            _roi_pool_by_definition(feats, rois, size, 1 / 16),
        )
    g = torch.Generator().manual_seed(1)
    xy = torch.rand(50, 2, generator=g) * 50
    boxes = torch.cat([xy, xy + 10 + torch.rand(50, 2, generator=g) * 20], 1)
    scores, groups = torch.rand(50, generator=g), torch.randint(0, 3, (50,), generator=g)
    keep = ops.batched_nms_reference(boxes, scores, groups, 0.4)
    expected: list[int] = []
    for i in torch.argsort(scores, descending=True).tolist():
        if all(groups[i] != groups[j] or _iou(boxes[i], boxes[j]) <= 0.4 for j in expected):
            expected.append(i)
    assert keep.tolist() == expected


@pytest.mark.skipif(ops.BACKEND != "torchvision", reason="torchvision's kernels do not load here")
def test_torchvision_and_reference_operators_agree() -> None:
    from torchvision.ops import batched_nms, roi_pool

    g = torch.Generator().manual_seed(2)
    x = torch.rand(2, 3, 20, 24, generator=g)
    xy = torch.rand(30, 2, generator=g) * 200
    rois = torch.cat([torch.randint(0, 2, (30, 1), generator=g).float(), xy, xy + 30], 1)
    torch.testing.assert_close(ops.roi_pool_reference(x, rois, 7, 1 / 16), roi_pool(x, rois, (7, 7), 1 / 16))
    scores, groups = torch.rand(30, generator=g), torch.randint(0, 4, (30,), generator=g)
    assert torch.equal(ops.batched_nms_reference(rois[:, 1:], scores, groups, 0.5),
                       batched_nms(rois[:, 1:], scores, groups, 0.5))  # fmt: skip


def test_anchor_cells_are_the_releases() -> None:
    """12 anchors: sizes 64..512 at aspect ratios 0.5, 1, 2, centred on the cell (area = size^2)."""
    cells = BottomUpDetector(DetectorConfig.tiny()).proposal_generator.anchor_generator
    full = type(cells)(DetectorConfig()).cell_anchors[0]
    areas = (full[:, 2] - full[:, 0]) * (full[:, 3] - full[:, 1])
    expected = torch.tensor([s**2 for s in (64, 128, 256, 512) for _ in range(3)], dtype=torch.float32)
    torch.testing.assert_close(areas, expected)
    torch.testing.assert_close(full[:, :2], -full[:, 2:])
    ratio = (full[:, 3] - full[:, 1]) / (full[:, 2] - full[:, 0])
    torch.testing.assert_close(ratio, torch.tensor([0.5, 1.0, 2.0] * 4))
    assert math.isclose(float(full[1, 2]), 32.0)
