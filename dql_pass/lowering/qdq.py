"""QuantizeLinear and DequantizeLinear in float32 primitives, with constant scale and zero point.

- QuantizeLinear(X, scale, zp), float32 X, 8- or 16-bit output:
  ``Cast(Clip(Where(IsNaN(q), lo, q), lo, hi))`` with ``q = Round(Div(X, scale)) + zp``, ORT's
  order: a division, rounding half to even before the zero point is added; NaN gives the type's
  minimum, as ORT's kernel does. The division is the one the target's exact DQL variant uses
  (:data:`DIVISIONS`): float32 where the runtime rounds it correctly; float64, cast back once,
  where it divides through the reciprocal (the correctly rounded float32 quotient wherever rounding
  can tell); a target whose variant divides otherwise gets QuantizeLinear left alone. Blocked
  quantization (``block_size``) and a division in another ``precision`` than float32 are left alone.
- DequantizeLinear(X, scale, zp), 8- or 16-bit X, float32 scale and output:
  ``Cast(Cast(X, int32) - zp, float32) * scale``, ORT's int32 difference (a float32 Sub would be
  exact too, but OpenVINO fuses it with the Mul into one fma, which rounds otherwise).
- An attribute that lower does not know, or an output type other than the lowering's, leaves the
  node alone.
- Per-axis scales and zero points become constants shaped to broadcast along ``axis``, which needs
  X's rank unless the axis counts from the end; every constant keeps its rank, so outputs do.
"""

from __future__ import annotations

__all__ = ["DEQUANTIZE_ATTRIBUTES", "DIVISIONS", "QUANTIZE_ATTRIBUTES", "dequantize_linear", "quantize_linear"]

import numpy as np
import onnx_ir as ir

from dql_pass import variants
from dql_pass.graph.constants import constant
from dql_pass.lowering.rewrite import (
    BOOL, DOUBLE, FLOAT, INT32, Builder, CannotLower, element_type, integer_type, output_is, per_axis_shape,
    shaped,
)

_QUANTIZED_TYPES = {ir.DataType.UINT8: np.uint8, ir.DataType.INT8: np.int8, ir.DataType.UINT16: np.uint16,
                    ir.DataType.INT16: np.int16}


# How QuantizeLinear divides, by the DQL variant exact on the target: as that variant divides.
DIVISIONS: dict[str, ir.DataType] = {
    v.name: {"float": FLOAT, "double": DOUBLE}[v.division] for v in variants.REGISTRY if v.division is not None
}


# The attributes of QuantizeLinear and DequantizeLinear (opsets 10 to 25); lower checks each value
# below and leaves a node with any other attribute alone.
QUANTIZE_ATTRIBUTES = {"axis", "block_size", "output_dtype", "precision", "saturate"}  # saturate: float8 only
DEQUANTIZE_ATTRIBUTES = {"axis", "block_size", "output_dtype"}


def _int_attribute(node: ir.Node, name: str, default: int = 0) -> int:
    return node.attributes[name].as_int() if name in node.attributes else default


def _quantization_params(node: ir.Node, known: set[str]) -> tuple[np.ndarray, np.ndarray | None]:
    unknown = sorted(set(node.attributes) - known)
    if unknown:
        raise CannotLower(f"its attribute {', '.join(unknown)} is not one lower knows")
    if _int_attribute(node, "block_size"):
        raise CannotLower("blocked quantization (block_size) is not lowered")
    scale = constant(node.inputs[1])
    if scale is None or scale.dtype != np.float32:
        raise CannotLower("its scale is not a float32 constant")
    precision = _int_attribute(node, "precision")
    if precision not in (0, FLOAT):  # 0: the scale's type, float32 here
        raise CannotLower(
            f"it divides in {ir.DataType(precision).name.lower()} (precision), which the lowering does not")
    zero_point = node.inputs[2] if len(node.inputs) > 2 else None
    points = constant(zero_point)
    if zero_point is not None and points is None:
        raise CannotLower("its zero point is not a constant")
    return scale, points


def _param(b: Builder, role: str, array: np.ndarray, shape: list[int] | None, dtype: type = np.float32) -> ir.Value:
    return b.const(role, shaped(array, shape).astype(dtype))


def quantize_linear(node: ir.Node, b: Builder) -> tuple[ir.Value, None]:
    x = node.inputs[0]
    if element_type(x) != FLOAT:
        raise CannotLower("X is not float32")
    scale, points = _quantization_params(node, QUANTIZE_ATTRIBUTES)
    requested = _int_attribute(node, "output_dtype")
    dtype = ir.DataType(requested or ir.DataType.UINT8) if points is None else ir.DataType.from_numpy(points.dtype)
    if requested and requested != dtype:
        raise CannotLower(f"its output_dtype {ir.DataType(requested).name.lower()} is not its zero point's type")
    if dtype not in _QUANTIZED_TYPES:
        raise CannotLower(f"its output is {dtype.name.lower()}; 8- and 16-bit integers are lowered")
    output_is(node, dtype)
    shape = per_axis_shape((scale, points), _int_attribute(node, "axis", 1), x, "scale or zero point")
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
    low, high = (b.const(f"{dtype.name.lower()}_{end}", np.array(value, np.float32))
                 for end, value in (("min", info.min), ("max", info.max)))
    # A NaN quotient: ORT's kernel gives the type's minimum (measured, ORT 1.32 on x86, every 8- and
    # 16-bit type and zero point); a Cast of NaN is undefined.
    q = b.op("Where", [b.op("IsNaN", [q], BOOL), low, q], FLOAT)
    return b.op("Cast", [b.op("Clip", [q, low, high], FLOAT)], dtype, to=dtype), None


def dequantize_linear(node: ir.Node, b: Builder) -> tuple[ir.Value, None]:
    x = node.inputs[0]
    zero_point = node.inputs[2] if len(node.inputs) > 2 else None
    integer_type(x, zero_point, _QUANTIZED_TYPES, "X", "8- and 16-bit integers")
    scale, points = _quantization_params(node, DEQUANTIZE_ATTRIBUTES)
    requested = _int_attribute(node, "output_dtype")
    if requested not in (0, FLOAT):  # 0: the scale's type, float32 here
        raise CannotLower(f"its output is {ir.DataType(requested).name.lower()} (output_dtype); float32 is lowered")
    output_is(node, FLOAT)
    shape = per_axis_shape((scale, points), _int_attribute(node, "axis", 1), x, "scale or zero point")
    if points is not None and points.any():
        # In int32, as ORT subtracts: a float32 Sub before the Mul is exact too, but OpenVINO fuses
        # the pair into one fma(x, scale, -zp * scale) and is then 1 ulp off on about half the values.
        wide = b.op("Cast", [x], INT32, to=INT32)
        shifted = b.op("Sub", [wide, _param(b, "zero_point", points, shape, np.int32)], INT32)
        y = b.op("Cast", [shifted], FLOAT, to=FLOAT)
    else:
        y = b.op("Cast", [x], FLOAT, to=FLOAT)
    return b.op("Mul", [y, _param(b, "scale", scale, shape)], FLOAT), None
