"""What each lowered op becomes, in float32 primitives, and when an op is left alone.

Rules, one per op (ai.onnx domain; each keeps its output name), each one :class:`Rule` record of
:data:`REGISTRY` that holds all there is of it: its rewrite, the exact reference verify checks the
rewrite against, its operand types and the generator of the operands it is checked on:

- MatMulInteger(A, B, a_zp, b_zp): ``Cast(MatMul(Cast(A) - a_zp, B - b_zp), int32)``. Constant B
  stays as it is in the file, with ``Cast(B) - b_zp`` in the graph for the runtime to fold at load
  (weights ``integer``), or ``B - b_zp`` is computed once, as a float32 constant four times its
  size (``float``); other weights are cast and shifted at run time. A reduction whose bound
  exceeds 2^24 (:mod:`dql_pass.lowering.proof`) is cut along K (a 1-D B's only axis) into Slices
  (of the shifted float32 B, under ``integer``) whose products are cast to int32 and added. A
  per-row ``a_zp`` is left alone; ``b_zp`` lies per column, along B's last axis.
- ConvInteger(X, W, x_zp, w_zp): the same with Conv and its attributes; ORT pads with ``x_zp``,
  which is 0 once shifted, as Conv pads. ``w_zp`` lies per output channel, along W's axis 0. The
  cut runs along the input channels, and only when ``group`` is 1.
- A zero point that comes at run time is broadcast as it is: left alone where its shape says it
  holds more than one value, unless that is per column of a B of rank 2 or more.
- QuantizeLinear(X, scale, zp) with constant scale and zero point, float32 X, 8- or 16-bit output:
  ``Cast(Clip(Where(IsNaN(q), lo, q), lo, hi))`` with ``q = Round(Div(X, scale)) + zp``, ORT's
  order: a division, rounding half to even before the zero point is added; NaN gives the type's
  minimum, as ORT's kernel does (measured on x86). The division is the one the target's exact DQL
  variant uses (:data:`DIVISIONS`): float32 where the runtime rounds it correctly; float64, cast
  back once, where it divides through the reciprocal (the correctly rounded float32 quotient
  wherever rounding can tell); a target whose variant divides otherwise gets QuantizeLinear left
  alone. Blocked quantization (``block_size``) and a division in another ``precision`` than
  float32 are left alone.
- DequantizeLinear(X, scale, zp) with constant scale and zero point, 8- or 16-bit X, float32 scale
  and output: ``Cast(Cast(X, int32) - zp, float32) * scale``, ORT's int32 difference; a float32
  Sub would be exact too, but OpenVINO fuses it with the Mul into one fma (measured: 1 ulp off on
  about half the values).
- An attribute of QuantizeLinear or DequantizeLinear that lower does not know, or an output type
  other than the lowering's, leaves the node alone.
- Per-axis scales and zero points become constants shaped to broadcast along ``axis``, which needs
  X's rank unless the axis counts from the end; every constant keeps its rank, so outputs do.
- Whatever a rule cannot prove exact raises :class:`CannotLower` with the reason.
"""

from __future__ import annotations

__all__ = ["DIVISIONS", "LOWERED", "REGISTRY", "RULES", "Builder", "CannotLower", "Lowering", "Rule", "element_type",
           "lower_node"]

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from dql_pass import reference, variants
from dql_pass.graph.constants import constant
from dql_pass.lowering import operands
from dql_pass.lowering.proof import Proof, Unplanned, plan, plan_uniform, span
from dql_pass.op import is_dql

FLOAT, DOUBLE, INT32, BOOL = ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.INT32, ir.DataType.BOOL
_PRODUCT_TYPES = {ir.DataType.UINT8: np.uint8, ir.DataType.INT8: np.int8}
_QUANTIZED_TYPES = {**_PRODUCT_TYPES, ir.DataType.UINT16: np.uint16, ir.DataType.INT16: np.int16}


# How QuantizeLinear divides, by the DQL variant exact on the target: as that variant divides.
DIVISIONS: dict[str, ir.DataType] = {
    v.name: {"float": FLOAT, "double": DOUBLE}[v.division] for v in variants.REGISTRY if v.division is not None
}


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

    def op(self, op_type: str, inputs: Sequence[ir.Value | None], dtype: ir.DataType, attributes=(), **attrs) -> ir.Value:
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


