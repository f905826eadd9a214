"""The whole detector: its parts assembled, loaded from a checkpoint, and run stage by stage."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from qace.errors import ConfigError, ModelNotFoundError
from qace.features import DEFAULT_DETECTOR
from qace.features.detector.backbone import Backbone, Bottleneck, Conv2d, memory_layout
from qace.features.detector.config import Detection, DetectorConfig
from qace.features.detector.heads import ROIHeads, select_regions
from qace.features.detector.preprocess import Staging, upload_batch
from qace.features.detector.proposals import RPN

WEIGHTS_NAME = "pytorch_model.bin"
CONFIG_NAME = "qace-detector.json"


class BottomUpDetector(nn.Module):
    """The whole detector; ``detect`` maps resized BGR images to `Detection` (or an error string)."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        super().__init__()
        self.config = config or DetectorConfig()
        self.backbone = Backbone(self.config)
        self.proposal_generator = RPN(self.config)
        self.roi_heads = ROIHeads(self.config)
        self._staging = Staging()
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
        """This model on ``device`` in eval mode, in `memory_layout` (channels-last on a GPU)."""
        model = self.to(device).to(memory_format=memory_layout(torch.device(device)))  # type: ignore[call-overload]
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
        (N, 2) valid (h, w) there (`upload_batch`), for `detect_uploaded`.

        On a GPU everything is queued on the calling thread's current stream without waiting for the GPU
        (the buffer the images pass through is reused once its previous copy has finished), so another
        thread may call this for the next batch while `detect_uploaded` runs on this one, provided both
        threads use the same stream (the default one, unless they set another) and only one thread
        uploads at a time."""
        return upload_batch(images, next(self.parameters()).device, self._staging)

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
