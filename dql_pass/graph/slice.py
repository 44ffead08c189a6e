"""A backward slice into a site model: the computation of some values of a model, walked back to
the values named like the site's inputs, as a model of its own.

The slice takes in constants of outer scopes, the subgraphs of the nodes on the way and the
model-local functions they call; one that needs any other value cannot run alone
(:class:`NotReachable`). The site model imports only the domains its nodes use: a runtime may
refuse a model for an import it cannot parse (tinygrad refuses an unused ``local``).
"""

from __future__ import annotations

__all__ = ["NotReachable", "backward_slice", "site_model"]

from collections.abc import Collection, Sequence

import onnx_ir as ir

from dql_pass.graph.walk import called_functions, ops_used


class NotReachable(Exception):
    """The site's computation needs more than its inputs and constants, or what reads it is unknown."""


def _refuse_references(node: ir.Node) -> bool:
    """Raise :class:`NotReachable` if ``node`` takes an attribute from its function: it cannot run outside it."""
    ref = next((attr for attr in node.attributes.values() if attr.is_ref()), None)
    if ref is not None:
        raise NotReachable(f"node {node.name or node.op_type!r} takes attribute {ref.name!r} from its function")
    return True


def _captured(node: ir.Node) -> list[ir.Value]:
    """Values of enclosing scopes that the subgraphs of ``node`` read."""
    inner: set[ir.Graph] = set()
    # The check runs on every node before its subgraphs are entered; node itself comes first.
    nodes = ir.traversal.RecursiveGraphIterator(
        ir.GraphView([], [], nodes=[node]), recursive=_refuse_references, enter_graph=inner.add
    )
    return [v for n in list(nodes)[1:] for v in n.inputs if v is not None and v.graph not in inner]


def backward_slice(
    outputs: Sequence[ir.Value], input_names: Collection[str]
) -> tuple[dict[str, ir.Value], list[ir.Node], list[ir.Value]]:
    """The values named ``input_names`` that ``outputs`` are computed from, the nodes computing them
    in topological order, and the constants they read."""
    found, order, constants, foreign = {}, [], [], []
    seen_values: set[ir.Value] = set()
    seen_nodes: set[ir.Node] = set()
    stack: list[ir.Value | tuple[ir.Node]] = list(reversed(outputs))
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):  # every input of this node is placed: emit it
            order.append(item[0])
            continue
        if item in seen_values:
            continue
        seen_values.add(item)
        producer = item.producer()
        if item.name in input_names:
            found[item.name] = item
        elif producer is None and item.const_value is not None:
            constants.append(item)
        elif producer is None:
            foreign.append(item.name)
        elif producer not in seen_nodes:
            seen_nodes.add(producer)
            stack.append((producer,))
            stack.extend(v for v in reversed([*producer.inputs, *_captured(producer)]) if v is not None)
    if foreign:
        inputs = ", ".join(map(repr, sorted(input_names)))
        raise NotReachable(
            f"its outputs depend on {', '.join(map(repr, sorted(foreign)))}, not only on its inputs {inputs}")
    return found, order, constants


def site_model(model: ir.Model, graph: ir.Graph, outputs: Sequence[ir.Value], inputs: Sequence[str]) -> ir.Model:
    """A model whose inputs are the values named ``inputs`` (in order; one the outputs ignore is
    still an input) and whose outputs are ``outputs``, values of ``graph`` in ``model``, with the
    model-local functions it calls. Names and shapes are the model's: the caller sets its own."""
    found, nodes, constants = backward_slice(outputs, set(inputs))
    values = [found.get(name) or ir.Value(name=name) for name in inputs]
    if len(set(outputs)) != len(outputs) or any(value in outputs for value in values):
        raise NotReachable("two of its outputs, or an output and an input, are the same value")
    view = ir.GraphView(values, outputs, nodes=nodes, initializers=constants)
    functions = [model.functions[key].clone() for key in sorted(called_functions(model, view))]
    opsets = {**graph.opset_imports, **model.opset_imports}
    for function in functions:
        opsets = {**function.opset_imports, **opsets}
    view.opset_imports = opsets
    sliced = ir.Model(view.clone(), ir_version=model.ir_version, functions=functions)
    used = {"", "ai.onnx"} | {domain for domain, _ in ops_used(sliced)}
    for domain in set(sliced.opset_imports) - used:
        del sliced.opset_imports[domain]
    return sliced
