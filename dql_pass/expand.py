"""Expand every DynamicQuantizeLinear node into primitive ONNX ops.

Rules the pass applies:

- Every ai.onnx ``DynamicQuantizeLinear`` (domain ``""`` or ``"ai.onnx"``) is rewritten: in the main
  graph, in If/Loop/Scan bodies at any depth, and in every model-local function.
- The decomposition comes from :mod:`dql_pass.functions`, built once per (variant, opset, policy)
  at the model's ai.onnx opset, and stamped at every site.
- ``inline`` mode puts the function's nodes where the DQL was. Its constants are shared by all
  sites: initializers of the main graph, or Constant nodes at the top of a model-local function.
- ``function`` mode replaces each DQL by a call to one model-local function per variant and policy,
  in the ``dql_pass`` domain.
- The three outputs keep their names, so consumers, graph outputs and value_info keep working.
  Every new name is unique across the whole model, subgraphs and their parents included.
- A DQL whose input is known not to be float32 raises :class:`~dql_pass.errors.InputError`.
- Without DQL the model is left untouched; the pass is idempotent.
"""

from __future__ import annotations

__all__ = ["ExpandDynamicQuantizeLinearPass", "ExpandResult", "MODES", "find_sites"]

import collections
import dataclasses
import itertools
import logging

import onnx_ir as ir

from dql_pass import functions
from dql_pass.errors import InputError
from dql_pass.reference import ZERO_RANGE_POLICIES

logger = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("inline", "function")


@dataclasses.dataclass
class ExpandResult(ir.passes.PassResult):
    """A PassResult that also counts the expanded sites per graph path."""

    sites: dict[str, int] = dataclasses.field(default_factory=dict)


def _is_dql(node: ir.Node) -> bool:
    return node.op_type == "DynamicQuantizeLinear" and node.domain in ("", "ai.onnx")


def _graph_paths(model: ir.Model) -> dict[ir.Graph, tuple[str, ir.Graph | ir.Function]]:
    """Map every graph of the model to a readable path and to its root (main graph or function)."""
    roots: list[tuple[str, ir.Graph | ir.Function]] = [("main", model.graph)]
    roots += [(f"function {f.domain}::{f.name}", f) for f in model.functions.values()]
    paths = {}
    for label, root in roots:
        body = root if isinstance(root, ir.Graph) else root.graph
        paths[body] = (label, root)
        for node in ir.traversal.RecursiveGraphIterator(root):
            for attr in node.attributes.values():
                if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                    subgraphs = attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]
                    parent_label = paths[node.graph][0]
                    for i, sub in enumerate(subgraphs):
                        suffix = f"[{i}]" if attr.type == ir.AttributeType.GRAPHS else ""
                        paths[sub] = (f"{parent_label}/{node.name or node.op_type}.{attr.name}{suffix}", root)
    return paths


def find_sites(model: ir.Model) -> dict[str, list[ir.Node]]:
    """The DQL nodes of the model, grouped by the path of the graph that holds them."""
    paths = _graph_paths(model)
    sites: dict[str, list[ir.Node]] = collections.defaultdict(list)
    for body, (label, _) in paths.items():
        for node in body:
            if _is_dql(node):
                sites[label].append(node)
    return dict(sites)


class _Names:
    """Hands out names that no value or node of the model uses, in any scope."""

    def __init__(self, taken: set[str]):
        self._taken = taken

    @classmethod
    def of_model(cls, model: ir.Model) -> _Names:
        taken: set[str] = set()
        for root in (model.graph, *model.functions.values()):
            body = root if isinstance(root, ir.Graph) else root.graph
            taken.update(v.name for v in body.inputs if v.name)
            taken.update(root.initializers if isinstance(root, ir.Graph) else ())
            for node in ir.traversal.RecursiveGraphIterator(root):
                if node.name:
                    taken.add(node.name)
                taken.update(v.name for v in (*node.inputs, *node.outputs) if v is not None and v.name)
                for attr in node.attributes.values():
                    if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                        graphs = attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]
                        for graph in graphs:
                            taken.update(v.name for v in graph.inputs if v.name)
        return cls(taken)

    def __call__(self, preferred: str) -> str:
        name = preferred
        for i in itertools.count(1):
            if name not in self._taken:
                break
            name = f"{preferred}_{i}"
        self._taken.add(name)
        return name


class _Template:
    """The function body split into shared constants and the nodes stamped at each site."""

    def __init__(self, proto_function: ir.Function):
        self.function = proto_function
        self.constants: dict[ir.Value, ir.TensorProtocol] = {}
        self.nodes: list[ir.Node] = []
        for node in proto_function:
            if node.op_type == "Constant" and node.domain == "":
                self.constants[node.outputs[0]] = node.attributes["value"].as_tensor()
            else:
                self.nodes.append(node)


