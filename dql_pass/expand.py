"""Expand every DynamicQuantizeLinear node into primitive ONNX ops.

Rules the pass applies:

- Every ai.onnx ``DynamicQuantizeLinear`` (domain ``""`` or ``"ai.onnx"``) is rewritten: in the main
  graph, in If/Loop/Scan bodies at any depth, and in every model-local function.
- The decomposition comes from :mod:`dql_pass.functions`, built once per (variant, opset, policy)
  at the model's ai.onnx opset, and stamped at every site; no pattern matching is involved.
- ``inline`` mode puts the function's nodes where the DQL was. Its constants are shared by all
  sites: initializers of the main graph, or Constant nodes at the top of a model-local function.
- ``function`` mode replaces each DQL by a call to one model-local function per variant and policy,
  in the ``dql_pass`` domain, at the model's opset.
- The three outputs keep their names, so consumers, graph outputs and value_info keep working.
  Every new name is unique across the whole model, subgraphs and their parents included.
- A DQL whose input is known not to be float32 raises :class:`~dql_pass.errors.InputError`.
- Without DQL the model is left untouched; the pass is idempotent.
"""

from __future__ import annotations

__all__ = ["MODES", "ExpandDynamicQuantizeLinearPass", "ExpandResult", "find_sites", "graph_scopes"]

import collections
import contextlib
import dataclasses
import gc
import itertools
import logging
from collections.abc import Iterator

import onnx_ir as ir

from dql_pass import functions
from dql_pass.errors import InputError
from dql_pass.reference import ZERO_RANGE_POLICIES

logger = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("inline", "function")
_GRAPH_ATTRIBUTES = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)

Root = ir.Graph | ir.Function


@dataclasses.dataclass
class ExpandResult(ir.passes.PassResult):
    """A PassResult that also counts the expanded sites per graph path."""

    sites: dict[str, int] = dataclasses.field(default_factory=dict)


def _subgraphs(node: ir.Node) -> Iterator[tuple[str, ir.Graph]]:
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            yield attr.name, attr.value
        elif attr.type == ir.AttributeType.GRAPHS:
            for i, graph in enumerate(attr.value):
                yield f"{attr.name}[{i}]", graph


def graph_scopes(model: ir.Model) -> dict[ir.Graph, tuple[str, Root]]:
    """Every graph of the model, with a readable path and its root: the main graph or a function."""
    roots: list[tuple[str, Root]] = [("main", model.graph)]
    roots += [(f"function {f.domain}::{f.name}", f) for f in model.functions.values()]
    scopes: dict[ir.Graph, tuple[str, Root]] = {}
    for label, root in roots:
        scopes[root if isinstance(root, ir.Graph) else root.graph] = (label, root)
        # Parents come before their subgraphs in this walk, so their labels are known.
        for node in ir.traversal.RecursiveGraphIterator(root):
            for attr_name, graph in _subgraphs(node):
                parent = scopes[node.graph][0]
                scopes[graph] = (f"{parent}/{node.name or node.op_type}.{attr_name}", root)
    return scopes


def _is_dql(node: ir.Node) -> bool:
    return node.op_type == "DynamicQuantizeLinear" and node.domain in ("", "ai.onnx")


def _sites(scopes: dict[ir.Graph, tuple[str, Root]]) -> dict[str, list[ir.Node]]:
    sites: dict[str, list[ir.Node]] = collections.defaultdict(list)
    for graph, (label, _) in scopes.items():
        sites[label] += [node for node in graph if _is_dql(node)]
    return {label: nodes for label, nodes in sites.items() if nodes}


def find_sites(model: ir.Model) -> dict[str, list[ir.Node]]:
    """The DQL nodes of the model, grouped by the path of the graph that holds them."""
    return _sites(graph_scopes(model))


