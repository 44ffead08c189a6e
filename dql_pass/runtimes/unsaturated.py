"""ORIGINAL as ONNX defines its integer products, where ORT's kernel for one saturates on this CPU.

ORT's uint8 x int8 MatMulInteger (and int8 x uint8 ConvInteger) sum pairs of products in int16 on
x86 without VNNI, so ORIGINAL run there is not the op's result, while a lowered product is exact.
``a - a_zp`` is unchanged when a and its zero point both move by 128, so each int8 operand of such
a node becomes uint8 (an absent zero point is 0, so 128), which ORT's uint8 x uint8 kernels
compute exactly.
An operand's type is the one the model states, else the one ONNX's type inference gives it (a
Constant node's output, an op's output, a function's input once its calls are inlined as ORT
inlines them): a node left out runs saturated and wrongs a correct rewrite.
"""

from __future__ import annotations

__all__ = ["saturating_nodes", "unsaturated"]

import numpy as np
import onnx_ir as ir
from onnx_ir.passes.common import InlinePass, ShapeInferencePass

from dql_pass.graph.names import UniqueNames
from dql_pass.graph.walk import described, graph_scopes
from dql_pass.op import is_dql

_PRODUCTS = ("MatMulInteger", "ConvInteger")  # inputs: a, b, a's zero point, b's zero point


def _plus_128(graph: ir.Graph, node: ir.Node, value: ir.Value | None, names: UniqueNames) -> ir.Value:
    """``value`` (int8; absent means 0) plus 128 as uint8, computed by nodes placed before ``node``."""
    prefix = names.prefix(f"{described(node).split()[0]}_unsaturated")
    offset = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(128, np.int32))},
                     outputs=[ir.Value(name=f"{prefix}offset")])
    steps = [offset]
    widened = offset.outputs[0]
    if value is not None:
        cast = ir.node("Cast", [value], attributes={"to": ir.DataType.INT32}, outputs=[ir.Value(name=f"{prefix}int32")])
        add = ir.node("Add", [cast.outputs[0], widened], outputs=[ir.Value(name=f"{prefix}plus128")])
        steps += [cast, add]
        widened = add.outputs[0]
    back = ir.node("Cast", [widened], attributes={"to": ir.DataType.UINT8}, outputs=[ir.Value(name=f"{prefix}uint8")])
    graph.insert_before(node, [*steps, back])
    return back.outputs[0]


def _element_type(value: ir.Value | None) -> int | None:
    """The value's ONNX element type where the model states it or a DynamicQuantizeLinear made it (uint8)."""
    if value is not None and value.dtype is not None:
        return value.dtype.value
    producer = None if value is None else value.producer()
    return ir.DataType.UINT8.value if producer is not None and is_dql(producer) else None


def _product(node: ir.Node) -> bool:
    return node.op_type in _PRODUCTS and node.domain in ("", "ai.onnx")


def _saturates(node: ir.Node, saturating: frozenset[tuple[str, int, int]]) -> bool:
    return _product(node) and (node.op_type, *map(_element_type, node.inputs[:2])) in saturating


def _typed(model: ir.Model) -> ir.Model | None:
    """A copy of ``model`` in which every integer product's operands have their types: functions
    inlined where one holds a product, types inferred where one is not stated; None when ``model``
    has no integer product."""
    scopes = graph_scopes(model)
    products = [node for graph in scopes for node in graph if _product(node)]
    if not products:
        return None
    copy = model.clone()
    in_function = any(not isinstance(scopes[node.graph][1], ir.Graph) for node in products)
    if in_function:  # a function's inputs take their types at each call
        InlinePass()(copy)
    if in_function or any(_element_type(v) is None for node in products for v in node.inputs[:2]):
        ShapeInferencePass(check_type=False, strict_mode=False, data_prop=False)(copy)
    return copy


def saturating_nodes(model: ir.Model, saturating: frozenset[tuple[str, int, int]]) -> list[str]:
    """The integer products of ``model`` of a kind in ``saturating`` (op type, operand types), with
    model-local functions inlined."""
    typed = _typed(model) if saturating else None
    return [] if typed is None else [described(n) for g in graph_scopes(typed) for n in g if _saturates(n, saturating)]


def unsaturated(model: ir.Model, saturating: frozenset[tuple[str, int, int]]) -> ir.Model:
    """A copy of ``model`` (its functions inlined where one holds an integer product) in which every
    integer product of a kind in ``saturating`` takes uint8 operands; ``model`` itself if it has none."""
    copy = _typed(model) if saturating else None
    if copy is None or not any(_saturates(n, saturating) for g in graph_scopes(copy) for n in g):
        return model
    names = UniqueNames.of_model(copy)
    for graph in graph_scopes(copy):
        for node in list(graph):
            if not _saturates(node, saturating):
                continue
            if len(node.inputs) < 4:
                node.resize_inputs(4)
            for operand in (0, 1):
                if _element_type(node.inputs[operand]) == ir.DataType.INT8.value:
                    node.replace_input_with(operand + 2, _plus_128(graph, node, node.inputs[operand + 2], names))
                    node.replace_input_with(operand, _plus_128(graph, node, node.inputs[operand], names))
    return copy
