"""Kept nodes: every node REWRITTEN keeps must read ORIGINAL's constants and carry its attributes.

Rules: a node of ORIGINAL that REWRITTEN has in a graph where ORIGINAL has none like it (an If's
branches swapped, a node moved out of a Loop's body) is a change: no rewrite of a DQL moves the
nodes around it, and the sites and the model level would check the moved ones where they no
longer are (but the branch an If on a constant condition takes, inlined into the If's graph: a
constant folded). So is a named node of ORIGINAL whose name REWRITTEN gives there only to nodes of
another type (but a DQL or an integer op that lower rewrites). A node that REWRITTEN keeps (same
graph path, domain, type and name, or output names when it has no name, or else the same input and
output names; live in REWRITTEN) must read ORIGINAL's constants, bit for bit, at every input where
either model has a constant (an initializer that is also a graph input counts by its stored value:
as deployed nothing feeds it; a broadcasting op's constant may gain or lose leading axes of size
1), and carry the same attributes (one left out the same as one written out at its schema's default;
one a later opset made an input the same as that input of the same value): a difference there is a
mismatch whatever the inputs verify synthesizes (a change a bias and Relu mask on all of them). A
value REWRITTEN computes from constants alone is run to compare it.
"""

from __future__ import annotations

__all__ = ["kept_differences"]

import collections
from collections.abc import Callable, Mapping

import numpy as np
import onnx
import onnx_ir as ir

from dql_pass import runtimes
from dql_pass.compare import bit_difference
from dql_pass.graph.constants import constant
from dql_pass.graph.slice import NotReachable, site_model
from dql_pass.graph.walk import described, graph_scopes, op_key, subgraphs, taken
from dql_pass.lowering.rules import RULES
from dql_pass.op import ai_onnx_opset, is_dql
from dql_pass.verification.extract import Scopes


def _identity(node: ir.Node) -> tuple:
    """Domain, type, and the name, or the output names of an unnamed node."""
    return (*op_key(node), node.name or tuple(v.name for v in node.outputs))


def _wiring(node: ir.Node) -> tuple:
    """Domain, type, and the names of the values read and made: a node renamed alone keeps them."""
    inputs = tuple(None if v is None else v.name for v in node.inputs)
    return (*op_key(node), inputs, tuple(v.name for v in node.outputs))


def _kept_nodes(
    labels: Mapping[ir.Graph, str], key: Callable[[ir.Node], tuple] = _identity
) -> dict[tuple[str, tuple], ir.Node]:
    """The nodes of the graphs ``labels`` names (graph to path) by graph path and ``key``; one that
    shares its key with another in its graph is left out."""
    found: dict[tuple[str, tuple], ir.Node | None] = {}
    for graph, label in labels.items():
        for node in graph:
            found[label, key(node)] = None if (label, key(node)) in found else node
    return {key: node for key, node in found.items() if node is not None}


def _placed(model: ir.Model) -> list[tuple[tuple, ir.Node]]:
    """Every node of the main graph and its subgraphs with where its graph is: for a subgraph the
    type and output names of the node that holds it and the attribute, so that a rewrite renaming
    that node keeps it. Functions are left out: a rewrite may add its own (expand's function mode)
    or rename one."""
    places: dict[ir.Graph, tuple] = {model.graph: ("main",)}
    placed = []
    for node in ir.traversal.RecursiveGraphIterator(model.graph):  # parents before their subgraphs
        placed.append((places[node.graph], node))
        for attr_name, graph in subgraphs(node):
            places[graph] = (*places[node.graph], node.op_type, tuple(v.name for v in node.outputs), attr_name)
    return placed


