"""The lean variant: portable's guarantees through per-site thresholds and Gather. Exact with every
Div a worst-case GPU divider, products fused into sums, and subnormals flushed (but for a subnormal
x or y_scale), emulated by tools.gpu_divider on onnx.reference; and on ORT's CPU kernels."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import assert_outputs_bits_equal, session

import dql_pass
from dql_pass.decomposition import function_proto
from dql_pass.inputs import cases, independent_inputs, large_cases
from dql_pass.op import one_node_model
from dql_pass.reference import dynamic_quantize_linear
from tools import gpu_divider

FUSED = {"moves": 3, "fused": True}
FLUSHED = {"moves": 3, "fused": True, "flush": True}
# Ops the WebGPU provider of onnxruntime-web 1.30 runs, measured with WebGpu.placement() (the int32
# Gather and the Casts to and from int32 included).
WEBGPU_OPS = frozenset({
    "Abs", "Add", "Cast", "Clip", "Concat", "Div", "Floor", "Gather", "Gemm", "Less", "Max", "Min", "Mul", "ReduceMax",
    "ReduceMin", "ReduceSum", "Reshape", "Sub", "ThresholdedRelu", "Where",
})


@pytest.fixture(scope="module")
def catalogue() -> list[np.ndarray]:
    """The catalogue's comparable inputs (its ties, extremes, subnormals, ±inf, empty) and the large cases."""
    return [c.x for c in cases(random_count=0) + large_cases() if c.comparable]


@pytest.mark.parametrize("freedoms", [FUSED, FLUSHED], ids=["div 3 ulp, fused", "flushed"])
@pytest.mark.parametrize("zero_range", dql_pass.ZERO_RANGE_POLICIES)
def test_lean_is_exact_under_the_worst_case_gpu_divider(catalogue, freedoms, zero_range):
    exact, wrong = gpu_divider.exact_inputs("lean", catalogue, zero_range, **freedoms)
    assert wrong == []
    flushed_out = sum(map(gpu_divider.subnormal_input, catalogue)) if freedoms.get("flush") else 0
    assert exact == len(catalogue) - flushed_out > 0


def test_lean_is_exact_on_inputs_built_apart_with_a_far_worse_divider():
    """Its quotients only pick a slot: a Div 64 ulp off changes nothing, here or in the scale."""
    built_apart = [x for _, x in independent_inputs(120, seed=2027)]
    assert gpu_divider.exact_inputs("lean", built_apart, moves=64, fused=True)[1] == []


def test_lean_is_bit_exact_on_ort(catalogue):
    sessions = {}
    for x in catalogue + [x for _, x in independent_inputs(200, seed=5)]:
        if x.ndim not in sessions:
            model = dql_pass.expand(one_node_model([f"d{i}" for i in range(x.ndim)], 21), variant="lean")[0]
            sessions[x.ndim] = session(model)
        assert_outputs_bits_equal(sessions[x.ndim].run({"x": x}), dynamic_quantize_linear(x))


@pytest.mark.parametrize("zero_range", dql_pass.ZERO_RANGE_POLICIES)
def test_every_op_has_a_webgpu_kernel_and_none_that_portable_avoids(zero_range):
    computing = [n for n in function_proto("lean", zero_range=zero_range).node if n.op_type != "Constant"]
    assert {n.op_type for n in computing} <= WEBGPU_OPS
    casts = {n.attribute[0].i for n in computing if n.op_type == "Cast"}
    assert casts <= {onnx.TensorProto.UINT8, onnx.TensorProto.INT32, onnx.TensorProto.FLOAT}
    for node in computing:  # reductions never see an empty tensor
        if node.op_type in ("ReduceMin", "ReduceMax"):
            assert next(n for n in computing if node.input[0] in n.output).op_type == "Concat"


# The inputs whose answers come from lean's table ends and NaN thresholds rather than from guards:
# the scale 0 with x_min = 0 and below 0, an infinite scale with x_min = -inf and with +inf in x,
# a subnormal scale whose zero point saturates, and the zero range.
EDGES = [np.array(v, np.float32) for v in (
    [0.0, 1e-45], [1e-45, 2e-45, 0.0], [-1e-45, 0.0], [-1e-45, 1e-45], [np.inf, -np.inf, 1.0], [-np.inf, 2.0, 0.0],
    [np.inf, 0.5, -3.0], [3.4e38, -3.4e38], [-1e-40, 1e-43], [0.0, -0.0], [-2e-44, 0.0, 1e-45],
)]


@pytest.mark.parametrize("freedoms", [{}, FUSED], ids=["exact", "div 3 ulp, fused"])
def test_lean_answers_the_scale_0_and_infinite_scales_from_its_table(freedoms):
    exact, wrong = gpu_divider.exact_inputs("lean", EDGES, **freedoms)
    assert wrong == [] and exact == len(EDGES)


def test_lean_runs_on_nan_in_x():
    model = dql_pass.expand(one_node_model(["n"], 21), variant="lean")[0]
    ort_session = session(model)
    for values in ([np.nan, 1.0], [np.nan], [np.inf, np.nan]):
        x = np.array(values, np.float32)
        y, _, _ = ort_session.run({"x": x})
        assert y.shape == x.shape
