"""The one precision table (`qace.precision`)."""

from __future__ import annotations

import pytest
import torch

from qace.errors import ConfigError
from qace.precision import TORCH_PRECISIONS, check_precision, torch_dtype


def test_every_name_maps_to_its_torch_dtype() -> None:
    assert {name: torch_dtype(name) for name in TORCH_PRECISIONS} == {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
    }


def test_a_name_outside_the_allowed_ones_is_an_error_naming_the_choices() -> None:
    assert check_precision("fp16", ("fp32", "fp16")) == "fp16"
    with pytest.raises(ConfigError, match="BERTScore precision .bf16. is not available; use one of fp32"):
        torch_dtype("bf16", ("fp32", "fp16"), what="BERTScore precision")
    with pytest.raises(ConfigError, match="'int8'"):  # the ONNX CPU quantisation has no torch dtype
        torch_dtype("int8")