def _operand(value: ir.Value, zero_point: ir.Value | None, role: str) -> tuple[ir.DataType, np.ndarray | None, int]:
    """An integer operand's type, its zero point's array (None: absent or not constant) and its span."""
    dtype = element_type(value) or (element_type(zero_point) if zero_point is not None else None)
    if dtype not in _PRODUCT_TYPES:
        raise CannotLower(f"{role} is {'of unknown type' if dtype is None else dtype.name.lower()}; uint8 and int8 are lowered")
    points = constant(zero_point)
    return dtype, points, span(_PRODUCT_TYPES[dtype], points, zero_point is None or points is not None)


def _several(value: ir.Value) -> bool:
    """Whether a zero point that comes at run time is known to hold more than one value. ORT's
    kernels refuse that but for MatMulInteger's b_zp per column; of unknown shape, it is one."""
    shape = value.shape
    return shape is not None and (len(shape) > 1 or any(isinstance(d, int) and d != 1 for d in shape))


def _shifted(b: Builder, value: ir.Value, zero_point: ir.Value | None, points: np.ndarray | None, along: list[int] | None) -> ir.Value:
    """``Cast(value) - zero_point`` in float32, exact: both are small integers. A constant zero point
    takes the shape ``along`` (:func:`_along`)."""
    cast = b.op("Cast", [value], FLOAT, to=FLOAT)
    if zero_point is None or (points is not None and not points.any()):
        return cast
    if points is not None:
        shift = b.const("zero_point", _shaped(points, along).astype(np.float32))
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
class _Product:
    """What tells MatMulInteger and ConvInteger apart in their lowering."""

    op: str  # the float op: MatMul or Conv
    names: tuple[str, str]  # the operands as the ONNX pages call them
    axes: Callable[[int], tuple[int, int]]  # W's rank -> the reduction axis of the activation and of the weights
    zero_point_axis: Callable[[int], int | None]  # W's rank -> the axis a zero point of several values lies along
    terms: Callable[[np.ndarray, int], np.ndarray]  # |centred weights| (uint8), reduction axis -> bound per [reduction, output]
    worst: Callable[[ir.Node, int], tuple[int, int]]  # non-constant weights: reduction length, terms per element


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


_PRODUCTS = {
    "MatMulInteger": _Product(
        "MatMul", ("A", "B"),
        lambda rank: (-1, -2 if rank >= 2 else -1),  # a 1-D B is all reduction
        lambda rank: -1 if rank >= 2 else None,  # per column of B
        _per_reduction,
        _matmul_worst,
    ),
    "ConvInteger": _Product(
        "Conv", ("X", "W"),
        lambda rank: (1, 1),
        lambda rank: 0,  # per output channel
        lambda w, axis: w.reshape(*w.shape[:2], math.prod(w.shape[2:])).sum(axis=2).T,  # a term per channel pair
        _conv_worst,
    ),
}


def _without_terms(node: ir.Node) -> bool:
    """Whether the product's sums have no term: a reduction axis (ConvInteger: a kernel axis too) of known size 0."""
    kind = _PRODUCTS[node.op_type]
    a, w = node.inputs[:2]
    a_axis, w_axis = kind.axes(2 if w.shape is None else len(w.shape))
    kernel = list(w.shape[2:]) if kind.op == "Conv" and w.shape is not None else []
    return 0 in (_static_dim(a, a_axis), _static_dim(w, w_axis), *kernel)


