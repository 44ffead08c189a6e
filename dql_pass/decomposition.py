"""DynamicQuantizeLinear written with primitive ONNX ops, as onnxscript functions.

This module is the single source of the decomposition: the pass, the function mode and the
conformance suites all stamp what it builds. Two variants exist:

- ``quantizelinear``: two reductions, scalar arithmetic for the scale and zero point, then
  QuantizeLinear; as cheap as ONNX's own function body.
- ``arithmetic``: no quantization op at all (Div, Round, Add, Clip, Cast), for runtimes that lack
  QuantizeLinear too.

:func:`variant` gives each one's record (summary, node count, longest path), read off its body.

Both carry the guards that ``docs/SEMANTICS.md`` asks for, on scalars only:

- a zero range (all ±0, or empty) gets the policy's scale, never 0/0;
- a NaN zero point (0/0 when the scale underflows, inf/inf when x holds -inf) saturates to 255,
  through ``Where(Less(zp, 255), zp, 255)``, which is exact for NaN on every runtime, where
  ``Clip`` would keep the NaN.

Every op used means the same from opset 11 to the newest (ReduceMin/ReduceMax without axes reduce
all, Clip takes its bounds as inputs, Round is half to even), so one script serves every opset.
"""

from __future__ import annotations

__all__ = ["FUNCTION_DOMAIN", "Variant", "function_name", "function_proto", "variant"]

import dataclasses
import functools

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common
import onnxscript
from onnxscript import FLOAT
from onnxscript import opset11 as op

from dql_pass import reference
from dql_pass.errors import InputError
from dql_pass.op import MAX_OPSET, MIN_OPSET, NAME, check_choice

FUNCTION_DOMAIN = "dql_pass"


def _tensor(value: float) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(value, np.float32))


def _scripts(zero_range: str) -> dict[str, onnxscript.OnnxFunction]:
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


def function_name(variant: str, zero_range: str) -> str:
    """The name of the model-local function for a variant and zero-range policy."""
    return f"{NAME}_{variant}_{zero_range.replace('-', '_')}"


@functools.cache
def _function_proto(variant: str, opset: int, zero_range: str) -> bytes:
    check_choice("variant", variant)
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise InputError(f"ai.onnx opset {opset} is outside {MIN_OPSET}..{MAX_OPSET}")
    # The variant calls the shared part; onnx_ir's inliner flattens the call into one body.
    model = ir.serde.deserialize_model(_scripts(zero_range)[variant].to_model_proto())
    ir.passes.common.InlinePass()(model)
    model.graph.opset_imports.clear()
    model.graph.opset_imports[""] = opset
    function = ir.Function(FUNCTION_DOMAIN, function_name(variant, zero_range), graph=model.graph, attributes=[])
    return ir.serde.serialize_function(function).SerializeToString()


def function_proto(
    variant: str = "quantizelinear", opset: int = MAX_OPSET, zero_range: str = "onnxruntime"
) -> onnx.FunctionProto:
    """DynamicQuantizeLinear as a FunctionProto at ai.onnx ``opset``: inputs x, outputs y, y_scale, y_zero_point."""
    proto = onnx.FunctionProto()
    proto.ParseFromString(_function_proto(variant, opset, zero_range))
    return proto


_SUMMARIES = {
    "quantizelinear": "two reductions, scalar arithmetic for the scale and the zero point, then QuantizeLinear",
    "arithmetic": "no quantization op at all (Div, Round, Add, Clip, Cast), for runtimes that lack QuantizeLinear too",
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One variant's facts, read off its FunctionProto so that no other file copies them."""

    name: str
    summary: str
    nodes: int  # compute nodes per site, Constant nodes left out (inline mode shares them)
    longest_path: int  # compute nodes on the longest path from x to an output
    op_types: frozenset[str]


@functools.cache
def variant(name: str, opset: int = MAX_OPSET) -> Variant:
    """The record of variant ``name`` at ai.onnx ``opset``."""
    check_choice("variant", name)
    nodes = [node for node in function_proto(name, opset).node if node.op_type != "Constant"]
    depth: dict[str, int] = {}
    for node in nodes:  # a FunctionProto lists its nodes in topological order
        depth.update((output, 1 + max((depth.get(i, 0) for i in node.input), default=0)) for output in node.output)
    return Variant(name, _SUMMARIES[name], len(nodes), max(depth.values()), frozenset(n.op_type for n in nodes))

