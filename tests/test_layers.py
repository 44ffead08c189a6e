"""The import graph of dql_pass points downward only, lazy imports included; and a concept that
has one home does not get a second one that these checks know of (the variant list, the input-class
vocabulary, site slicing, safe writing)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import dql_pass
from dql_pass import inputs, variants
from dql_pass.lowering import rules

PACKAGE = Path(dql_pass.__file__).parent
TOOLS = PACKAGE.parent / "tools"

# Lowest first. A module imports only from lower layers, or from its own subpackage.
LAYERS = [
    ["blocking", "errors", "interrupts", "lazy", "metadata", "variants"],
    ["op"],
    ["reference", "compare"],
    ["inputs", "onnxscript_bodies"],
    ["decomposition", "graph", "files"],
    ["runtimes"],
    ["expansion", "fusion"],
    ["lowering"],
    ["verification", "suites"],
    ["api", "advice", "deployment"],
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
            found |= {_unit(alias.name.removeprefix("dql_pass").lstrip(".")) for alias in node.names
                      if alias.name.startswith("dql_pass.")}
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


# -- one home per concept ----------------------------------------------------------------------------


def _sources(*folders: Path) -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PACKAGE.parent)), ast.parse(p.read_text()))
            for f in folders for p in sorted(f.rglob("*.py"))]


def _strings(node: ast.AST) -> set[str]:
    """The string constants a tuple, list, set or dict literal (its keys) holds."""
    sequence = isinstance(node, (ast.Tuple, ast.List, ast.Set))
    items = node.keys if isinstance(node, ast.Dict) else node.elts if sequence else []
    return {item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)}


def _assigned(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            found += [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            found.append((node.target.id, node.value))
    return found


def _homes(collections: list[tuple[str, ast.Module]], names: set[str], least: int) -> list[str]:
    """Where a literal holds at least ``least`` of ``names``."""
    return [f"{path}:{node.lineno}" for path, tree in collections for node in ast.walk(tree)
            if len(_strings(node) & names) >= least]


def test_only_variants_py_lists_the_variants():
    """A second list of the variant names (a tuple, a dict keyed by them, a VARIANTS or NAMES) drifts:
    adding a variant would have to find it. op.py re-exports variants.NAMES, which is no second list."""
    sources = [(path, tree) for path, tree in _sources(PACKAGE, TOOLS) if path != "dql_pass/variants.py"]
    found = _homes(sources, set(variants.NAMES), len(variants.NAMES))
    for path, tree in sources:
        for name, value in _assigned(tree):
            if name in ("VARIANTS", "NAMES", "VARIANT_NAMES") and ast.unparse(value) not in ("variants.NAMES", "NAMES"):
                found.append(f"{path}: {name} = {ast.unparse(value)}")
    assert not found, found


def test_only_inputs_py_holds_the_input_class_vocabulary():
    """Input classes are named in dql_pass/inputs.py only: no other CLASSES or input_classes, and no
    literal listing three or more of them (a known difference names one, an adapter a pair)."""
    sources = [(path, tree) for path, tree in _sources(PACKAGE, TOOLS) if path != "dql_pass/inputs.py"]
    found = _homes(sources, set(inputs.CLASSES), 3)
    for path, tree in sources:
        found += [f"{path}: CLASSES" for name, _ in _assigned(tree) if name.endswith("CLASSES")]
        found += [f"{path}:{node.lineno}: def {node.name}" for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef)
                  and node.name in ("input_classes", "_reciprocal_changes", "_near_tie")]
    assert not found, found


# Literals that name lowered ops for another reason than a rule: whether ORIGINAL is a QDQ model.
_NOT_RULES = {("dql_pass/verification/notes.py", "_QDQ")}


def test_a_lowering_rule_lives_in_its_record_only():
    """A lowering rule is one record of lowering/rules.py's REGISTRY, and verify dispatches on it:
    no other module of lowering or verification names a lowered op (an ``op_type == "ConvInteger"``
    chain, a dict keyed by them), and the reference and operand generator a record names are named
    by that record only (no second ``_expected`` calling the reference, no second case dispatch)."""
    found = []
    for path, tree in _sources(PACKAGE / "lowering", PACKAGE / "verification"):
        if path == "dql_pass/lowering/rules.py":
            continue
        allowed = {id(node) for name, value in _assigned(tree) if (path, name) in _NOT_RULES
                   for node in ast.walk(value)}
        found += [f"{path}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in rules.RULES and id(node) not in allowed]
    named = {(f.__module__.rsplit(".", 1)[-1], f.__name__)
             for rule in rules.REGISTRY for f in (rule.reference, rule.cases)}
    for path, tree in _sources(PACKAGE, TOOLS):
        if path == "dql_pass/lowering/rules.py":
            continue
        found += [f"{path}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and (node.value.id, node.attr) in named]
        found += [f"{path}:{node.lineno}: imports {alias.name}" for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.module for alias in node.names
                  if (node.module.rsplit(".", 1)[-1], alias.name) in named]
    assert not found, found


# -- safe writing lives in dql_pass/files/ ------------------------------------------------------------

FILES = PACKAGE / "files"
# What only dql_pass/files/ calls: a rename into place, a lock, a flush, a temporary file or stage.
_SAFE_CALLS = {
    ("os", "rename"), ("os", "renames"), ("os", "replace"), ("os", "fsync"), ("shutil", "move"),
    ("fcntl", "flock"), ("fcntl", "lockf"), ("tempfile", "mkstemp"), ("tempfile", "mkdtemp"),
}
# The words of a helper's name that mean safe writing: `_staged`, `FolderLock`, `atomic_path`, ...
_SAFE_WORDS = {"atomic", "atomically", "exchange", "flock", "fsync", "lock", "locked", "renameat2", "stage", "staged",
               "swap", "sweep"}


def _words(name: str) -> set[str]:
    return {w.lower() for part in name.split("_") for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", part)}


def _safe_writing(tree: ast.Module) -> list[str]:
    """Where ``tree`` writes safely on its own: a safe-writing call, or a helper named so."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
            if (owner, node.func.attr) in _SAFE_CALLS or node.func.attr in ("rename", "renameat2"):  # Path.rename too
                found.append(f"{node.lineno}: {ast.unparse(node.func)}()")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and (
                _words(node.name) & _SAFE_WORDS):
            found.append(f"{node.lineno}: {'class' if isinstance(node, ast.ClassDef) else 'def'} {node.name}")
    return found


