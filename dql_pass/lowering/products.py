"""MatMulInteger and ConvInteger in float32 primitives: ``Cast(MatMul(Cast(A) - a_zp, B - b_zp), int32)``,
and the same with Conv, exact under the proof of :mod:`dql_pass.lowering.proof`.

- Constant B stays as it is in the file, with ``Cast(B) - b_zp`` in the graph for the runtime to fold
  at load (weights ``integer``), or ``B - b_zp`` is computed once, as a float32 constant four times
  its size (``float``); other weights are cast and shifted at run time. A reduction whose bound
  exceeds 2^24 is cut along K (a 1-D B's only axis) into Slices (of the shifted float32 B, under
  ``integer``) whose products are cast to int32 and added. A per-row ``a_zp`` is left alone;
  ``b_zp`` lies per column, along B's last axis.
- ConvInteger: ORT pads with ``x_zp``, which is 0 once shifted, as Conv pads. ``w_zp`` lies per
  output channel, along W's axis 0. The cut runs along the input channels, and only when ``group``
  is 1.
- A zero point that comes at run time is broadcast as it is: left alone where its shape says it
  holds more than one value, unless that is per column of a B of rank 2 or more.
- Constant weights are widened a block at a time, never whole.
"""

from __future__ import annotations

__all__ = ["CONV_INTEGER", "MATMUL_INTEGER", "Product"]

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from dql_pass.blocking import BLOCK_ELEMENTS
from dql_pass.graph.constants import constant
from dql_pass.lowering.proof import Proof, Unplanned, plan, plan_uniform, span
from dql_pass.lowering.rewrite import (
    FLOAT, INT32, Builder, CannotLower, integer_type, output_is, per_axis_shape, shaped,
)

_PRODUCT_TYPES = {ir.DataType.UINT8: np.uint8, ir.DataType.INT8: np.int8}


def _operand(value: ir.Value, zero_point: ir.Value | None, role: str) -> tuple[ir.DataType, np.ndarray | None, int]:
    """An integer operand's type, its zero point's array (None: absent or not constant) and its span."""
    dtype = integer_type(value, zero_point, _PRODUCT_TYPES, role, "uint8 and int8")
    points = constant(zero_point)
    return dtype, points, span(_PRODUCT_TYPES[dtype], points, zero_point is None or points is not None)


def _several(value: ir.Value) -> bool:
    """Whether a zero point that comes at run time is known to hold more than one value. ORT's
    kernels refuse that but for MatMulInteger's b_zp per column; of unknown shape, it is one."""
    shape = value.shape
    return shape is not None and (len(shape) > 1 or any(isinstance(d, int) and d != 1 for d in shape))


def _shifted(
    b: Builder, value: ir.Value, zero_point: ir.Value | None, points: np.ndarray | None, along: list[int] | None,
) -> ir.Value:
    """``Cast(value) - zero_point`` in float32, exact: both are small integers. A constant zero point
    takes the shape ``along`` (:func:`along`)."""
    cast = b.op("Cast", [value], FLOAT, to=FLOAT)
    if zero_point is None or (points is not None and not points.any()):
        return cast
    if points is not None:
        shift = b.const("zero_point", shaped(points, along).astype(np.float32))
    else:
        shift = b.op("Cast", [zero_point], FLOAT, to=FLOAT)
    return b.op("Sub", [cast, shift], FLOAT)


def _slice(b: Builder, value: ir.Value, start: int, stop: int, axis: int) -> ir.Value:
    bounds = [b.const(role, np.array([v], np.int64)) for role, v in (("start", start), ("stop", stop), ("axis", axis))]
    return b.op("Slice", [value, *bounds], FLOAT)


def _reduce(
    b: Builder,
    proof: Proof,
    product: Callable[[ir.Value, ir.Value], ir.Value],
    activation: ir.Value,
    weights: Callable[[int, int], ir.Value],
    axes: tuple[int, int],
) -> ir.Value:
    """The int32 result: one product, or one per chunk of the reduction added in int32."""
    total = None
    for start, stop in proof.chunks:
        part = activation if len(proof.chunks) == 1 else _slice(b, activation, start, stop, axes[0])
        partial = b.op("Cast", [product(part, weights(start, stop))], INT32, to=INT32)
        total = partial if total is None else b.op("Add", [total, partial], INT32)
    return total