def _moved(before: list[tuple[tuple, ir.Node]], after: list[tuple[tuple, ir.Node]],
           labels: Mapping[ir.Graph, str]) -> list[str]:
    """The nodes of ORIGINAL (``before``, see :func:`_placed`) that REWRITTEN (``after``) has in a
    graph where ORIGINAL has none of that identity; ``labels``: both models' graph paths. A rewrite
    that drops one of two nodes of the same identity (lower leaving a subgraph's copy alone) moves
    nothing; a move among graphs that all hold the identity, or a move with a rename, is left to the
    sites and the model level."""
    def by_identity(placed: list[tuple[tuple, ir.Node]]) -> dict[tuple, dict[tuple, ir.Node]]:
        """Node identity -> place -> a node of that identity there."""
        found: dict[tuple, dict[tuple, ir.Node]] = collections.defaultdict(dict)
        for place, node in placed:
            found[_identity(node)][place] = node
        return found

    def where(nodes) -> str:
        return ", ".join(sorted(labels[node.graph] for node in nodes))

    original, rewritten = by_identity(before), by_identity(after)
    # The branch a constant condition takes, inlined into the graph of its If (a constant folded), moves nothing.
    inlined = {}
    for place, node in before:
        branches = taken(node)
        if len(branches) < len(list(subgraphs(node))):
            inlined.update({(*place, node.op_type, tuple(v.name for v in node.outputs), name): place
                            for name, _ in branches})
    moved = []
    for identity, held in original.items():
        allowed = {*held, *(inlined[place] for place in held if place in inlined)}
        new = [node for place, node in rewritten.get(identity, {}).items() if place not in allowed]
        if new:
            moved.append(f"{described(next(iter(held.values())))} in {where(held.values())}: REWRITTEN has it in "
                         f"{where(new)}, where ORIGINAL has not")
    return moved


def _retyped(before: list[tuple[tuple, ir.Node]], after: list[tuple[tuple, ir.Node]],
             labels: Mapping[ir.Graph, str]) -> list[str]:
    """The named nodes of ORIGINAL (``before``, see :func:`_placed`) whose name REWRITTEN (``after``)
    gives, at the same place, only to nodes of another type: no rewrite of a DQL changes what a node
    around it is (DQL and the integer ops that lower rewrites may take another form under their names)."""
    def named(placed: list[tuple[tuple, ir.Node]]) -> dict[tuple, list[ir.Node]]:
        found: dict[tuple, list[ir.Node]] = collections.defaultdict(list)
        for place, node in placed:
            if node.name:
                found[place, node.name].append(node)
        return found

    rewritten = named(after)
    retyped = []
    for key, (node, *others) in named(before).items():
        types = {op_key(twin) for twin in rewritten.get(key, [])}
        if others or not types or op_key(node) in types or is_dql(node) or op_key(node) in _LOWERED:
            continue
        retyped.append(f"{described(node)} in {labels[node.graph]}: REWRITTEN has a "
                       f"{' or a '.join(sorted(op for _, op in types))} under its name")
    return retyped


def _tensor(tensor: ir.TensorProtocol) -> tuple:
    array = tensor.numpy()
    return str(array.dtype), array.shape, array.tobytes()


def _attribute(attr: ir.Attr) -> object:
    """A comparable form of an attribute's value; graphs are compared as graphs of their own."""
    if attr.is_ref():
        return "ref", attr.type, attr.ref_attr_name
    if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        return (attr.type,)
    if attr.type == ir.AttributeType.TENSOR:
        return attr.type, _tensor(attr.value)
    if attr.type == ir.AttributeType.TENSORS:
        return attr.type, tuple(map(_tensor, attr.value))
    if attr.type in (ir.AttributeType.FLOAT, ir.AttributeType.FLOATS):  # bits: -0.0 and NaN payloads count
        return attr.type, np.asarray(attr.value, np.float32).tobytes()
    if attr.type in (ir.AttributeType.INT, ir.AttributeType.STRING):
        return attr.type, attr.value
    if attr.type in (ir.AttributeType.INTS, ir.AttributeType.STRINGS):
        return attr.type, tuple(attr.value)
    return attr.type, str(attr.value)  # sparse tensors and type protos, by their text


def _folded(model: ir.Model, value: ir.Value, runtime: runtimes.Runtime) -> np.ndarray | None:
    """The value's array when ``model`` computes it from constants only, run on ``runtime``; None
    when it depends on what is fed (the sites and the model level compare that) or does not run."""
    try:
        folded = site_model(model, value.graph, [value], [])
    except NotReachable:
        return None
    folded.graph.outputs[0].name = "constant"
    try:
        session = runtime.load(folded, threads=1, optimize="basic")
        return np.asarray(session.run({})[0])
    except runtimes.RuntimeFailure:  # the model level runs REWRITTEN whole and reports what fails there
        return None


