"""Lowered blocks: the quantized activation of a DynamicQuantizeLinear kept in float32 where only
lowered integer products read it, and the Cast pairs that exact float32 products make identities.

Rules (``lower`` applies them where its ``blocks`` option, the target's by default, says so):

- A DQL site is a block when every reader of its ``y`` and ``y_zero_point`` is a product that lower
  rewrote (MatMulInteger or ConvInteger, in the DQL's graph), so that each reads
  ``Sub(Cast(y, float), Cast(y_zero_point, float))``, and neither is a graph output.
- Once the site is expanded, its body ends with ``y = Cast(V, uint8)`` and
  ``y_zero_point = Cast(Z, uint8)``, where V and Z are float32 integers in [0, 255] for a variant
  whose record says so (:attr:`~dql_pass.variants.Variant.float_y`: it saturates and rounds before it
  casts, NaN included, so the Cast only changes the type; arithmetic and float64 leave V NaN for an
  x of both infinities and keep the uint8 path). So ``y - zp`` is ``V - Z``,
  exact: one Sub per site, named :func:`centred_name` of ``y`` (verify finds it there), which every
  product of the site reads. No uint8 tensor is left, no Cast out and back, and no Sub per product.
  The rewrite reads only the two Casts that end the body, so any variant that ends so plugs in; one
  that ends otherwise (QuantizeLinear) keeps the uint8 path. A body whose y and zero point are
  Gathers from one ``Cast(F, uint8)`` table, or from one Gather of a constant uint8 table (lean),
  gets ``Gather(F - F[zero slot], slot)`` instead, F the float32 table (for a Gather, the same Gather
  of the constant in float32): the table is shifted once per site and each element still takes one
  Gather.
- A lowered product in one float32 piece holds an integer of magnitude at most 2^24 (its proof), which
  int32 and float32 both hold exactly: when only Cast(to=float) nodes read its int32 output (the
  dequantizing Cast of ``quantize_dynamic``), Cast(int32) and that Cast are an identity. Both go, and
  the float32 product takes the name of that Cast's output.
"""

from __future__ import annotations

__all__ = ["Block", "cast_reader", "centred_name", "fold_cast_pair", "keep_in_float", "reading_products"]

import dataclasses

import numpy as np
import onnx_ir as ir

from dql_pass.graph.constants import drop_unused
from dql_pass.graph.names import SharedConstants, UniqueNames
from dql_pass.op import DOMAINS

FLOAT, INT32, UINT8 = ir.DataType.FLOAT, ir.DataType.INT32, ir.DataType.UINT8
_PRODUCTS = ("MatMul", "Conv")  # the float ops lowered products become


def centred_name(y: str) -> str:
    """The name of a block's ``y - y_zero_point`` in float32, made from the DQL's ``y``."""
    return f"{y}_centred"


def _cast_to(node: ir.Node | None, dtype: ir.DataType) -> bool:
    return (node is not None and node.domain in DOMAINS and node.op_type == "Cast"
            and "to" in node.attributes and node.attributes["to"].as_int() == dtype)


def cast_reader(value: ir.Value) -> str | None:
    """The output name of the Cast to float32 that alone reads ``value`` (in its graph, which does
    not output it): where ``value`` is a lowered product's, the Cast pair a block may drop."""
    uses = value.uses()
    node = uses[0].node if len(uses) == 1 and not value.is_graph_output() else None
    return node.outputs[0].name if _cast_to(node, FLOAT) and node.graph is value.graph else None


@dataclasses.dataclass(frozen=True)
class Block:
    """A DQL whose y and y_zero_point only lowered products read: the Subs they read them through."""

    shifts: tuple[ir.Node, ...]  # Sub(Cast(y, float), Cast(y_zero_point, float)), one per product


def reading_products(dql: ir.Node, lowered: set[ir.Node]) -> Block | None:
    """The block of ``dql`` when every reader of its y and y_zero_point is a Cast to float32 that
    lower made (``lowered``) for a product's shifted activation; else None."""
    y, zero_point = dql.outputs[0], dql.outputs[2]
    if y.is_graph_output() or zero_point.is_graph_output() or not y.uses():
        return None
    shifts: dict[ir.Node, None] = {}
    for value, index in ((y, 0), (zero_point, 1)):
        for use in value.uses():
            cast = use.node
            if cast not in lowered or cast.graph is not dql.graph or not _cast_to(cast, FLOAT):
                return None
            for read in cast.outputs[0].uses():
                sub = read.node
                if sub not in lowered or sub.op_type != "Sub" or read.idx != index or cast.outputs[0].is_graph_output():
                    return None
                shifts[sub] = None
    for sub in shifts:  # each reads this site's y and zero point, both through lower's Casts
        if [v.producer().inputs[0] if v.producer() is not None else None for v in sub.inputs] != [y, zero_point]:
            return None
    return Block(tuple(shifts))


