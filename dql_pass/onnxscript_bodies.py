"""DynamicQuantizeLinear written with onnxscript: the single source of every variant's body.

:mod:`dql_pass.decomposition` builds the bodies from here and ships them, so that only building
them again imports onnxscript. The variants call shared scripts for the pieces they have in
common; onnx_ir's inliner flattens the calls.
"""

from __future__ import annotations

__all__ = ["scripts"]

import numpy as np
import onnx
import onnxscript
from onnxscript import FLOAT
from onnxscript import opset11 as op

from dql_pass import reference


def _tensor(value, dtype=np.float32) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(value, dtype))


def scripts(zero_range: str) -> dict[str, onnxscript.OnnxFunction]:
    """Every variant as an onnxscript function, under ``zero_range``."""
    zero, qmax, one = _tensor(0.0), _tensor(255.0), _tensor(1.0)
    qmax64, flat, zero_1d = _tensor(255.0, np.float64), _tensor([-1], np.int64), _tensor([0.0])
    zero_range_value = _tensor(reference.zero_range_scale(zero_range))

    @onnxscript.script(default_opset=op)
    def extremes(x: FLOAT[...]):
        # The range always includes 0.
        q_min = op.Constant(value=zero)
        x_min = op.Min(op.ReduceMin(x, keepdims=0), q_min)
        x_max = op.Max(op.ReduceMax(x, keepdims=0), q_min)
        return x_min, x_max

    @onnxscript.script(default_opset=op)
    def extremes_never_empty(x: FLOAT[...]):
        # The reductions see x and one 0: the range includes 0 and a runtime whose reductions
        # refuse an empty tensor (PyTorch's) never gets one.
        with_zero = op.Concat(op.Reshape(x, op.Constant(value=flat)), op.Constant(value=zero_1d), axis=0)
        return op.ReduceMin(with_zero, keepdims=0), op.ReduceMax(with_zero, keepdims=0)

    @onnxscript.script(default_opset=op)
    def guarded_scale(x_range: FLOAT, scale_fp: FLOAT):
        # A zero range (all ±0, or empty) gets the policy's scale, never 0/0.
        q_min = op.Constant(value=zero)
        zero_range_scale = op.Constant(value=zero_range_value)
        return op.Where(op.Equal(x_range, q_min), zero_range_scale, scale_fp)

    @onnxscript.script(default_opset=op)
    def saturated_zero_point(x_min_quotient: FLOAT):
        # A NaN quotient (0/0, inf/inf) saturates to 255: Where is exact for NaN, Clip keeps it.
        q_min = op.Constant(value=zero)
        q_max = op.Constant(value=qmax)
        zero_point_fp = op.Sub(q_min, x_min_quotient)
        return op.Where(op.Less(zero_point_fp, q_max), zero_point_fp, q_max)

    @onnxscript.script(default_opset=op)
    def divide_in_float64(a: FLOAT, b: FLOAT):
        # A float64 quotient, cast back once, is the correctly rounded float32 quotient even where
        # the runtime divides through a reciprocal (see docs/SEMANTICS.md).
        return op.Cast(op.Div(op.Cast(a, to=onnx.TensorProto.DOUBLE), op.Cast(b, to=onnx.TensorProto.DOUBLE)), to=onnx.TensorProto.FLOAT)

    @onnxscript.script(default_opset=op)
    def scale_and_zero_point(x: FLOAT[...]):
        x_min, x_max = extremes(x)
        x_range = op.Sub(x_max, x_min)
        q_max = op.Constant(value=qmax)
        y_scale = guarded_scale(x_range, op.Div(x_range, q_max))
        return y_scale, saturated_zero_point(op.Div(x_min, y_scale))

    @onnxscript.script(default_opset=op)
    def rounded(quotient: FLOAT[...], zero_point_sat: FLOAT):
        # Round before the zero point is added (ties go to even by the quotient); saturate last.
        q_min = op.Constant(value=zero)
        q_max = op.Constant(value=qmax)
        zero_point_rounded = op.Round(zero_point_sat)
        y_zero_point = op.Cast(zero_point_rounded, to=onnx.TensorProto.UINT8)
        y_fp = op.Add(op.Round(quotient), zero_point_rounded)
        y = op.Cast(op.Clip(y_fp, q_min, q_max), to=onnx.TensorProto.UINT8)
        return y, y_zero_point

    @onnxscript.script(default_opset=op)
    def quantizelinear(x: FLOAT[...]):
        y_scale, zero_point_sat = scale_and_zero_point(x)
        # QuantizeLinear with scale 1 rounds half to even, saturates and casts in one node.
        unit_scale = op.Constant(value=one)
        y_zero_point = op.QuantizeLinear(zero_point_sat, unit_scale)
        y = op.QuantizeLinear(x, y_scale, y_zero_point)
        return y, y_scale, y_zero_point

    @onnxscript.script(default_opset=op)
    def arithmetic(x: FLOAT[...]):
        y_scale, zero_point_sat = scale_and_zero_point(x)
        # Division, not a reciprocal.
        y, y_zero_point = rounded(op.Div(x, y_scale), zero_point_sat)
        return y, y_scale, y_zero_point

    @onnxscript.script(default_opset=op)
    def float64(x: FLOAT[...]):
        x_min, x_max = extremes_never_empty(x)
        # float32: in float64, [3e38, -3e38] would get a finite scale.
        x_range = op.Sub(x_max, x_min)
        q_max64 = op.Constant(value=qmax64)
        scale_fp = op.Cast(op.Div(op.Cast(x_range, to=onnx.TensorProto.DOUBLE), q_max64), to=onnx.TensorProto.FLOAT)
        y_scale = guarded_scale(x_range, scale_fp)
        zero_point_sat = saturated_zero_point(divide_in_float64(x_min, y_scale))
        y, y_zero_point = rounded(divide_in_float64(x, y_scale), zero_point_sat)
        return y, y_scale, y_zero_point

    return {"quantizelinear": quantizelinear, "arithmetic": arithmetic, "float64": float64}