def test_only_files_writes_safely():
    """A second home of safe writing (a lock, a stage folder, an atomic replace, a sweep) drifts from
    the first: gen-tests once named its stages otherwise than the sweep looked for. Outside
    dql_pass/files/, code asks it (atomic_path, staged, put_folder, save_model) and calls none of
    os.rename, os.replace, fcntl.flock and their kin."""
    found = [f"{path}:{where}" for path, tree in _sources(PACKAGE, TOOLS)
             if not path.startswith("dql_pass/files/") for where in _safe_writing(tree)]
    assert not found, found


def test_files_safe_knows_no_onnx_and_models_builds_on_it():
    """safe is a leaf: no graph or array library, nothing of dql_pass but the leaves errors and
    interrupts and the sweep's reader of references, which is a leaf too; models imports safe,
    never the other way round."""
    def modules(path: Path) -> set[str]:
        tree = ast.parse(path.read_text())
        return {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names} | {
            node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}

    graph_libraries = ("onnx", "onnx_ir", "onnxscript", "numpy")
    safe, references = modules(FILES / "safe.py"), modules(FILES / "references.py")
    assert not {m for m in safe | references if m.split(".")[0] in graph_libraries}, safe | references
    assert {m for m in safe if m.startswith("dql_pass")} == {
        "dql_pass.errors", "dql_pass.interrupts", "dql_pass.files.references"}, safe
    assert not {m for m in references if m.startswith("dql_pass")}, references
    assert "dql_pass.files.safe" in modules(FILES / "models.py")
    assert sorted(p.name for p in FILES.glob("*.py")) == [
        "__init__.py", "arrays.py", "models.py", "protobuf.py", "references.py", "report_path.py", "safe.py",
        "tensors.py", "written.py"]
