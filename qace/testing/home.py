"""Where test models built on demand are cached (``QACE_TEST_MODELS`` overrides); imports nothing of qace."""

from __future__ import annotations

import os
from pathlib import Path


def test_models_home() -> Path:
    """The cache folder of the test models the demos build (``QACE_TEST_MODELS``, else
    ``~/.cache/qace/test-models``)."""
    return Path(os.environ.get("QACE_TEST_MODELS", Path.home() / ".cache" / "qace" / "test-models"))