class _Constants:
    """Shared constants for one root: initializers of the main graph, or Constant nodes of a function."""

    def __init__(self, root: ir.Graph | ir.Function, names: _Names):
        self._root = root
        self._names = names
        self._values: dict[tuple[str, bytes], ir.Value] = {}

    def get(self, role: str, tensor: ir.TensorProtocol) -> ir.Value:
        key = (str(tensor.dtype), tensor.tobytes())
        if key not in self._values:
            value = ir.Value(
                name=self._names(f"dql_pass_{role}"),
                type=ir.TensorType(tensor.dtype),
                shape=ir.Shape(tensor.shape),
                const_value=ir.tensor(tensor.numpy()),
            )
            if isinstance(self._root, ir.Graph):
                self._root.register_initializer(value)
            else:
                constant = ir.Node(
                    "", "Constant", [], attributes=[ir.AttrTensor("value", value.const_value)],
                    outputs=[value], name=self._names(f"dql_pass_{role}"),
                )
                body = self._root.graph
                if len(body):
                    body.insert_before(body[0], constant)
                else:
                    body.append(constant)
            self._values[key] = value
        return self._values[key]


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
        sites = find_sites(model)
        for label, nodes in sites.items():
            for node in nodes:
                dtype = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
                if dtype is not None and dtype != ir.DataType.FLOAT:
                    raise InputError(f"DynamicQuantizeLinear {node.name!r} in {label} takes float32, not {dtype.name.lower()}")
        if not sites:
            logger.info("no DynamicQuantizeLinear in the model")
            return ExpandResult(model, modified=False)

        opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
        if opset is None:
            raise InputError("the model imports no ai.onnx opset but holds DynamicQuantizeLinear")
        proto = functions.function_proto(self.variant, opset, self.zero_range)
        template = _Template(ir.serde.deserialize_function(proto))
        names = _Names.of_model(model)
        paths = _graph_paths(model)
        pools: dict[int, _Constants] = {}

        if self.mode == "function":
            function = self._local_function(model, template, names)
        for label, nodes in sites.items():
            for node in nodes:
                root = paths[node.graph][1]
                if self.mode == "inline":
                    pool = pools.setdefault(id(root), _Constants(root, names))
                    self._inline(node, template, pool, names)
                else:
                    self._call(node, function, root, names)
            logger.info("expanded %d DynamicQuantizeLinear in %s", len(nodes), label)
        return ExpandResult(model, modified=True, sites={label: len(nodes) for label, nodes in sites.items()})

    def _inline(self, node: ir.Node, template: _Template, pool: _Constants, names: _Names) -> None:
        base = node.name or (node.outputs[0].name if node.outputs[0].name else "DynamicQuantizeLinear")
        mapping: dict[ir.Value, ir.Value] = {template.function.inputs[0]: node.inputs[0]}
        for value, tensor in template.constants.items():
            mapping[value] = pool.get(value.name, tensor)
        new_nodes = [_stamp(t, mapping, base, names) for t in template.nodes]
        outputs = [mapping[v] for v in template.function.outputs][: len(node.outputs)]
        ir.convenience.replace_nodes_and_values(node.graph, node, [node], new_nodes, node.outputs, outputs)

    def _call(self, node: ir.Node, function: ir.Function, root: ir.Graph | ir.Function, names: _Names) -> None:
        # The call takes over the DQL's node name: the DQL goes away with it.
        name = node.name or names("DynamicQuantizeLinear")
        call = ir.Node(function.domain, function.name, node.inputs[:1], num_outputs=3, name=name)
        if isinstance(root, ir.Function):
            root.opset_imports[functions.FUNCTION_DOMAIN] = 1
        ir.convenience.replace_nodes_and_values(node.graph, node, [node], [call], node.outputs, call.outputs[: len(node.outputs)])

    def _local_function(self, model: ir.Model, template: _Template, names: _Names) -> ir.Function:
        name = functions.function_name(self.variant, self.zero_range)
        key = (functions.FUNCTION_DOMAIN, name, "")
        if key in model.functions:
            return model.functions[key]
        x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT))
        graph = ir.Graph([x], [], nodes=[], opset_imports=dict(template.function.opset_imports), name=name)
        function = ir.Function(functions.FUNCTION_DOMAIN, name, graph=graph, attributes=[])
        local = _Names({"x"})
        mapping: dict[ir.Value, ir.Value] = {template.function.inputs[0]: x}
        pool = _Constants(function, local)
        for value, tensor in template.constants.items():
            mapping[value] = pool.get(value.name, tensor)
        graph.extend(_stamp(t, mapping, "", local) for t in template.nodes)
        graph.outputs.extend(mapping[v] for v in template.function.outputs)
        for value, out in zip(graph.outputs, template.function.outputs):
            value.name = out.name
        model.functions[key] = function
        model.opset_imports[functions.FUNCTION_DOMAIN] = 1
        return function


def _stamp(node: ir.Node, mapping: dict[ir.Value, ir.Value], base: str, names: _Names) -> ir.Node:
    prefix = f"{base}/" if base else ""
    new = ir.Node(
        node.domain,
        node.op_type,
        [mapping[v] for v in node.inputs],
        attributes=list(node.attributes.values()),
        num_outputs=len(node.outputs),
        name=names(f"{prefix}{node.op_type}"),
    )
    for old, value in zip(node.outputs, new.outputs):
        value.name = names(f"{prefix}{old.name}")
        mapping[old] = value
    return new
