"""What every lowering rule builds with: the :class:`Builder` of a site's new nodes, :class:`CannotLower`
with its reason, a value's element type, and the shape per-axis constants take.

Rules: a rewrite adds nodes only through its Builder, whose names share one fresh prefix and whose
constants are shared within the node's root; whatever it cannot prove exact raises CannotLower.
"""

from __future__ import annotations

__all__ = ["BOOL", "DOUBLE", "FLOAT", "INT32", "Builder", "CannotLower", "Lowering", "element_type", "integer_type",
           "output_is", "per_axis_shape", "shaped"]

import dataclasses
from collections.abc import Callable, Collection, Sequence

import numpy as np
import onnx_ir as ir

from dql_pass.lowering.proof import Proof
from dql_pass.op import is_dql

FLOAT, DOUBLE, INT32, BOOL = ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.INT32, ir.DataType.BOOL


class CannotLower(Exception):
    """The node cannot be lowered exactly; the message says why."""


@dataclasses.dataclass(frozen=True)
class Lowering:
    """What replaces one node: its new nodes, the value in place of its output, and the proof, if a reduction."""

    nodes: list[ir.Node]
    output: ir.Value
    proof: Proof | None


class Builder:
    """New nodes for one site, named under one fresh prefix; constants come from ``constant``
    (role, array), which shares them within the node's root. ``variant``: the DQL variant exact on
    the target, whose division QuantizeLinear uses; ``weights``: how constant integer weights are
    stored (:data:`dql_pass.variants.WEIGHTS`)."""

    def __init__(
        self, prefix: str, constant: Callable[[str, np.ndarray], ir.Value], variant: str = "arithmetic",
        weights: str = "float",
    ):
        self.prefix = prefix
        self.variant = variant
        self.weights = weights
        self.nodes: list[ir.Node] = []
        self._constant = constant

    def const(self, role: str, array: np.ndarray) -> ir.Value:
        return self._constant(self.prefix + role, array)

    def op(
        self, op_type: str, inputs: Sequence[ir.Value | None], dtype: ir.DataType, attributes=(), **attrs,
    ) -> ir.Value:
        name = f"{self.prefix}{op_type}_{len(self.nodes)}"
        output = ir.Value(name=name, type=ir.TensorType(dtype))
        attributes = [*attributes, *ir.convenience.convert_attributes(attrs)]
        self.nodes.append(ir.Node("", op_type, inputs, attributes=attributes, outputs=[output], name=name))
        return output


def element_type(value: ir.Value) -> ir.DataType | None:
    """The element type of ``value``, also where the model declares none but its producer fixes it."""
    if value.dtype is not None:
        return value.dtype
    tensor = ir.convenience.get_const_tensor(value)  # a Constant node's output, say
    if tensor is not None:
        return tensor.dtype
    producer = value.producer()
    if producer is None:
        return None
    if is_dql(producer) and value.index() in (0, 2):  # y and y_zero_point
        return ir.DataType.UINT8
    if producer.op_type == "Cast" and "to" in producer.attributes:
        return ir.DataType(producer.attributes["to"].as_int())
    return None


def integer_type(
    value: ir.Value, zero_point: ir.Value | None, lowered: Collection[ir.DataType], role: str, which: str,
) -> ir.DataType:
    """The element type of an integer operand, its zero point's where its own is unknown (they share
    one); CannotLower, saying ``which`` types are lowered, unless it is one of ``lowered``."""
    dtype = element_type(value) or (element_type(zero_point) if zero_point is not None else None)
    if dtype not in lowered:
        kind = "of unknown type" if dtype is None else dtype.name.lower()
        raise CannotLower(f"{role} is {kind}; {which} are lowered")
    return dtype


def per_axis_shape(
    params: Sequence[np.ndarray | None], axis: int, value: ir.Value | np.ndarray, role: str,
) -> list[int] | None:
    """The shape per-axis ``params`` take to broadcast along ``axis`` of ``value``, keeping its rank;
    None when each is a single value."""
    sizes = {p.size for p in params if p is not None and p.size > 1}
    if not sizes:
        return None
    if any(p.ndim > 1 for p in params if p is not None):
        raise CannotLower(f"its {role} has more than one dimension")
    shape = value.shape
    if shape is None:
        if axis >= 0:
            raise CannotLower(f"per-axis {role} on axis {axis} of an input of unknown rank")
        return [-1] + [1] * (-axis - 1)  # counted from the end: no rank needed
    if not -len(shape) <= axis < len(shape):
        raise CannotLower(f"axis {axis} is outside an input of rank {len(shape)}")
    dim = shape[axis]
    if len(sizes) > 1 or (isinstance(dim, int) and dim not in sizes):
        counts = " and ".join(map(str, sorted(sizes)))
        raise CannotLower(f"its {role} has {counts} values along axis {axis}, of size {dim}")
    return [-1] + [1] * (len(shape) - axis % len(shape) - 1)


def output_is(node: ir.Node, dtype: ir.DataType) -> None:
    """The lowering gives ``dtype``: a node whose output is declared otherwise is left alone."""
    declared = node.outputs[0].dtype
    if declared is not None and declared != dtype:
        raise CannotLower(f"its output is declared {declared.name.lower()}, the lowering gives {dtype.name.lower()}")


def shaped(array: np.ndarray, shape: list[int] | None) -> np.ndarray:
    return array.reshape(() if shape is None else shape)
