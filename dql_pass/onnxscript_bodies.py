"""DynamicQuantizeLinear written with onnxscript: the single source of every variant's body.

:mod:`dql_pass.decomposition` builds the bodies from here and ships them, so that only building
them again imports onnxscript. Both variants call one shared script for the scale and the zero
point; onnx_ir's inliner flattens the call.
"""

from __future__ import annotations

__all__ = ["scripts"]

import numpy as np
import onnx
import onnxscript
from onnxscript import FLOAT
from onnxscript import opset11 as op

from dql_pass import reference


def _tensor(value: float) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(value, np.float32))


def scripts(zero_range: str) -> dict[str, onnxscript.OnnxFunction]:
    """Every variant as an onnxscript function, under ``zero_range``."""
    zero, qmax, one = _tensor(0.0), _tensor(255.0), _tensor(1.0)
    zero_range_value = _tensor(reference.zero_range_scale(zero_range))

    @onnxscript.script(default_opset=op)
    def scale_and_zero_point(x: FLOAT[...]):
        # What both variants share: the range, the guarded scale and the saturated zero point.
        q_min = op.Constant(value=zero)
        q_max = op.Constant(value=qmax)
        x_min = op.Min(op.ReduceMin(x, keepdims=0), q_min)
        x_max = op.Max(op.ReduceMax(x, keepdims=0), q_min)
        x_range = op.Sub(x_max, x_min)
        zero_range_scale = op.Constant(value=zero_range_value)
        y_scale = op.Where(op.Equal(x_range, q_min), zero_range_scale, op.Div(x_range, q_max))
        zero_point_fp = op.Sub(q_min, op.Div(x_min, y_scale))
        zero_point_sat = op.Where(op.Less(zero_point_fp, q_max), zero_point_fp, q_max)
        return y_scale, zero_point_sat

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
        q_min = op.Constant(value=zero)
        q_max = op.Constant(value=qmax)
        zero_point_rounded = op.Round(zero_point_sat)
        y_zero_point = op.Cast(zero_point_rounded, to=onnx.TensorProto.UINT8)
        # Division, not a reciprocal; round before the zero point is added; saturate last.
        y_fp = op.Add(op.Round(op.Div(x, y_scale)), zero_point_rounded)
        y = op.Cast(op.Clip(y_fp, q_min, q_max), to=onnx.TensorProto.UINT8)
        return y, y_scale, y_zero_point

    return {"quantizelinear": quantizelinear, "arithmetic": arithmetic}