class _Names:
    """Hands out names that no value or node of the model uses, in any scope.

    A site gets one fresh prefix ``p``; its names are ``p/role``. Such a name can only clash with
    an existing name whose part before the last ``/`` is ``p``, so the prefix is chosen outside
    that set and one check per site covers all of its names.
    """

    def __init__(self, taken: set[str]):
        self._taken = taken
        self._prefixes = {name.rsplit("/", 1)[0] for name in taken if "/" in name}

    @classmethod
    def of_model(cls, model: ir.Model) -> _Names:
        taken: set[str] = set()
        for root in (model.graph, *model.functions.values()):
            graph = root if isinstance(root, ir.Graph) else root.graph
            taken.update(v.name for v in graph.inputs)
            taken.update(root.initializers if isinstance(root, ir.Graph) else ())
            for node in ir.traversal.RecursiveGraphIterator(root):
                taken.add(node.name)
                taken.update(v.name for v in node.outputs)
                for _, sub in _subgraphs(node):
                    taken.update(v.name for v in sub.inputs)
                    taken.update(sub.initializers)
        taken.discard(None)
        return cls(taken)

    def unique(self, preferred: str) -> str:
        name = _first_free(preferred, self._taken)
        self._taken.add(name)
        return name

    def prefix(self, preferred: str) -> str:
        prefix = _first_free(preferred, self._prefixes)
        self._prefixes.add(prefix)
        return prefix + "/"


def _first_free(preferred: str, used: set[str]) -> str:
    candidates = itertools.chain([preferred], (f"{preferred}_{i}" for i in itertools.count(1)))
    return next(name for name in candidates if name not in used)


class _Template:
    """The function body, split into its constants and the nodes stamped at each site."""

    def __init__(self, function: ir.Function):
        self.input = function.inputs[0]
        self.outputs = list(function.outputs)
        self.opset_imports = dict(function.opset_imports)
        self.constants: dict[ir.Value, ir.TensorProtocol] = {}
        self.nodes: list[ir.Node] = []
        for node in function:
            if node.op_type == "Constant" and node.domain == "":
                self.constants[node.outputs[0]] = node.attributes["value"].as_tensor()
            else:
                self.nodes.append(node)
        seen: collections.Counter[str] = collections.Counter()
        self.node_roles = []
        for node in self.nodes:
            self.node_roles.append(f"{node.op_type}_{seen[node.op_type]}" if seen[node.op_type] else node.op_type)
            seen[node.op_type] += 1

    def stamp(self, mapping: dict[ir.Value, ir.Value], prefix: str) -> list[ir.Node]:
        """New nodes computing the body; ``mapping`` holds the input and constants, and gains the rest."""
        stamped = []
        for node, role in zip(self.nodes, self.node_roles):
            outputs = [ir.Value(name=prefix + value.name) for value in node.outputs]
            stamped.append(
                ir.Node(
                    node.domain,
                    node.op_type,
                    [mapping[value] for value in node.inputs],
                    attributes=node.attributes.values(),
                    outputs=outputs,
                    name=prefix + role,
                )
            )
            mapping.update(zip(node.outputs, outputs))
        return stamped


