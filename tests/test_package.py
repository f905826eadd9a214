"""The package's public names (`qace/__init__.py`): exported lazily, so ``import qace`` stays light."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import qace

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_first_line_imports_the_public_api() -> None:
    from qace import QACE, QACEReward, ScorerReward, score
    from qace.api import QACE as api_qace
    from qace.api import score as api_score
    from qace.reward import QACEReward as reward_qace
    from qace.reward import ScorerReward as reward_scorer

    assert (QACE, score, QACEReward, ScorerReward) == (api_qace, api_score, reward_qace, reward_scorer)
    assert {"QACE", "score", "QACEReward", "ScorerReward"} <= set(dir(qace)) & set(qace.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        qace.nothing_here  # noqa: B018
    with pytest.raises(ImportError):
        exec("from qace import nothing_here", {})


def _loaded_after(imports: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after ``import <imports>``."""
    probe = (
        f"import json, sys\nimport {imports}\n"
        f"print(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_plain_import_loads_no_api_torch_or_model_code() -> None:
    assert _loaded_after("qace", ("qace.api", "qace.reward", "torch", "transformers", "spacy")) == []


def test_host_processes_and_the_api_load_no_model_code() -> None:
    """A host process imports `qace.metric.host` (as does `qace.api`): transformers' modelling code
    (seconds of imports: torch._dynamo, DTensor) stays out of both; only loading a model brings it."""
    modules = ("transformers.modeling_utils", "qace.models.visual_t5")
    assert _loaded_after("qace.metric.host, qace.api", modules) == []
