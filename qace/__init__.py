"""QACE: question-answering caption evaluation, fast and deterministic.

The public API is exported lazily: ``from qace import QACE`` (or ``score``, ``QACEReward``,
``ScorerReward``) imports its module on first use, so a plain ``import qace`` (the command line does
one) loads no torch and no model code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from qace._version import __version__

_EXPORTS = {
    "QACE": "qace.api",
    "score": "qace.api",
    "QACEReward": "qace.reward",
    "ScorerReward": "qace.reward",
}
"""Public name -> the module that defines it."""

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from qace.api import QACE as QACE
    from qace.api import score as score
    from qace.reward import QACEReward as QACEReward
    from qace.reward import ScorerReward as ScorerReward


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (PEP 562)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'qace' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