def _table_gathers(ends: tuple[ir.Node | None, ...]) -> ir.Node | None:
    """The node that makes the uint8 table when ``y`` and ``y_zero_point`` are Gathers from one table
    that ``Cast(F, uint8)`` or a Gather of a constant uint8 table makes (the lean variant's answers),
    else None."""
    if not all(end is not None and end.domain in DOMAINS and end.op_type == "Gather" for end in ends):
        return None
    tables = {end.inputs[0] for end in ends}
    table = tables.pop() if len(tables) == 1 else None
    made = None if table is None else table.producer()
    if _cast_to(made, UINT8):
        return made
    constant = made.inputs[0].const_value if made is not None and made.op_type == "Gather" else None
    return made if constant is not None and made.domain in DOMAINS and constant.dtype == UINT8 else None


def _float_table(answers: ir.Node, names: UniqueNames, constants: SharedConstants) -> tuple[ir.Value, list[ir.Node]]:
    """The float32 table F whose Cast to uint8 ``answers`` is, and the nodes that make it: for a Gather
    of a constant, the same Gather of its float32 copy, one constant that the root's sites share."""
    if answers.op_type == "Cast":
        return answers.inputs[0], []
    table = constants.get("float_table", ir.tensor(answers.inputs[0].const_value.numpy().astype(np.float32)))
    gather = ir.node("Gather", [table, answers.inputs[1]], name=names.unique(f"{answers.outputs[0].name}_float"))
    return gather.outputs[0], [gather]


def keep_in_float(block: Block, names: UniqueNames, constants: SharedConstants) -> bool:
    """Rewrite an expanded block (see the module docstring), with ``constants`` of the block's root;
    False, and nothing changed, when its body ends neither in Casts to uint8 from float32 nor in
    Gathers from one such table, or the name of ``y - zp`` is taken."""
    y, zero_point = (block.shifts[0].inputs[k].producer().inputs[0] for k in (0, 1))
    ends = y.producer(), zero_point.producer()
    if any(end is None or end.graph is not block.shifts[0].graph for end in ends):
        return False
    answers = _table_gathers(ends)  # the uint8 table's Cast or Gather
    if answers is None and not all(_cast_to(end, UINT8) for end in ends):
        return False
    name = centred_name(y.name)
    if names.unique(name) != name:
        return False
    graph = ends[0].graph
    later = max(ends, key=graph.index)
    if answers is None:
        added = [ir.node("Sub", [ends[0].inputs[0], ends[1].inputs[0]], name=name, outputs=[ir.Value(name=name)])]
    else:  # table - table[zero slot], 770 values, then one Gather per element as before
        table, added = _float_table(answers, names, constants)
        point = ir.node("Gather", [table, ends[1].inputs[1]], name=names.unique(f"{name}_point"))
        shifted = ir.node("Sub", [table, point.outputs[0]], name=names.unique(f"{name}_table"))
        added += [point, shifted, ir.node("Gather", [shifted.outputs[0], ends[0].inputs[1]], name=name,
                                          outputs=[ir.Value(name=name)])]
    centred = added[-1]
    centred.outputs[0].type = ir.TensorType(FLOAT)
    graph.insert_after(later, added)
    casts = [sub.inputs[k].producer() for sub in block.shifts for k in (0, 1)]
    for sub in block.shifts:
        sub.outputs[0].replace_all_uses_with(centred.outputs[0])
    graph.remove([*block.shifts, *dict.fromkeys(casts), *ends], safe=True)
    if answers is not None and not answers.outputs[0].uses() and not answers.outputs[0].is_graph_output():
        data = answers.inputs[0]
        graph.remove(answers, safe=True)
        drop_unused([data])  # lean's uint8 table, once its last site reads the float32 one
    return True


def fold_cast_pair(graph: ir.Graph, output: ir.Value) -> bool:
    """Drop Cast(int32) and the Cast to float32 that alone reads it, after a lowered product in one
    float32 piece whose int32 ``output`` that is; False, and nothing changed, otherwise."""
    cast = output.producer()
    if not _cast_to(cast, INT32):
        return False
    product = cast.inputs[0].producer()
    if product is None or product.op_type not in _PRODUCTS or cast_reader(output) is None:
        return False
    reader = output.uses()[0].node
    value, result = cast.inputs[0], reader.outputs[0]
    result.replace_all_uses_with(value, replace_graph_outputs=True)
    graph.remove([reader, cast], safe=True)
    value.name = result.name
    value.type, value.shape = result.type or value.type, result.shape or value.shape
    return True
