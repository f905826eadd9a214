"""Data flows one way: lower layers never import higher ones (checked on the source with ``ast``)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "qace"
ABOVE_THE_ENGINE = ("qace.metric", "qace.models", "qace.export", "qace.judges")


def imports(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, at module level or inside functions."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_engine_imports_no_metric_model_family_or_exporter() -> None:
    offending = {
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in sorted((PACKAGE / "engine").rglob("*.py"))
        for name in imports(path)
        if name.startswith(ABOVE_THE_ENGINE)
    }
    assert not offending, sorted(offending)


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The check must catch the lazy imports a module hides in a function, not only the top ones."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from qace.metric.prompts import MAX_NEW_TOKENS\n    return 1\n")
    assert "qace.metric.prompts" in imports(module)