def _integer_product(node: ir.Node, b: Builder) -> tuple[ir.Value, Proof]:
    kind = _PRODUCTS[node.op_type]
    a, w, a_zp, w_zp = (list(node.inputs) + [None] * 4)[:4]
    _, a_points, a_span = _operand(a, a_zp, kind.names[0])
    w_dtype, w_points, w_span = _operand(w, w_zp, kind.names[1])
    _output_is(node, INT32)
    if a_points is not None and a_points.size > 1:
        raise CannotLower(f"{kind.names[0]} has more than one zero point (per row)")
    weights = constant(w)
    rank = weights.ndim if weights is not None else None if w.shape is None else len(w.shape)
    # Cast(zero point) broadcasts along the last axis: right for a per-column one, wrong for any other.
    last = rank is not None and kind.zero_point_axis(rank) == -1
    for name, zero_point, points, along_last in ((kind.names[0], a_zp, a_points, False), (kind.names[1], w_zp, w_points, last)):
        if zero_point is not None and points is None and _several(zero_point) and not (along_last and len(zero_point.shape) == 1):
            raise CannotLower(f"{name}'s zero point comes at run time and may hold more than one value")
    along = None
    if w_points is not None and w_points.size > 1:
        axis = None if rank is None else kind.zero_point_axis(rank)
        if axis is None:
            raise CannotLower(f"{kind.names[1]}'s zero point has {w_points.size} values and {kind.names[1]} has "
                            f"{'no known rank' if rank is None else f'rank {rank}'}")
        along = _along((w_points,), axis, w if weights is None else weights, "zero point")
    axes = kind.axes(2 if rank is None else rank)
    known = weights is not None and (w_zp is None or w_points is not None)  # B - b_zp, before any run
    if known:
        shift = None if w_points is None else _shaped(w_points, along)
        proof = _planned(lambda: plan(kind.terms(_magnitudes(weights, shift), axes[1]), a_span, "constant weights"))
    else:
        depth, window = kind.worst(node, axes[1])
        proof = _planned(lambda: plan_uniform(depth, a_span * w_span * window, f"worst case of {w_dtype.name.lower()} weights"))
        if len(proof.chunks) > 1 and rank is None:
            raise CannotLower(f"the bound {proof.bound:,} exceeds 2^24 and {kind.names[1]}'s rank, along which it is cut, is unknown")
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
        raise CannotLower(f"the bound {proof.bound:,} exceeds 2^24 and a grouped convolution (group {group}) is not cut")
    activation = _shifted(b, a, a_zp, a_points, None)
    product = lambda x, y: b.op(kind.op, [x, y], FLOAT, attributes=node.attributes.values())  # noqa: E731
    return _reduce(b, proof, product, activation, part, axes), proof


_BLOCK = 1 << 20  # elements: the weights are widened this many at a time, never whole


