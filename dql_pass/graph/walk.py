"""Walking a model: every graph with a readable path, the DynamicQuantizeLinear sites, the
model-local functions a graph calls, what the outputs depend on, the ops a model runs, a node's label.

Paths read ``main/If(out).then_branch`` or ``function domain::name/...``; a node without a name
is told apart by its first output, and any remaining collision gets a ``_N`` suffix, so every
graph has its own path.
"""

from __future__ import annotations

__all__ = [
    "Root", "called_functions", "check_ir_model", "described", "fed_inputs", "find_sites", "graph_scopes", "label",
    "live", "op_key", "ops_used", "sites_by_graph", "subgraphs", "taken",
]

import collections
from collections.abc import Iterator

import onnx_ir as ir

from dql_pass.graph.constants import constant
from dql_pass.graph.names import free_name
from dql_pass.op import is_dql

Root = ir.Graph | ir.Function


def check_ir_model(model: object, function: str) -> None:
    """:class:`TypeError` unless ``model`` is an ``ir.Model``, the one thing an onnx_ir pass takes;
    ``function`` names the API function that takes the other kinds."""
    if not isinstance(model, ir.Model):
        raise TypeError(
            f"the pass takes an onnx_ir Model, not {type(model).__name__}; use dql_pass.{function}(), which takes a "
            "ModelProto or a path too, or ir.from_proto(model)"
        )


def _first_output(node: ir.Node) -> str:
    return next((v.name for v in node.outputs if v.name), "")


def label(node: ir.Node) -> str:
    """The node's name; an unnamed node is told apart by its first output: ``If(out)``."""
    return node.name or f"{node.op_type}({_first_output(node)})"


def described(node: ir.Node) -> str:
    """The node for a message: ``MatMulInteger 'name'``, or its first output for the name."""
    return f"{node.op_type} {node.name or _first_output(node)!r}"


def op_key(node: ir.Node) -> tuple[str, str]:
    """The node's (domain, op_type), ai.onnx as ``""``: two readers match only if these do."""
    return ("" if node.domain == "ai.onnx" else node.domain, node.op_type)


def subgraphs(node: ir.Node) -> Iterator[tuple[str, ir.Graph]]:
    """The node's graph attributes with their names: ``then_branch``, ``body``, ``graphs[1]``."""
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
    labels: set[str] = set()
    counts: collections.Counter[str] = collections.Counter()
    for path, root in roots:
        scopes[root if isinstance(root, ir.Graph) else root.graph] = (path, root)
        # Parents come before their subgraphs in this walk, so their labels are known.
        for node in ir.traversal.RecursiveGraphIterator(root):
            for attr_name, graph in subgraphs(node):
                path = free_name(f"{scopes[node.graph][0]}/{label(node)}.{attr_name}", labels, counts)
                labels.add(path)
                scopes[graph] = (path, root)
    return scopes


def fed_inputs(graph: ir.Graph) -> list[ir.Value]:
    """The graph inputs a caller feeds: models below IR version 4 list their initializers too."""
    return [value for value in graph.inputs if not value.is_initializer()]


def sites_by_graph(scopes: dict[ir.Graph, tuple[str, Root]]) -> dict[str, list[ir.Node]]:
    sites: dict[str, list[ir.Node]] = collections.defaultdict(list)
    for graph, (label, _) in scopes.items():
        sites[label] += [node for node in graph if is_dql(node)]
    return {label: nodes for label, nodes in sites.items() if nodes}


def find_sites(model: ir.Model) -> dict[str, list[ir.Node]]:
    """The DQL nodes of the model, grouped by the path of the graph that holds them."""
    return sites_by_graph(graph_scopes(model))


def called_functions(model: ir.Model, root: ir.Graph | ir.GraphView | ir.Function) -> set[ir.OperatorIdentifier]:
    """The model-local functions that ``root`` calls, directly, in subgraphs or through other functions."""
    called: set[ir.OperatorIdentifier] = set()
    todo = [root]
    while todo:
        for node in ir.traversal.RecursiveGraphIterator(todo.pop()):
            identifier = node.op_identifier()
            if identifier in model.functions and identifier not in called:
                called.add(identifier)
                todo.append(model.functions[identifier])
    return called


def ops_used(model: ir.Model) -> set[tuple[str, str]]:
    """Every (domain, op_type) the model runs, in every graph and function, ai.onnx as ``""``."""
    return {op_key(node) for root in (model.graph, *model.functions.values())
            for node in ir.traversal.RecursiveGraphIterator(root)}


def taken(node: ir.Node) -> list[tuple[str, ir.Graph]]:
    """The subgraphs of ``node`` that run: an If whose condition is a constant runs one branch only."""
    held = list(subgraphs(node))
    condition = constant(node.inputs[0]) if op_key(node) == ("", "If") and node.inputs else None
    if condition is None or condition.size != 1:
        return held
    branch = "then_branch" if bool(condition.reshape(())) else "else_branch"
    return [(name, graph) for name, graph in held if name == branch]


def live(model: ir.Model) -> tuple[set[ir.Node], set[ir.Graph]]:
    """The nodes and graphs that the main graph's outputs depend on, through subgraphs (the branch a
    constant condition takes) and calls of model-local functions."""
    nodes: set[ir.Node] = set()
    graphs: set[ir.Graph] = {model.graph}
    seen: set[ir.Value] = set()
    called: set[ir.OperatorIdentifier] = set()
    todo = list(model.graph.outputs)
    while todo:
        value = todo.pop()
        if value in seen:
            continue
        seen.add(value)
        node = value.producer()
        if node is None or node in nodes:
            continue
        nodes.add(node)
        # Inputs include the outer values that subgraph nodes read: they are the same objects.
        todo.extend(v for v in node.inputs if v is not None)
        for _, graph in taken(node):
            graphs.add(graph)
            todo.extend(graph.outputs)
        identifier = node.op_identifier()
        if identifier in model.functions and identifier not in called:
            called.add(identifier)
            graphs.add(model.functions[identifier].graph)
            todo.extend(model.functions[identifier].outputs)
    return nodes, graphs
