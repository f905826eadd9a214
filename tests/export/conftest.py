"""Fixtures for the ONNX export tests (skipped cleanly where the ``onnx`` extra is not installed): a copy
of the test models, the models loaded, and their exports (fp32 for every role, fp16 for QG) once per
test module."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

ROLES = ("qg", "tqa", "vqa")


@pytest.fixture()
def models_copy(test_models_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the test models, so export-cache tests never touch the shared build."""
    out = tmp_path / "models"
    for role in ("qg", "tqa", "vqa"):
        shutil.copytree(test_models_dir / role, out / role, ignore=shutil.ignore_patterns("onnx"))
    return out


@pytest.fixture(scope="module")
def loaded(test_models_dir: Path) -> dict[str, Any]:
    """The test models of every role, loaded once per module."""
    from qace.models import loading

    def load(role: str) -> Any:
        if role == "vqa":
            return loading.load_visual_t5(test_models_dir / role)[0]
        return loading.load_seq2seq(str(test_models_dir / role), role=role)[0]

    return {role: load(role) for role in ROLES}


@pytest.fixture(scope="module")
def exports(loaded: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """Their exports once per module, by (role, variant): fp32 for every role, fp16 for QG."""
    from qace.export.exporter import export_model

    out = tmp_path_factory.mktemp("onnx-exports")
    made = {(role, "fp32"): export_model(loaded[role], out / role, variant="fp32").out_dir for role in ROLES}
    made["qg", "fp16"] = export_model(loaded["qg"], out / "qg-fp16", variant="fp16").out_dir
    return made
