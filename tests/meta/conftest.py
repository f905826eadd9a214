"""The shared human-judgment data, or a clean skip when this checkout has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from qace.meta.datasets import DATA_ENV, default_data_dir


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (or ``$QACE_SHARED_DATA``) holding flickr8k_expert/ and pascal50s/."""
    path = default_data_dir()
    missing = [d for d in ("flickr8k_expert", "pascal50s") if not (path / d).is_dir()]
    if missing:
        pytest.skip(
            f"shared data not found ({', '.join(missing)} missing under {path}); "
            f"set ${DATA_ENV} or check out ../shared/data to run the published-figure tests"
        )
    return path


@pytest.fixture(scope="session")
def java() -> None:
    """pycocoevalcap's tokenizer and METEOR run in Java; skip when there is none."""
    import shutil

    if shutil.which("java") is None:
        pytest.skip("Java is not on PATH; pycocoevalcap's PTB tokenizer and METEOR need it")