def _deployed(value: ir.Value | None) -> np.ndarray | None:
    """The value's array as the model is deployed, nothing fed: a constant, or the stored value of
    an initializer that is also a graph input (every one of an IR-3 model), which is what runs."""
    array = constant(value)
    if array is None and value is not None and value.is_initializer() and value.const_value is not None:
        return value.const_value.numpy()
    return array


_LOWERED = frozenset(("", op) for op in RULES)  # what lower may rewrite under the same name
# Ops that broadcast their inputs both ways: a constant given leading axes of size 1 computes the same
# values (and where it lengthens the output's shape, the model level sees that on every input).
_BROADCASTING = frozenset(("", op) for op in (
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Min", "Max", "Sum", "Mean", "Where", "And", "Or", "Xor", "Equal",
    "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
))


# Attributes that a later opset of the op made inputs (the index), as onnx's version converter moves them:
# those still attributes at opset 11, the first with DynamicQuantizeLinear (Pad's, Clip's, Slice's moved before).
_MOVED_TO_INPUTS: dict[tuple[str, str], dict[str, int]] = {
    **{("", op): {"axes": 1} for op in (
        "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceSumSquare", "Squeeze", "Unsqueeze")},
    ("", "Split"): {"split": 1}, ("", "Dropout"): {"ratio": 1},
}


def _moved_inputs(node: ir.Node, opsets: Mapping[str, int]) -> tuple[dict[int, object], dict[str, ir.Attr]]:
    """For an op some opset moved attributes of into inputs: at each such input, the attribute's value or the
    input's constant, None where it is neither, and the input itself where it is computed; and the node's
    other attributes, spelled out. Else ({}, the attributes spelled out)."""
    spelled = _spelled_out(node, opsets)
    moved = _MOVED_TO_INPUTS.get(op_key(node), {})
    values: dict[int, object] = {}
    for name, index in moved.items():
        written = node.attributes.get(name)
        given = node.inputs[index] if index < len(node.inputs) else None
        constant_value = _deployed(given)
        values[index] = (np.asarray(written.value) if written is not None else
                         given if constant_value is None else constant_value)
    return values, {name: attr for name, attr in spelled.items() if name not in moved}


def _without_leading_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape[next((i for i, size in enumerate(shape) if size != 1), len(shape)):]


def _same_but_leading_ones(expected: np.ndarray, actual: np.ndarray) -> bool:
    return (expected.dtype == actual.dtype and expected.tobytes() == actual.tobytes()
            and _without_leading_ones(expected.shape) == _without_leading_ones(actual.shape))


def _input_difference(name: str, expected: np.ndarray, actual: np.ndarray | None, absent: bool) -> str | None:
    """How REWRITTEN's input ``name`` of a kept node (``actual``) differs from ORIGINAL's constant."""
    if absent:
        return f"{name} is a constant in ORIGINAL and absent in REWRITTEN"
    if actual is None:
        return None
    if expected.dtype.kind in "fiub" and actual.dtype.kind in "fiub":
        difference = bit_difference(name, actual, expected)
        return None if difference is None else difference.text
    same = expected.dtype == actual.dtype and expected.shape == actual.shape and expected.tolist() == actual.tolist()
    return None if same else f"{name} differs"


