"""The reference implementation must not import from ``qace`` (nor from modules that do), so that a bug
the engine shares with a helper cannot pass parity."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
REFERENCES = (BENCHMARKS / "reference.py", BENCHMARKS / "clip_reference.py")
"""QACE's reference and CLIP-S's (`benchmarks.clip_reference`)."""
FORBIDDEN = ("qace", "benchmarks")
"""``benchmarks`` too: its other modules import the engine."""


def forbidden_imports(source: str) -> list[str]:
    """Every module under ``FORBIDDEN`` that ``source`` imports, anywhere (also inside functions, and
    through ``importlib.import_module``/``__import__`` with a literal name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else ["<relative import>"]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names = [str(node.args[0].value)]
        else:
            continue
        found += [n for n in names if n == "<relative import>" or n.split(".")[0] in FORBIDDEN]
    return found


@pytest.mark.parametrize("reference", REFERENCES, ids=lambda p: p.name)
def test_reference_imports_nothing_from_qace(reference: Path) -> None:
    assert forbidden_imports(reference.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "source",
    [
        "import qace",
        "import numpy, qace.api as api",
        "from qace.metric.text import filter_stopwords",
        "def f():\n    from qace import QACE\n",
        "from benchmarks.workload import target_tokens",
        "from . import workload",
        "import importlib\nimportlib.import_module('qace.metric')",
    ],
)
def test_the_check_finds_every_kind_of_import(source: str) -> None:
    assert forbidden_imports(source)


def test_the_check_lets_other_imports_pass() -> None:
    assert forbidden_imports("import numpy as np\nfrom transformers import T5Config\nimport qacex") == []