@dataclasses.dataclass(frozen=True)
class Product:
    """What tells MatMulInteger and ConvInteger apart in their lowering; its rule's rewrite and
    test of a sum without terms are its methods."""

    op: str  # the float op: MatMul or Conv
    names: tuple[str, str]  # the operands as the ONNX pages call them
    axes: Callable[[int], tuple[int, int]]  # W's rank -> the reduction axis of the activation and of the weights
    zero_point_axis: Callable[[int], int | None]  # W's rank -> the axis a zero point of several values lies along
    # |centred weights| (uint8), reduction axis -> bound per [reduction, output]
    terms: Callable[[np.ndarray, int], np.ndarray]
    worst: Callable[[ir.Node, int], tuple[int, int]]  # non-constant weights: reduction length, terms per element

    def rewrite(self, node: ir.Node, b: Builder) -> tuple[ir.Value, Proof]:
        return _integer_product(self, node, b)

    def without_terms(self, node: ir.Node) -> bool:
        """Whether the sums have no term: a reduction axis (Conv: a kernel axis too) of known size 0."""
        return _without_terms(self, node)


def _per_reduction(w: np.ndarray, axis: int) -> np.ndarray:
    """``w`` as [reduction, everything else], sized explicitly: K or the rest may be 0."""
    moved = np.moveaxis(w, axis, 0)
    return moved.reshape(moved.shape[0], math.prod(moved.shape[1:]))


def _matmul_worst(node: ir.Node, axis: int) -> tuple[int, int]:
    depth = _static_dim(node.inputs[1], axis)
    if depth is None:
        depth = _static_dim(node.inputs[0], -1)
    if depth is None:
        raise CannotLower("B is not constant and K is unknown, so no bound can be computed")
    return depth, 1


def _conv_worst(node: ir.Node, axis: int) -> tuple[int, int]:
    shape = node.inputs[1].shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise CannotLower("W is not constant and its shape is unknown, so no bound can be computed")
    w_zp = node.inputs[3] if len(node.inputs) > 3 else None
    if w_zp is not None and constant(w_zp) is None and (w_zp.shape is None or math.prod(w_zp.shape) != 1):
        raise CannotLower("W is not constant and its zero point may be per channel")
    return shape[axis], math.prod(shape[2:])


MATMUL_INTEGER = Product(
    "MatMul", ("A", "B"),
    lambda rank: (-1, -2 if rank >= 2 else -1),  # a 1-D B is all reduction
    lambda rank: -1 if rank >= 2 else None,  # per column of B
    _per_reduction,
    _matmul_worst,
)
CONV_INTEGER = Product(
    "Conv", ("X", "W"),
    lambda rank: (1, 1),
    lambda rank: 0,  # per output channel
    lambda w, axis: w.reshape(*w.shape[:2], math.prod(w.shape[2:])).sum(axis=2).T,  # a term per channel pair
    _conv_worst,
)


def _without_terms(kind: Product, node: ir.Node) -> bool:
    a, w = node.inputs[:2]
    a_axis, w_axis = kind.axes(2 if w.shape is None else len(w.shape))
    kernel = list(w.shape[2:]) if kind.op == "Conv" and w.shape is not None else []
    return 0 in (_static_dim(a, a_axis), _static_dim(w, w_axis), *kernel)


