"""Optional extras (``pip install 'qace[name]'``): whether one is installed here, without importing it."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from qace.errors import BackendUnavailableError


def require_extra(extra: str, modules: Iterable[str], needed_by: str) -> None:
    """Raise `BackendUnavailableError` naming ``needed_by``, the absent modules and the exact install
    line when any of ``modules`` (top-level names the extra installs) cannot be imported here."""
    missing = [name for name in modules if not _importable(name)]
    if missing:
        raise BackendUnavailableError(
            f"{needed_by} needs the {extra!r} extra, which is not installed here (no module "
            f"{', '.join(missing)}); install it with: pip install 'qace[{extra}]'"
        )


def _importable(name: str) -> bool:
    """Whether ``import name`` can find the module (a module set to None in sys.modules cannot)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
