"""Shared fixtures. Keep this file small: one fixture per shared, expensive resource."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip on a host without CUDA (`pytest -m gpu` selects them on a GPU host)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="marked gpu: needs a CUDA GPU")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def test_models_dir() -> Path:
    """Tiny trained qg/tqa/vqa models, built once and cached (QACE_TEST_MODELS or .qace-cache/)."""
    from qace.testing.qace_models import make_test_models

    cache = Path(os.environ.get("QACE_TEST_MODELS") or REPO_ROOT / ".qace-cache" / "test-models")
    return make_test_models(cache)  # reuses a complete build; rebuilds a partial one


@pytest.fixture(scope="session")
def test_vlm_dir() -> Path:
    """The tiny LLaVA-style VLM (VisCE²'s judge), built once and cached (QACE_TEST_VLM or
    .qace-cache/test-vlm)."""
    from qace.testing.vlm import make_test_vlm

    return make_test_vlm(os.environ.get("QACE_TEST_VLM") or REPO_ROOT / ".qace-cache" / "test-vlm")


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight CLIP (the CLIP-S family's test model), built once."""
    pytest.importorskip("PIL")
    from qace.testing.clip import make_clip_test_model

    return make_clip_test_model(tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    """The test models are tiny: thread hand-offs cost more than they save (6x slower on 2 busy cores)."""
    import torch

    torch.set_num_threads(1)