def _integer_product(kind: Product, node: ir.Node, b: Builder) -> tuple[ir.Value, Proof]:
    a, w, a_zp, w_zp = (list(node.inputs) + [None] * 4)[:4]
    _, a_points, a_span = _operand(a, a_zp, kind.names[0])
    w_dtype, w_points, w_span = _operand(w, w_zp, kind.names[1])
    output_is(node, INT32)
    if a_points is not None and a_points.size > 1:
        raise CannotLower(f"{kind.names[0]} has more than one zero point (per row)")
    weights = constant(w)
    rank = weights.ndim if weights is not None else None if w.shape is None else len(w.shape)
    # Cast(zero point) broadcasts along the last axis: right for a per-column one, wrong for any other.
    last = rank is not None and kind.zero_point_axis(rank) == -1
    pairs = ((kind.names[0], a_zp, a_points, False), (kind.names[1], w_zp, w_points, last))
    for name, zero_point, points, along_last in pairs:
        per_column = along_last and zero_point is not None and len(zero_point.shape or ()) == 1
        if zero_point is not None and points is None and _several(zero_point) and not per_column:
            raise CannotLower(f"{name}'s zero point comes at run time and may hold more than one value")
    along = None
    if w_points is not None and w_points.size > 1:
        axis = None if rank is None else kind.zero_point_axis(rank)
        if axis is None:
            raise CannotLower(f"{kind.names[1]}'s zero point has {w_points.size} values and {kind.names[1]} has "
                            f"{'no known rank' if rank is None else f'rank {rank}'}")
        along = per_axis_shape((w_points,), axis, w if weights is None else weights, "zero point")
    axes = kind.axes(2 if rank is None else rank)
    known = weights is not None and (w_zp is None or w_points is not None)  # B - b_zp, before any run
    if known:
        shift = None if w_points is None else shaped(w_points, along)
        proof = _planned(lambda: plan(kind.terms(_magnitudes(weights, shift), axes[1]), a_span, "constant weights"))
    else:
        depth, window = kind.worst(node, axes[1])
        worst = f"worst case of {w_dtype.name.lower()} weights"
        proof = _planned(lambda: plan_uniform(depth, a_span * w_span * window, worst))
        if len(proof.chunks) > 1 and rank is None:
            raise CannotLower(f"the bound {proof.bound:,} exceeds 2^24 and {kind.names[1]}'s rank, along which it "
                              "is cut, is unknown")
    if known and b.weights == "float":
        part = lambda start, stop: b.const(  # noqa: E731
            f"weight_{start}_{stop}", _centred(weights[_chunk(weights.ndim, axes[1], start, stop)], shift))
    else:
        # Integer weights stay in the file as they are; constant ones are folded by the runtime at
        # load, chunks included (the cast tensor is sliced: exact, as it holds small integers).
        shifted_w = _shifted(b, w, w_zp, w_points, along)
        part = lambda start, stop: (  # noqa: E731
            shifted_w if len(proof.chunks) == 1 else _slice(b, shifted_w, start, stop, axes[1]))
    group = node.attributes["group"].as_int() if "group" in node.attributes else 1
    if len(proof.chunks) > 1 and group != 1:
        raise CannotLower(
            f"the bound {proof.bound:,} exceeds 2^24 and a grouped convolution (group {group}) is not cut")
    activation = _shifted(b, a, a_zp, a_points, None)
    product = lambda x, y: b.op(kind.op, [x, y], FLOAT, attributes=node.attributes.values())  # noqa: E731
    return _reduce(b, proof, product, activation, part, axes), proof


def _magnitudes(weights: np.ndarray, shift: np.ndarray | None) -> np.ndarray:
    """``|weights - shift|`` of 8-bit weights and zero points, in uint8 (at most 255), the size of
    the weights: computed a block of axis 0 at a time, in int16."""
    magnitudes = np.empty(weights.shape, np.uint8)
    rows = max(1, BLOCK_ELEMENTS // max(1, math.prod(weights.shape[1:])))
    for start in range(0, len(weights), rows):
        block = weights[start:start + rows].astype(np.int16)
        if shift is not None:  # per output channel of a ConvInteger lies along axis 0, as the blocks do
            block -= shift[start:start + rows] if shift.ndim == weights.ndim and len(shift) > 1 else shift
        magnitudes[start:start + rows] = np.abs(block, out=block)
    return magnitudes


def _centred(weights: np.ndarray, shift: np.ndarray | None) -> np.ndarray:
    """``weights - shift`` in float32, exact (small integers): the only copy is the float32 one."""
    centred = weights.astype(np.float32)
    if shift is not None:
        centred -= shift.astype(np.float32)
    return centred


def _planned(planner: Callable[[], Proof]) -> Proof:
    try:
        return planner()
    except Unplanned as reason:
        raise CannotLower(str(reason)) from None


def _chunk(ndim: int, axis: int, start: int, stop: int) -> tuple[slice, ...]:
    """The index of ``[start, stop)`` along ``axis``: a view, where np.take would copy."""
    index = [slice(None)] * ndim
    index[axis] = slice(start, stop)
    return tuple(index)


def _static_dim(value: ir.Value, axis: int) -> int | None:
    shape = value.shape
    if shape is None or not -len(shape) <= axis < len(shape):
        return None
    dim = shape[axis]
    return dim if isinstance(dim, int) else None
