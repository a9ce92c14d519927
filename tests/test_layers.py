"""nest/ is layered (issue 23): a module imports only from its own layer or the layers below it.

Layers, lowest first: common (errors, the input boundary, atomic writes) < spec (catalogs,
settings, precision) < graph, network < costs < problem, profiling (the frozen Problem, plans,
the evaluator) < solver, planners < experiments, fidelity, reports < interfaces (CLI, export).
Checked on every import statement, module level and inside functions, from the source (ast), so a
new module placed in the wrong layer, or an upward import added anywhere, fails here. The few
lazy upward imports that exist are listed below with their reason, and the list is exact.
"""

from __future__ import annotations

import ast
from pathlib import Path

import nest

ROOT = Path(nest.__file__).resolve().parent
LAYER = {"common": 0, "schemas": 0, "spec": 1, "graph": 2, "network": 2, "costs": 3,
         "problem": 4, "profiling": 4, "solver": 5, "planners": 5, "experiments": 6,
         "fidelity": 6, "reports": 6, "interfaces": 7}
# (importing module, imported module): lazy imports inside a function, allowed with a reason
LAZY_UP = {
    # a model given as a Hugging Face config.json is read where the catalogs are read
    ("nest.spec.catalog", "nest.graph.hf_spec"),
    # a cluster file's `network:` section (builder or graph file) expands into levels on read
    ("nest.spec.catalog", "nest.network.fabric"),
}


def _imports(path: Path):
    """(imported nest module, is module level) for every import statement of a file."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("nest.") and (ROOT / name.split(".")[1]).exists():
                yield name, id(node) in top


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)


def test_every_module_sits_in_a_layer():
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules at nest/'s root, outside every layer: {loose}"
    packages = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert set(packages) <= set(LAYER), f"packages without a layer: {set(packages) - set(LAYER)}"


def test_no_module_imports_a_higher_layer():
    modules = {_module(p) for p in ROOT.rglob("*.py")}
    up, lazy = [], set()
    for path in sorted(ROOT.rglob("*.py")):
        mod = _module(path)
        if mod.split(".")[1] == "__init__":  # nest/__init__.py: the package itself, no layer
            continue
        here = LAYER[mod.split(".")[1]]
        for name, top in _imports(path):
            if LAYER[name.split(".")[1]] <= here:
                continue
            target = name if name in modules else name.rsplit(".", 1)[0]  # a name from a module
            if top:
                up.append((mod, target))
            else:
                lazy.add((mod, target))
    assert not up, f"module-level imports of a higher layer: {up}"
    assert lazy == LAZY_UP, f"lazy upward imports differ from the allowed list: {lazy ^ LAZY_UP}"


def test_the_layers_catch_an_upward_import(tmp_path):
    """The check itself: an upward import in a copy of a low-layer module is found."""
    src = (ROOT / "common" / "errors.py").read_text()
    bad = tmp_path / "errors.py"
    bad.write_text(src + "\nfrom nest.interfaces.cli import main  # noqa\n")
    found = [(n, top) for n, top in _imports(bad) if LAYER[n.split(".")[1]] > LAYER["common"]]
    assert ("nest.interfaces.cli", True) in found