class _Constants:
    """Constants shared by the sites of one root: main-graph initializers, or a function's Constant nodes."""

    def __init__(self, root: Root, names: _Names):
        self._root = root
        self._names = names
        self._values: dict[tuple[ir.DataType, bytes], ir.Value] = {}

    def mapping(self, template: _Template) -> dict[ir.Value, ir.Value]:
        return {value: self._get(value.name, tensor) for value, tensor in template.constants.items()}

    def _get(self, role: str, tensor: ir.TensorProtocol) -> ir.Value:
        key = (tensor.dtype, tensor.tobytes())
        if key not in self._values:
            value = ir.Value(
                name=self._names.unique(f"dql_pass_{role}"),
                type=ir.TensorType(tensor.dtype),
                shape=ir.Shape(tensor.shape),
                const_value=ir.tensor(tensor.numpy()),
            )
            if isinstance(self._root, ir.Graph):
                self._root.register_initializer(value)
            else:
                attribute = ir.AttrTensor("value", value.const_value)
                constant = ir.Node("", "Constant", [], attributes=[attribute], outputs=[value], name=value.name)
                body = self._root.graph
                if len(body):
                    body.insert_before(body[0], constant)
                else:
                    body.append(constant)
            self._values[key] = value
        return self._values[key]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # Stamping creates many small linked objects; the cyclic GC would rescan the whole model over
    # and over (3x the pass time at 10,000 sites) while nothing here becomes garbage.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class ExpandDynamicQuantizeLinearPass(ir.passes.InPlacePass):
    """Replace every ai.onnx DynamicQuantizeLinear by primitive ops (see the module docstring)."""

    def __init__(self, variant: str = "quantizelinear", mode: str = "inline", zero_range: str = "onnxruntime"):
        super().__init__()
        if variant not in functions.VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose from {functions.VARIANTS}")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
        if zero_range not in ZERO_RANGE_POLICIES:
            raise ValueError(f"unknown zero-range policy {zero_range!r}; choose from {ZERO_RANGE_POLICIES}")
        self.variant = variant
        self.mode = mode
        self.zero_range = zero_range

    def call(self, model: ir.Model) -> ExpandResult:
        with _gc_paused():
            return self._expand(model)

    def _expand(self, model: ir.Model) -> ExpandResult:
        scopes = graph_scopes(model)
        sites = _sites(scopes)
        if not sites:
            logger.info("no DynamicQuantizeLinear in the model")
            return ExpandResult(model, modified=False)
        for label, nodes in sites.items():
            for node in nodes:
                dtype = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
                if dtype is not None and dtype != ir.DataType.FLOAT:
                    raise InputError(
                        f"DynamicQuantizeLinear {node.name!r} in {label} takes float32, not {dtype.name.lower()}"
                    )
        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
        if opset is None:
            raise InputError("the model holds DynamicQuantizeLinear but imports no ai.onnx opset")
        proto = functions.function_proto(self.variant, opset, self.zero_range)
        template = _Template(ir.serde.deserialize_function(proto))
        names = _Names.of_model(model)

        if self.mode == "function":
            function = self._local_function(model, template)
        constants: dict[int, dict[ir.Value, ir.Value]] = {}
        for label, nodes in sites.items():
            for node in nodes:
                root = scopes[node.graph][1]
                if self.mode == "inline":
                    if id(root) not in constants:
                        constants[id(root)] = _Constants(root, names).mapping(template)
                    self._inline(node, template, constants[id(root)], names)
                else:
                    self._call(node, function, root, names)
            logger.info("expanded %d DynamicQuantizeLinear in %s", len(nodes), label)
        return ExpandResult(model, modified=True, sites={label: len(nodes) for label, nodes in sites.items()})

    @staticmethod
    def _inline(node: ir.Node, template: _Template, constants: dict[ir.Value, ir.Value], names: _Names) -> None:
        prefix = names.prefix(node.name or node.outputs[0].name or "DynamicQuantizeLinear")
        mapping = {template.input: node.inputs[0], **constants}
        stamped = template.stamp(mapping, prefix)
        outputs = [mapping[value] for value in template.outputs][: len(node.outputs)]
        ir.convenience.replace_nodes_and_values(node.graph, node, [node], stamped, node.outputs, outputs)

    @staticmethod
    def _call(node: ir.Node, function: ir.Function, root: Root, names: _Names) -> None:
        # The call takes over the DQL's node name: the DQL goes away with it.
        name = node.name or names.unique("DynamicQuantizeLinear")
        call = ir.Node(function.domain, function.name, node.inputs[:1], num_outputs=3, name=name)
        if isinstance(root, ir.Function):
            root.opset_imports[functions.FUNCTION_DOMAIN] = 1
        outputs = call.outputs[: len(node.outputs)]
        ir.convenience.replace_nodes_and_values(node.graph, node, [node], [call], node.outputs, outputs)

    def _local_function(self, model: ir.Model, template: _Template) -> ir.Function:
        name = functions.function_name(self.variant, self.zero_range)
        key = (functions.FUNCTION_DOMAIN, name, "")
        if key not in model.functions:
            x = ir.Value(name=template.input.name, type=ir.TensorType(ir.DataType.FLOAT))
            graph = ir.Graph([x], [], nodes=[], opset_imports=dict(template.opset_imports), name=name)
            function = ir.Function(functions.FUNCTION_DOMAIN, name, graph=graph, attributes=[])
            mapping = {template.input: x, **_Constants(function, _Names({x.name})).mapping(template)}
            graph.extend(template.stamp(mapping, ""))
            graph.outputs.extend(mapping[value] for value in template.outputs)
            model.functions[key] = function
        model.opset_imports[functions.FUNCTION_DOMAIN] = 1
        return model.functions[key]