def _magnitudes(weights: np.ndarray, shift: np.ndarray | None) -> np.ndarray:
    """``|weights - shift|`` of 8-bit weights and zero points, in uint8 (at most 255), the size of
    the weights: computed a block of axis 0 at a time, in int16."""
    magnitudes = np.empty(weights.shape, np.uint8)
    rows = max(1, _BLOCK // max(1, math.prod(weights.shape[1:])))
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


def _along(params: Sequence[np.ndarray | None], axis: int, value: ir.Value | np.ndarray, role: str) -> list[int] | None:
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
        raise CannotLower(f"its {role} has {' and '.join(map(str, sorted(sizes)))} values along axis {axis}, of size {dim}")
    return [-1] + [1] * (len(shape) - axis % len(shape) - 1)


# The attributes of QuantizeLinear and DequantizeLinear (opsets 10 to 25); lower checks each value
# below and leaves a node with any other attribute alone.
_ATTRIBUTES = {
    "QuantizeLinear": {"axis", "block_size", "output_dtype", "precision", "saturate"},  # saturate: float8 only
    "DequantizeLinear": {"axis", "block_size", "output_dtype"},
}


def _int_attribute(node: ir.Node, name: str, default: int = 0) -> int:
    return node.attributes[name].as_int() if name in node.attributes else default


def _quantization_params(node: ir.Node) -> tuple[np.ndarray, np.ndarray | None]:
    unknown = sorted(set(node.attributes) - _ATTRIBUTES[node.op_type])
    if unknown:
        raise CannotLower(f"its attribute {', '.join(unknown)} is not one lower knows")
    if _int_attribute(node, "block_size"):
        raise CannotLower("blocked quantization (block_size) is not lowered")
    scale = constant(node.inputs[1])
    if scale is None or scale.dtype != np.float32:
        raise CannotLower("its scale is not a float32 constant")
    precision = _int_attribute(node, "precision")
    if precision not in (0, FLOAT):  # 0: the scale's type, float32 here
        raise CannotLower(f"it divides in {ir.DataType(precision).name.lower()} (precision), which the lowering does not")
    zero_point = node.inputs[2] if len(node.inputs) > 2 else None
    points = constant(zero_point)
    if zero_point is not None and points is None:
        raise CannotLower("its zero point is not a constant")
    return scale, points


def _output_is(node: ir.Node, dtype: ir.DataType) -> None:
    """The lowering gives ``dtype``: a node whose output is declared otherwise is left alone."""
    declared = node.outputs[0].dtype
    if declared is not None and declared != dtype:
        raise CannotLower(f"its output is declared {declared.name.lower()}, the lowering gives {dtype.name.lower()}")


def _shaped(array: np.ndarray, shape: list[int] | None) -> np.ndarray:
    return array.reshape(() if shape is None else shape)


def _param(b: Builder, role: str, array: np.ndarray, shape: list[int] | None, dtype: type = np.float32) -> ir.Value:
    return b.const(role, _shaped(array, shape).astype(dtype))


def _quantize_linear(node: ir.Node, b: Builder) -> tuple[ir.Value, None]:
    x = node.inputs[0]
    if element_type(x) != FLOAT:
        raise CannotLower("X is not float32")
    scale, points = _quantization_params(node)
    requested = _int_attribute(node, "output_dtype")
    dtype = ir.DataType(requested or ir.DataType.UINT8) if points is None else ir.DataType.from_numpy(points.dtype)
    if requested and requested != dtype:
        raise CannotLower(f"its output_dtype {ir.DataType(requested).name.lower()} is not its zero point's type")
    if dtype not in _QUANTIZED_TYPES:
        raise CannotLower(f"its output is {dtype.name.lower()}; 8- and 16-bit integers are lowered")
    _output_is(node, dtype)
    shape = _along((scale, points), _int_attribute(node, "axis", 1), x, "scale or zero point")
    division = DIVISIONS.get(b.variant)
    if division is None:
        raise CannotLower(f"the target's exact variant {b.variant} does not divide in float32 or float64")
    if division == DOUBLE:
        wide = b.op("Div", [b.op("Cast", [x], DOUBLE, to=DOUBLE), _param(b, "scale", scale, shape, np.float64)], DOUBLE)
        quotient = b.op("Cast", [wide], FLOAT, to=FLOAT)
    else:
        quotient = b.op("Div", [x, _param(b, "scale", scale, shape)], FLOAT)
    q = b.op("Round", [quotient], FLOAT)
    if points is not None and points.any():
        q = b.op("Add", [q, _param(b, "zero_point", points, shape)], FLOAT)
    info = np.iinfo(_QUANTIZED_TYPES[dtype])
    low, high = (b.const(f"{dtype.name.lower()}_{end}", np.array(value, np.float32)) for end, value in (("min", info.min), ("max", info.max)))
    # A NaN quotient: ORT's kernel gives the type's minimum (measured, ORT 1.32 on x86, every 8- and
    # 16-bit type and zero point); a Cast of NaN is undefined.
    q = b.op("Where", [b.op("IsNaN", [q], BOOL), low, q], FLOAT)
    return b.op("Cast", [b.op("Clip", [q, low, high], FLOAT)], dtype, to=dtype), None


def _dequantize_linear(node: ir.Node, b: Builder) -> tuple[ir.Value, None]:
    x = node.inputs[0]
    dtype = element_type(x) or (element_type(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] is not None else None)
    if dtype not in _QUANTIZED_TYPES:
        raise CannotLower(f"X is {'of unknown type' if dtype is None else dtype.name.lower()}; 8- and 16-bit integers are lowered")
    scale, points = _quantization_params(node)
    requested = _int_attribute(node, "output_dtype")
    if requested not in (0, FLOAT):  # 0: the scale's type, float32 here
        raise CannotLower(f"its output is {ir.DataType(requested).name.lower()} (output_dtype); float32 is lowered")
    _output_is(node, FLOAT)
    shape = _along((scale, points), _int_attribute(node, "axis", 1), x, "scale or zero point")
    if points is not None and points.any():
        # In int32, as ORT subtracts: a float32 Sub before the Mul is exact too, but OpenVINO fuses
        # the pair into one fma(x, scale, -zp * scale) and is then 1 ulp off on about half the values.
        shifted = b.op("Sub", [b.op("Cast", [x], INT32, to=INT32), _param(b, "zero_point", points, shape, np.int32)], INT32)
        y = b.op("Cast", [shifted], FLOAT, to=FLOAT)
    else:
        y = b.op("Cast", [x], FLOAT, to=FLOAT)
    return b.op("Mul", [y, _param(b, "scale", scale, shape)], FLOAT), None


# -- the rules ---------------------------------------------------------------------------------------

Attributes = Mapping[str, object]  # a node's attributes by name, their values as onnx_ir gives them


@dataclasses.dataclass(frozen=True)
class Rule:
    """A lowering rule, the one place it lives: the op it lowers (ai.onnx), its rewrite, and what
    verify checks the rewrite against: the exact reference in :mod:`dql_pass.reference` it names,
    fed the node's inputs in order and the keyword arguments its attributes give, on the operands
    its generator in :mod:`dql_pass.lowering.operands` makes, of the types the node's inputs have."""

    op_type: str
    rewrite: Callable[[ir.Node, Builder], tuple[ir.Value, Proof | None]]
    reference: Callable[..., np.ndarray]
    keywords: Callable[[Attributes, Sequence[np.ndarray | None]], dict[str, object]]  # attributes, operands
    operand_types: Callable[[ir.Node], tuple[ir.DataType | None, ...]]
    cases: Callable[[operands.Site, np.random.Generator], operands.Cases]
    # (operand, its zero point): the inputs a block (dql_pass.lowering.blocks) may feed as one
    # float32 difference, which verify then feeds as such.
    centred: tuple[tuple[int, int], ...] = ()
    # Whether the node's output is a sum without terms, which ONNX defines 0 and ORT 1.32 leaves
    # unwritten (whatever its memory held): verify holds ORIGINAL's to 0.
    without_terms: Callable[[ir.Node], bool] = lambda node: False

    def expected(self, arrays: Sequence[np.ndarray | None], attributes: Attributes) -> np.ndarray:
        """The exact result of the op on ``arrays``, one per input (None: absent)."""
        return self.reference(*arrays, **self.keywords(attributes, arrays))


def _own_types(node: ir.Node) -> tuple[ir.DataType | None, ...]:
    return tuple(None if v is None else element_type(v) for v in node.inputs)


def _zero_point_types(node: ir.Node) -> tuple[ir.DataType | None, ...]:
    """Each input's type, an integer operand of unknown type taking its zero point's: they share one."""
    types = list(_own_types(node))
    for i in range(min(2, len(types) - 2)):
        types[i] = types[i] or types[i + 2]
    return tuple(types)


def _conv_keywords(attributes: Attributes, arrays: Sequence[np.ndarray | None]) -> dict[str, object]:
    if arrays[0].ndim == 2:  # no spatial axis
        return {}
    pads = attributes.get("pads")
    if attributes.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        pads = operands.same_pads(arrays[0].shape[2:], arrays[1].shape[2:], attributes, attributes["auto_pad"])
    return {"pads": pads, "strides": attributes.get("strides"), "dilations": attributes.get("dilations"),
            "group": int(attributes.get("group", 1))}


def _no_keywords(attributes: Attributes, arrays: Sequence[np.ndarray | None]) -> dict[str, object]:
    return {}


def _quantize_keywords(attributes: Attributes, arrays: Sequence[np.ndarray | None]) -> dict[str, object]:
    precision = attributes.get("precision")  # opset 23: the type the division rounds to
    return {**_dequantize_keywords(attributes, arrays),
            "dtype": ir.DataType(attributes.get("output_dtype") or ir.DataType.UINT8).numpy(),
            **({"precision": ir.DataType(precision).numpy()} if precision else {})}


def _dequantize_keywords(attributes: Attributes, arrays: Sequence[np.ndarray | None]) -> dict[str, object]:
    block_size = int(attributes.get("block_size", 0))  # opset 21: blocked scales
    return {"axis": int(attributes.get("axis", 1)), **({"block_size": block_size} if block_size else {})}


# The only list of the rules: adding one adds its record here and the reference it names.
REGISTRY: tuple[Rule, ...] = (
    Rule("MatMulInteger", rewrite=_integer_product, reference=reference.matmul_integer, keywords=_no_keywords,
         operand_types=_zero_point_types, cases=operands.matmul_integer, centred=((0, 2), (1, 3)),
         without_terms=_without_terms),
    Rule("ConvInteger", rewrite=_integer_product, reference=reference.conv_integer, keywords=_conv_keywords,
         operand_types=_zero_point_types, cases=operands.conv_integer, centred=((0, 2), (1, 3)),
         without_terms=_without_terms),
    Rule("QuantizeLinear", rewrite=_quantize_linear, reference=reference.quantize_linear, keywords=_quantize_keywords,
         operand_types=_own_types, cases=operands.quantize_linear),  # x is float, its zero point an integer
    Rule("DequantizeLinear", rewrite=_dequantize_linear, reference=reference.dequantize_linear,
         keywords=_dequantize_keywords, operand_types=_zero_point_types, cases=operands.dequantize_linear),
)
RULES: dict[str, Rule] = {rule.op_type: rule for rule in REGISTRY}
LOWERED: tuple[str, ...] = tuple(RULES)


def lower_node(node: ir.Node, builder: Builder) -> Lowering:
    """The lowering of ``node``, one of :data:`LOWERED`; :class:`CannotLower` when it cannot be exact."""
    if len(node.outputs) != 1 or not node.inputs or any(v is None for v in node.inputs[:2]):
        raise CannotLower("it lacks an input or has other outputs than one")
    output, proof = RULES[node.op_type].rewrite(node, builder)
    return Lowering(builder.nodes, output, proof)