def kept_differences(
    original: ir.Model, rewritten: ir.Model, runtime: runtimes.Runtime, scopes: Scopes | None = None
) -> list[str]:
    """For every node REWRITTEN keeps (see the module docstring), each constant input or attribute
    that differs from ORIGINAL's, naming the node, its graph and the input or attribute; values
    REWRITTEN computes from constants run on ``runtime``. ``scopes``: REWRITTEN's, when already built."""
    scopes = scopes or Scopes(rewritten)
    alive = scopes.live_nodes
    kept, wired = _kept_nodes(scopes.labels), _kept_nodes(scopes.labels, _wiring)
    original_labels = {graph: label for graph, (label, _) in graph_scopes(original).items()}
    before, after = _placed(original), _placed(rewritten)  # one walk of each model for both checks
    found = _moved(before, after, {**original_labels, **scopes.labels}) + _retyped(before, after, original_labels)
    for key, node in _kept_nodes(original_labels).items():
        twin = kept.get(key, wired.get((key[0], _wiring(node))))  # a rename alone does not make it another node
        if twin is None or twin not in alive:  # a copy nothing uses does not stand in for the node
            continue
        label = f"{described(node)} in {key[0]}"
        moved_before, attributes_before = _moved_inputs(node, original.opset_imports)
        moved_after, attributes_after = _moved_inputs(twin, rewritten.opset_imports)
        for i in moved_before:  # as an attribute in one opset, an input in another: compared by value
            if isinstance(moved_before[i], ir.Value):
                continue  # computed in ORIGINAL: the model level compares it
            if isinstance(moved_after[i], ir.Value):
                moved_after[i] = _folded(rewritten, moved_after[i], runtime)
            if not _same_values(moved_before[i], moved_after[i]):
                found.append(f"{label}: input {i} (or the attribute it was) is {_shown(moved_before[i])} in ORIGINAL "
                             f"and {_shown(moved_after[i])} in REWRITTEN")
        count = max(len(node.inputs), len(twin.inputs))
        padded = [*node.inputs, *[None] * count][:count], [*twin.inputs, *[None] * count][:count]
        for i, (a, b) in enumerate(zip(*padded)):
            if i in moved_before:
                continue
            expected, actual = _deployed(a), _deployed(b)
            if a is None and actual is not None:
                found.append(f"{label}: input {i} ({b.name!r}) is absent in ORIGINAL and a constant in REWRITTEN")
            elif expected is not None:
                if actual is None and b is not None:
                    actual = _folded(rewritten, b, runtime)
                if op_key(node) in _BROADCASTING and actual is not None and _same_but_leading_ones(expected, actual):
                    continue
                problem = _input_difference(f"input {i} ({a.name!r})", expected, actual, b is None)
                found += [f"{label}: {problem}"] if problem else []
        found += [
            f"{label}: {_attribute_difference(name, attributes_before.get(name), attributes_after.get(name))}"
            for name in sorted(set(attributes_before) | set(attributes_after))
            if _attribute_differs(name, attributes_before, attributes_after, node, twin)
        ]
    return found


def _attribute_differs(name: str, before: Mapping[str, ir.Attr], after: Mapping[str, ir.Attr], node: ir.Node,
                       twin: ir.Node) -> bool:
    """Whether attribute ``name`` differs; one that the schema of only one side's opset has, and only by its
    default (ReduceMax's noop_with_empty_axes from opset 18 on), is no difference."""
    if name in before and name in after:
        return _attribute(before[name]) != _attribute(after[name])
    return name in node.attributes or name in twin.attributes


def _same_values(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    return a.shape == b.shape and bool(np.all(a.astype(np.float64) == b.astype(np.float64)))


def _shown(value: np.ndarray | None) -> str:
    return "absent" if value is None else repr(np.asarray(value).ravel().tolist())


def _spelled_out(node: ir.Node, opsets: Mapping[str, int]) -> dict[str, ir.Attr]:
    """The attributes of ``node``, with the default of each one its schema defines and it leaves out: an
    attribute written out at its default is the same node."""
    domain = op_key(node)[0]
    version = ai_onnx_opset(opsets) if domain == "" else opsets.get(domain)
    try:
        schema = onnx.defs.get_schema(node.op_type, version, domain) if version is not None else None
    except onnx.defs.SchemaError:  # a model-local function, or an op of a domain onnx does not know
        schema = None
    if schema is None:
        return dict(node.attributes)
    defaults = {name: ir.serde.deserialize_attribute(attribute.default_value)
                for name, attribute in schema.attributes.items()
                if attribute.default_value.type != onnx.AttributeProto.UNDEFINED}
    return {**defaults, **node.attributes}


def _attribute_difference(name: str, original: ir.Attr | None, rewritten: ir.Attr | None) -> str:
    if original is not None and rewritten is not None and original.type == rewritten.type == ir.AttributeType.TENSOR:
        difference = bit_difference(f"attribute {name!r}", rewritten.value.numpy(), original.value.numpy())
        if difference is not None:
            return difference.text

    def shown(attr: ir.Attr | None) -> str:
        return "absent" if attr is None else f"@{attr.ref_attr_name}" if attr.is_ref() else repr(attr.value)

    return f"attribute {name!r} is {shown(original)} in ORIGINAL and {shown(rewritten)} in REWRITTEN"
