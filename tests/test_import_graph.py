"""The `nest` package's module-level import graph has no cycle (issue 11).

Edges come from the `import` / `from ... import` statements that run when a module is imported:
the module body and the blocks nested in it (if / try / with / class bodies), not function bodies
and not `if TYPE_CHECKING:` blocks. Relative imports are resolved. Importing `a.b.c` also runs
`a/__init__.py` and `a/b/__init__.py`, so those packages are edges too, except the importer's own
enclosing packages (already being imported when its body runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

import nest

PACKAGE_DIR = Path(nest.__file__).resolve().parent


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(body: list[ast.stmt]):
    """Import statements executed at import time (no function bodies, no TYPE_CHECKING)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_nodes(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, None) or ():
                    yield from _import_nodes([child] if isinstance(child, ast.stmt)
                                             else child.body)


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(root: Path = PACKAGE_DIR) -> nx.DiGraph:
    """Module -> module it imports at module level, for every module of the package at `root`."""
    files = {_module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    g = nx.DiGraph()
    g.add_nodes_from(files)
    for mod, path in files.items():
        here = mod if mod in packages else mod.rpartition(".")[0]  # package of relative imports
        explicit: set[str] = set()  # the modules named
        implicit: set[str] = set()  # their enclosing packages, imported on the way
        for node in _import_nodes(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                parts = here.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] if node.level else [])
                base = ".".join(p for p in (base, node.module) if p)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base
                         for a in node.names]
            for name in names:
                explicit.add(name)
                implicit.update(_ancestors(name))
        own = set(_ancestors(mod))  # being imported already when this module's body runs
        deps = explicit | (implicit - own)
        g.add_edges_from((mod, d) for d in deps if d in files and d != mod)
    return g


def _cycles(g: nx.DiGraph, limit: int = 20) -> list[str]:
    """Each simple cycle as 'a -> b -> a', starting at its smallest module name."""
    out = []
    for cyc in nx.simple_cycles(g):
        i = cyc.index(min(cyc))
        cyc = cyc[i:] + cyc[:i]
        out.append(" -> ".join(cyc + cyc[:1]))
        if len(out) >= limit:
            break
    return sorted(out)


def test_nest_import_graph_is_acyclic():
    g = import_graph()
    assert g.number_of_nodes() > 20 and g.has_edge("nest.costs.table", "nest.costs.profiled")
    cycles = _cycles(g)
    assert not cycles, "import cycles in nest (module-level imports):\n  " + "\n  ".join(cycles)


def test_graph_builder_sees_what_runs_at_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import b\n")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from .sub import b\n"
        "if TYPE_CHECKING:\n    from pkg import c\n"
        "def f():\n    from pkg import c\n")
    (pkg / "sub" / "b.py").write_text("try:\n    from .. import c\nexcept ImportError:\n    pass\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    g = import_graph(pkg)
    assert set(g.edges) == {("pkg.a", "pkg.sub"), ("pkg.a", "pkg.sub.b"), ("pkg.sub", "pkg.sub.b"),
                            ("pkg.sub.b", "pkg.c"), ("pkg.c", "pkg.a")}
    assert _cycles(g) == ["pkg.a -> pkg.sub -> pkg.sub.b -> pkg.c -> pkg.a",
                          "pkg.a -> pkg.sub.b -> pkg.c -> pkg.a"]
