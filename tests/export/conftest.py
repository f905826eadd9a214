"""Fixtures for the ONNX export tests: skip cleanly where the ``onnx`` extra is not installed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


@pytest.fixture()
def models_copy(test_models_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the test models, so export-cache tests never touch the shared build."""
    out = tmp_path / "models"
    for role in ("qg", "tqa", "vqa"):
        shutil.copytree(test_models_dir / role, out / role, ignore=shutil.ignore_patterns("onnx"))
    return out
