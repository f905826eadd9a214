"""The bottom-up-attention Faster R-CNN (Anderson et al. 2018) that made the release's region features.

Architecture (`DetectorConfig`'s defaults): a ResNet-101 C4 backbone (Caffe-style stem, stride in the
1x1 convolutions, frozen batch norm), a region proposal network on res4 (512 hidden channels, 12
anchors: sizes 64-512 at ratios 0.5, 1, 2), RoIPool 14x14 at 1/16, res5 with stride 1 and dilation 2
run per region and mean-pooled to 2,048 values, then Visual Genome heads: 1,600 object classes plus
background (last) and 400 attributes. Module and parameter names are those of the public PyTorch
conversion ``unc-nlp/frcnn-vg-finetuned`` (the LXMERT demo's ``modeling_frcnn.py``), so its
``pytorch_model.bin`` loads as it is (`BottomUpDetector.from_pretrained`).

One module a part: `config` (sizes, the `Detection` a detector returns), `preprocess` (resizing, the
batch upload), `backbone` (stem and res2..res4), `proposals` (the RPN), `heads` (RoIPool, res5, the
class-wise region selection), `model` (the whole detector, its loading and its stages). This package
exports what callers use; the parts import each other one way (config, backbone, preprocess,
proposals, heads, model).

Batching: images of different sizes are zero-padded into one tensor; activations beyond each image's
own extent are zeroed before every spatial convolution and the proposal network ignores anchors
there, so an image gets the same regions alone as in any batch (features equal to fp32 rounding).
"""

from qace.features.detector.config import Detection, DetectorConfig
from qace.features.detector.model import BottomUpDetector
from qace.features.detector.preprocess import ImageError, resize_for_detector

__all__ = ["BottomUpDetector", "Detection", "DetectorConfig", "ImageError", "resize_for_detector"]
