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


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``qace/families/t5/decoder.py`` -> ``qace.families.t5.decoder``; a package's ``__init__`` is
    the package."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_edges(package: Path = PACKAGE) -> tuple[dict[str, set[str]], list[str]]:
    """Module -> the package's modules it imports (at module level, in functions or for type checking
    only): ``from a.b import c`` imports ``a.b.c`` when that is a module, else ``a.b``; and every name a
    module inside takes from the root package (``from qace import x``). The root (`qace/__init__.py`) is
    the front door, whose lazy exports reach the top API, so nothing inside may read from it: the version
    lives in a leaf (`qace._version`)."""
    paths = {module_name(path, package): path for path in package.rglob("*.py")}
    root = package.name
    edges: dict[str, set[str]] = {}
    from_root: list[str] = []
    for module, path in paths.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in paths)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in paths:
                        found.add(full)
                    elif node.module == root and module != root:
                        from_root.append(f"{module} imports {alias.name} from {root}")
                    elif node.module in paths:
                        found.add(node.module)
        edges[module] = found - {module, root}
    return edges, sorted(from_root)


def module_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (strongly connected), sorted."""
    reach = {start: _reachable(start, edges) for start in edges}
    groups = {frozenset({a} | {b for b in reach[a] if a in reach.get(b, ())}) for a in edges}
    return sorted(sorted(g) for g in groups if len(g) > 1)


def test_no_modules_import_each_other() -> None:
    """No import circle anywhere in the package, between modules of one layer included (the T5 decoder
    imports its graphed decoding, which names what it needs of a decoder as a protocol), and no module
    inside reads from the root package."""
    edges, from_root = module_edges()
    assert from_root == []
    assert module_cycles(edges) == []


def test_the_module_check_finds_a_circle_through_a_lazy_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg._version import __version__\n")
    (package / "_version.py").write_text("__version__ = '1'\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from pkg.sub.a import x\n")
    (package / "c.py").write_text(
        "from pkg import __version__\nfrom pkg._version import __version__\nimport pkg.sub.a\n"
    )
    edges, from_root = module_edges(package)
    assert edges["pkg.c"] == {"pkg.sub.a", "pkg._version"}
    assert edges["pkg"] == {"pkg._version"}
    assert from_root == ["pkg.c imports __version__ from pkg"]
    assert module_cycles(edges) == [["pkg.sub.a", "pkg.sub.b"]]


MAX_LINES = 600


def test_no_module_is_longer_than_600_lines() -> None:
    """A module over 600 lines holds more than one idea: split it."""
    long = {
        str(path.relative_to(PACKAGE.parent)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}
