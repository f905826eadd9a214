"""Data flows one way: lower layers never import higher ones (checked on the source with ``ast``)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "qace"
ABOVE_THE_ENGINE = ("qace.metric", "qace.models", "qace.families", "qace.export", "qace.judges")


def imports(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, at module level or inside functions (``from qace
    import scorers`` imports ``qace.scorers``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "qace":
                found.update(f"qace.{alias.name}" for alias in node.names if not alias.name.startswith("_"))
    return found


def test_the_engine_imports_no_metric_model_family_or_exporter() -> None:
    offending = {
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in sorted((PACKAGE / "engine").rglob("*.py"))
        for name in imports(path)
        if name.startswith(ABOVE_THE_ENGINE)
    }
    assert not offending, sorted(offending)


def test_the_export_format_is_a_leaf() -> None:
    """The ONNX runtime (engine) and the exporter both read `qace.onnx_format`; it imports neither."""
    names = imports(PACKAGE / "onnx_format.py")
    assert {name for name in names if name.startswith("qace")} == {"qace.errors"}


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The check must catch the lazy imports a module hides in a function, not only the top ones, and
    modules imported from the package by name."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from qace.metric.prompts import MAX_NEW_TOKENS\n    return 1\n")
    assert "qace.metric.prompts" in imports(module)
    module.write_text("from qace import __version__, scorers\n")
    assert imports(module) == {"qace", "qace.scorers"}


def unit(module: str) -> str:
    """The layer a module belongs to: its subpackage (``qace.engine``) or top-level module (``qace.api``)."""
    return ".".join(module.split(".")[:2])


def layer_cycles() -> list[set[str]]:
    """Groups of layers that import each other, directly or around a loop (strongly connected)."""
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = unit(".".join(("qace", *path.relative_to(PACKAGE).with_suffix("").parts)))
        for name in imports(path):
            if name.startswith("qace.") and unit(name) != module:
                edges.setdefault(module, set()).add(unit(name))
    reach = {start: _reachable(start, edges) for start in edges}
    groups = {frozenset({a} | {b for b in reach[a] if a in reach.get(b, ())}) for a in edges}
    return [set(g) for g in groups if len(g) > 1]


def _reachable(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_layers_import_each_other() -> None:
    assert layer_cycles() == []
