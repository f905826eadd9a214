"""A tiny random-weight bottom-up-attention detector of the real architecture (tests and the one-command
CI check; its features mean nothing)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from qace.features.detector import BottomUpDetector, DetectorConfig


def make_test_detector(directory: str | Path, seed: int = 0) -> Path:
    """Write a random-weight detector of the real architecture at `DetectorConfig.tiny` sizes."""
    torch.manual_seed(seed)
    model = BottomUpDetector(DetectorConfig.tiny())
    with torch.no_grad():
        for m in model.modules():  # batch-norm statistics that keep activations in a sane range
            if isinstance(m, nn.BatchNorm2d) and m.running_var is not None and m.running_mean is not None:
                m.running_var.uniform_(0.5, 2.0)
                m.running_mean.normal_(0, 0.1)
    return model.save_pretrained(directory)
