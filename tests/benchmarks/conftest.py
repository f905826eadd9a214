"""The tiny benchmark models, built once per session from the Flickr8k-Expert workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import SHARED_DATA


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (SHARED_DATA / "flickr8k_expert").is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    from benchmarks.workload import build_tiny_models, flickr_workload

    out = tmp_path_factory.mktemp("bench") / "tiny-models"
    return build_tiny_models(out, flickr_workload(SHARED_DATA))
