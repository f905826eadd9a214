"""The ResNet C4 backbone: convolutions with their frozen batch norms (folded into one kernel in half
precision on a GPU), bottleneck blocks, the stem and res2..res4, and the masks that keep each padded
image's activations to its own extent."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from qace.features.detector.config import DetectorConfig


def memory_layout(device: torch.device) -> torch.memory_format:
    """The detector's memory format on ``device``: channels-last on a GPU (faster convolutions there)."""
    return torch.channels_last if device.type == "cuda" else torch.contiguous_format


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
        x = nn.functional.max_pool2d(
            x * valid_mask(x, sizes), kernel_size=3, stride=2, padding=0, ceil_mode=True
        )
        sizes = _caffe_pool_size(sizes)
        for stage in (self.res2, self.res3, self.res4):
            if stage.stride == 2:
                sizes = (sizes + 1) // 2  # 1x1 stride-2 convolutions
            h, w = x.shape[2:]
            x = stage(
                x,
                valid_mask(
                    x, sizes, (h + stage.stride - 1) // stage.stride, (w + stage.stride - 1) // stage.stride
                ),
            )
        return x * valid_mask(x, sizes), sizes


def _caffe_pool_size(sizes: Tensor) -> Tensor:
    """Output extent of the 3x3 stride-2 ceil-mode max pool without padding."""
    out = torch.div(sizes - 2, 2, rounding_mode="floor") + 1  # ceil((s - 3) / 2) + 1
    return torch.where((out - 1) * 2 >= sizes, out - 1, out)


def valid_mask(x: Tensor, sizes: Tensor, height: int | None = None, width: int | None = None) -> Tensor:
    """(N, 1, H, W) ones inside each image's valid (h, w) and zeros in the padding, in ``x``'s dtype,
    for ``x``'s spatial size or the one given."""
    h = x.shape[-2] if height is None else height
    w = x.shape[-1] if width is None else width
    rows = torch.arange(h, device=x.device)[None, :] < sizes[:, :1]
    cols = torch.arange(w, device=x.device)[None, :] < sizes[:, 1:]
    return (rows[:, :, None] & cols[:, None, :])[:, None].to(x.dtype)
