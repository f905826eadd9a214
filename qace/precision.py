"""The one precision table: the names users give (``--precision``) and the torch dtype each runs in.

Every module that turns a precision into a dtype reads it here (``int8``, the ONNX Runtime backend's
CPU quantisation, has no torch dtype and is not in it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from qace.errors import ConfigError

if TYPE_CHECKING:
    import torch

TORCH_PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""Precision name -> the name of its torch dtype (no torch import needed to check a name)."""


def check_precision(
    precision: str, allowed: Iterable[str] = TORCH_PRECISIONS, *, what: str = "precision"
) -> str:
    """``precision`` when it is one of ``allowed``; else `ConfigError` naming ``what`` and the choices."""
    choices = tuple(allowed)
    if precision not in choices:
        raise ConfigError(f"{what} {precision!r} is not available; use one of {', '.join(choices)}")
    return precision


def torch_dtype(
    precision: str, allowed: Iterable[str] = TORCH_PRECISIONS, *, what: str = "precision"
) -> torch.dtype:
    """The torch dtype of ``precision`` (checked against ``allowed`` first)."""
    import torch

    return getattr(torch, TORCH_PRECISIONS[check_precision(precision, allowed, what=what)])
