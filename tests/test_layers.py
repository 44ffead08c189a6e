"""The import graph of dql_pass points downward only, lazy imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import dql_pass

PACKAGE = Path(dql_pass.__file__).parent

# Lowest first. A module imports only from lower layers, or from its own subpackage.
LAYERS = [
    ["errors", "metadata", "variants"],
    ["op"],
    ["reference", "catalogue", "compare"],
    ["onnxscript_bodies"],
    ["decomposition", "graph", "modelfiles"],
    ["runtimes"],
    ["expansion", "fusion"],
    ["lowering"],
    ["verification", "suites"],
    ["api"],
    ["__init__"],
    ["cli"],
    ["__main__"],
]
LAYER = {name: level for level, names in enumerate(LAYERS) for name in names}


def _unit(module: str) -> str:
    """The layer unit of a dotted module name below dql_pass: its top-level module or subpackage."""
    return module.split(".")[0] if module else "__init__"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dql_pass"):
            base = node.module.removeprefix("dql_pass").lstrip(".")
            found |= {_unit(base)} if base else {_unit(alias.name) for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {_unit(alias.name.removeprefix("dql_pass").lstrip(".")) for alias in node.names if alias.name.startswith("dql_pass.")}
    return found


def test_every_module_has_a_layer():
    units = {_unit(".".join(p.relative_to(PACKAGE).with_suffix("").parts)) for p in PACKAGE.rglob("*.py")}
    assert units == set(LAYER)


def test_imports_point_downward():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        unit = _unit(".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        for target in _imports(path) - {unit}:
            if LAYER[target] >= LAYER[unit]:
                upward.append(f"{path.relative_to(PACKAGE)} imports {target}")
    assert not upward, upward
