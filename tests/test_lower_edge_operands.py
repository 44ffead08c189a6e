"""lower at the operands' edges: zero points along the right axis, an exact
DequantizeLinear on OpenVINO, Q/DQ attributes lower does not compute, 1-D and empty products, ranks
kept, and NaN as ORT quantizes it.

Every lowered model passes onnx's checker and strict shape inference, and is compared bit for bit
with ORT's own kernel (optimization "none") and with :mod:`dql_pass.reference`.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.reference
import pytest
from helpers import assert_outputs_bits_equal, installed
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import reference, runtimes

ORT = runtimes.get("onnxruntime")
U8, S8, U16, S16, F32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16, TensorProto.FLOAT
NP = {U8: np.uint8, S8: np.int8, U16: np.uint16, S16: np.int16}


def _model(node: onnx.NodeProto, inputs: dict[str, tuple[int, list | None]], output: tuple[int, list | None],
           constants: dict[str, np.ndarray], opset: int = 21) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], *output)],
        [numpy_helper.from_array(a, n) for n, a in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _lowered(model: onnx.ModelProto, target: str | None = None,
             gone: bool = True) -> tuple[onnx.ModelProto, dql_pass.LowerReport]:
    """The lowered model, which must pass the checker and strict shape inference, with the original's output shapes."""
    lowered, report = dql_pass.lower(model, target=target)
    onnx.checker.check_model(lowered, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(lowered, check_type=True, strict_mode=True)
    assert [o.type for o in inferred.graph.output] == [o.type for o in model.graph.output]
    op = model.graph.node[0].op_type
    assert (op not in {n.op_type for n in lowered.graph.node}) == gone, report.format()
    return lowered, report


def _native(model: onnx.ModelProto) -> runtimes.Session:
    return ORT.load_exact(model, threads=1, optimize="none")


def _bits_equal_ort(model: onnx.ModelProto, lowered: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    got = ORT.load(lowered, threads=1, optimize="basic").run(feeds)
    want = _native(model).run(feeds)
    assert [g.shape for g in got] == [w.shape for w in want]
    assert_outputs_bits_equal(got, want)
    return got


# --- a zero point broadcasts along its own axis --------------------------------------------------------------


@pytest.mark.parametrize("w_type", [U8, S8])
def test_conv_integer_with_input_weights_takes_the_per_channel_zero_point_along_axis_0(w_type):
    rng = np.random.default_rng(9)
    info = np.iinfo(NP[w_type])
    # M = 5 output channels against a kernel 3 wide: a zero point laid along the last axis cannot even broadcast
    # unless M equals kw, so kw = M = 5 here, where the wrong axis runs and gives wrong sums.
    w_zp = np.array([info.min, info.max, 0, 3, info.max // 2], NP[w_type])
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], pads=[1, 2, 1, 2])
    model = _model(node, {"x": (U8, [1, 2, 6, 7]), "w": (w_type, [5, 2, 3, 5])}, (TensorProto.INT32, [1, 5, 6, 7]),
                   {"x_zp": np.array(17, np.uint8), "w_zp": w_zp})
    lowered, _ = _lowered(model)
    session = ORT.load(lowered, threads=1, optimize="basic")
    for _ in range(3):
        x = rng.integers(0, 256, (1, 2, 6, 7)).astype(np.uint8)
        w = rng.integers(info.min, int(info.max) + 1, (5, 2, 3, 5)).astype(NP[w_type])
        expected = reference.conv_integer(x, w, np.array(17, np.uint8), w_zp, pads=(1, 2, 1, 2))
        # ORT's kernel refuses a per-channel w_zp; onnx.reference and the int64 reference agree.
        (oracle,) = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x, "w": w})
        assert_outputs_bits_equal([oracle], [expected])
        assert_outputs_bits_equal(session.run({"x": x, "w": w}), [expected])


def test_matmul_integer_with_input_weights_takes_the_per_column_zero_point_along_the_last_axis():
    rng = np.random.default_rng(10)
    b_zp = np.array([-128, 127, 0, 5], np.int8)
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"])
    model = _model(node, {"a": (U8, [4, 4]), "b": (S8, [4, 4])}, (TensorProto.INT32, [4, 4]),
                   {"a_zp": np.array(3, np.uint8), "b_zp": b_zp})
    lowered, _ = _lowered(model)
    feeds = {"a": rng.integers(0, 256, (4, 4)).astype(np.uint8), "b": rng.integers(-128, 128, (4, 4)).astype(np.int8)}
    got = _bits_equal_ort(model, lowered, feeds)
    assert_outputs_bits_equal(got, [reference.matmul_integer(feeds["a"], feeds["b"], np.array(3, np.uint8), b_zp)])


def test_a_zero_point_that_comes_at_run_time_with_several_values_is_left_alone():
    # Per row of A at run time: broadcast as it stands it would run along K.
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zp"], ["y"])
    model = _model(node, {"a": (U8, [3, 3]), "a_zp": (U8, [3])}, (TensorProto.INT32, [3, 2]),
                   {"b": np.ones((3, 2), np.uint8)})
    _, report = _lowered(model, gone=False)
    assert [n.reason for n in report.left_alone] == ["A's zero point comes at run time and may hold more than one "
                                                     "value"]


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
@pytest.mark.parametrize("op", ["QuantizeLinear", "DequantizeLinear"])
def test_per_axis_parameters_lie_along_their_axis(op, axis):
    rng = np.random.default_rng(11)
    shape = [3, 4, 5]
    size = shape[axis]
    scale = rng.uniform(0.01, 2, size).astype(np.float32)
    zp = rng.integers(-128, 128, size).astype(np.int8)
    if op == "QuantizeLinear":
        model = _model(helper.make_node(op, ["x", "s", "z"], ["y"], axis=axis), {"x": (F32, shape)}, (S8, shape),
                       {"s": scale, "z": zp})
        feeds = {"x": (rng.standard_normal(shape) * 100).astype(np.float32)}
        expected = reference.quantize_linear(feeds["x"], scale, zp, axis=axis)
    else:
        model = _model(helper.make_node(op, ["x", "s", "z"], ["y"], axis=axis), {"x": (S8, shape)}, (F32, shape),
                       {"s": scale, "z": zp})
        feeds = {"x": rng.integers(-128, 128, shape).astype(np.int8)}
        expected = reference.dequantize_linear(feeds["x"], scale, zp, axis=axis)
    lowered, _ = _lowered(model)
    assert_outputs_bits_equal(_bits_equal_ort(model, lowered, feeds), [expected])


def test_a_per_axis_axis_out_of_range_is_left_alone():
    model = _model(helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=3), {"x": (U8, [2, 3])}, (F32, [2, 3]),
                   {"s": np.ones(3, np.float32)})
    _, report = _lowered(model, gone=False)
    assert [n.reason for n in report.left_alone] == ["axis 3 is outside an input of rank 2"]


# --- DequantizeLinear exact on OpenVINO -----------------------------------------------------------


@pytest.mark.parametrize("q_type", [U8, S8, U16, S16])
@pytest.mark.parametrize("per_axis", [False, True])
def test_dequantize_linear_lowered_for_openvino_is_exact_there(q_type, per_axis):
    openvino = installed("openvino")
    rng = np.random.default_rng(12)
    info = np.iinfo(NP[q_type])
    if per_axis:
        scale = rng.uniform(1e-4, 1, 8).astype(np.float32)
        zp = rng.integers(info.min, int(info.max) + 1, 8).astype(NP[q_type])
        zp[0] = 0 if info.min else 1
    else:
        scale, zp = np.array(0.0123, np.float32), np.array(info.max // 3 or 7, NP[q_type])
    shape = [8, 512]
    model = _model(helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], axis=0), {"x": (q_type, shape)},
                   (F32, shape),
                   {"s": scale, "z": zp})
    lowered, report = _lowered(model, target="openvino")
    x = (np.resize(np.arange(info.min, int(info.max) + 1), shape) if info.bits == 8
         else rng.integers(info.min, int(info.max) + 1, shape))
    feeds = {"x": x.astype(NP[q_type])}
    want = _native(model).run(feeds)
    assert_outputs_bits_equal(openvino.load(lowered).run(feeds), want)
    assert_outputs_bits_equal(ORT.load(lowered, optimize="basic").run(feeds), want)
    assert_outputs_bits_equal(want, [reference.dequantize_linear(feeds["x"], scale, zp, axis=0)])
    assert "exact" in report.lowered[0].proof


# --- attributes lower does not compute as ORT does ---------------------------------------------------------


def test_quantize_linear_dividing_in_float16_is_left_alone():
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], precision=TensorProto.FLOAT16)
    model = _model(node, {"x": (F32, [64])}, (U8, [64]), {"s": np.array(0.037, np.float32), "z": np.array(3, np.uint8)},
                   opset=25)
    _, report = _lowered(model, gone=False)
    assert [n.reason for n in report.left_alone] == ["it divides in float16 (precision), which the lowering does not"]


def test_quantize_linear_with_the_default_precision_and_saturate_is_lowered_exactly():
    x = (np.arange(-2048, 2048, dtype=np.float32) * np.float32(0.0185)).astype(np.float32)
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], precision=F32, saturate=1)
    model = _model(node, {"x": (F32, [4096])}, (S8, [4096]),
                   {"s": np.array(0.037, np.float32), "z": np.array(3, np.int8)}, opset=25)
    lowered, _ = _lowered(model)
    _bits_equal_ort(model, lowered, {"x": x})


def test_dequantize_linear_to_float16_is_left_alone():
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], output_dtype=TensorProto.FLOAT16)
    model = _model(node, {"x": (U8, [4])}, (TensorProto.FLOAT16, [4]), {"s": np.array(0.5, np.float32)}, opset=25)
    _, report = _lowered(model, gone=False)
    assert [n.reason for n in report.left_alone] == ["its output is float16 (output_dtype); float32 is lowered"]


def test_an_attribute_lower_does_not_know_is_left_alone():
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], mystery=1)
    model = _model(node, {"x": (U8, [4])}, (F32, [4]), {"s": np.array(0.5, np.float32)})
    lowered, report = dql_pass.lower(model)
    assert [n.reason for n in report.left_alone] == ["its attribute mystery is not one lower knows"]


# --- no traceback, every lowered model checks --------------------------------------------------------------


@pytest.mark.parametrize("a_shape, b_shape, constant_b", [
    ([4], [4], True), ([3, 4], [4], True), ([2, 3, 4], [4], True), ([4], [4, 3], True),
    ([4], [4], False), ([3, 4], [4], False), ([3, 0], [0, 2], True), ([3, 0], [0, 2], False), ([0], [0], True),
])
def test_matmul_integer_of_1d_and_empty_operands_is_lowered_exactly(a_shape, b_shape, constant_b):
    rng = np.random.default_rng(13)
    b = rng.integers(-128, 128, b_shape).astype(np.int8)
    out = list(np.matmul(np.zeros(a_shape), np.zeros(b_shape)).shape)
    inputs = {"a": (U8, a_shape)} if constant_b else {"a": (U8, a_shape), "b": (S8, b_shape)}
    model = _model(helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"]), inputs,
                   (TensorProto.INT32, out),
                   {"a_zp": np.array(7, np.uint8), "b_zp": np.array(-3, np.int8), **({"b": b} if constant_b else {})})
    lowered, _ = _lowered(model)
    feeds = {"a": rng.integers(0, 256, a_shape).astype(np.uint8), "b": b}
    if a_shape[-1]:
        got = _bits_equal_ort(model, lowered, feeds)
    else:  # K = 0: ORT's kernel with zero points returns memory it never wrote (-1s, garbage); the sums are 0
        got = ORT.load(lowered, threads=1, optimize="basic").run(feeds)
    assert_outputs_bits_equal(got, [reference.matmul_integer(feeds["a"], b, np.array(7, np.uint8),
                                                             np.array(-3, np.int8))])


def test_matmul_integer_with_a_1d_b_past_the_bound_is_cut_exactly():
    # K = 600 terms of 255 * 255: 39 million, past 2^24, with a 1-D B (its reduction axis is its only one).
    b = np.full(600, -128, np.int8)
    b[::7] = 127
    model = _model(helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"]), {"a": (U8, [2, 600])},
                   (TensorProto.INT32, [2]), {"b": b, "a_zp": np.array(0, np.uint8), "b_zp": np.array(127, np.int8)})
    lowered, report = _lowered(model)
    assert "chunked" in report.lowered[0].proof
    a = np.full((2, 600), 255, np.uint8)
    a[1, ::3] = 0
    got = _bits_equal_ort(model, lowered, {"a": a})
    assert_outputs_bits_equal(got, [reference.matmul_integer(a, b, np.array(0, np.uint8), np.array(127, np.int8))])


# --- ranks kept; ORT's own unit-test cases ------------------------------------------------------------------

# After onnxruntime/test/providers/cpu/tensor/quantize_linear_test.cc: Scalar, Without_Zero_Point, per axis, blocked.
_ORT_CASES = {
    "DequantizeLinear_Scalar": ("DequantizeLinear", {}, (S8, []), np.array(-30, np.int8), np.array(2, np.float32),
                                np.array(-10, np.int8)),
    "DequantizeLinear_Without_Zero_Point": ("DequantizeLinear", {}, (S8, []), np.array(-30, np.int8),
                                            np.array(2, np.float32), None),
    "DequantizeLinear_1D_Without_Zero_Point": ("DequantizeLinear", {}, (U8, [4]), np.array([0, 3, 128, 255], np.uint8),
                                               np.array([2], np.float32), None),
    "DequantizeLinear_Per_Axis": ("DequantizeLinear", {"axis": 1}, (U8, [2, 3, 2]), np.arange(12, dtype=np.uint8) * 20,
                                  np.array([1, 2, 4], np.float32), np.array([0, 64, 255], np.uint8)),
    "DequantizeLinear_Per_Axis_Negative": ("DequantizeLinear", {"axis": -2}, (S8, [2, 3, 2]),
                                           np.arange(-6, 6, dtype=np.int8) * 10,
                                           np.array([1, 2, 4], np.float32), np.array([0, -10, 10], np.int8)),
    "QuantizeLinear_Scalar": ("QuantizeLinear", {}, (F32, []), np.array(3, np.float32), np.array(2, np.float32),
                              np.array(128, np.uint8)),
    "QuantizeLinear_Without_Zero_Point": ("QuantizeLinear", {}, (F32, []), np.array(3, np.float32),
                                          np.array(2, np.float32), None),
    "QuantizeLinear_1D_Scalar_Scale": ("QuantizeLinear", {}, (F32, [6]),
                                       np.array([0, 2, 3, 1000, -254, -1000], np.float32),
                                       np.array(2, np.float32), np.array(128, np.uint8)),
    "QuantizeLinear_Per_Axis": ("QuantizeLinear", {"axis": 0}, (F32, [3, 4]),
                                np.arange(-6, 6, dtype=np.float32).reshape(3, 4) * 7.5,
                                np.array([1, 2.5, 4], np.float32), np.array([0, -10, 10], np.int8)),
    "QuantizeLinear_Per_Axis_Last": ("QuantizeLinear", {"axis": -1}, (F32, [2, 3]),
                                     np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5,
                                     np.array([0.5, 1, 2], np.float32), np.array([1, 2, 3], np.int16)),
}


@pytest.mark.parametrize("name", sorted(_ORT_CASES))
def test_ort_unit_test_cases_are_lowered_with_their_ranks(name):
    op, attributes, (x_type, shape), x, scale, zp = _ORT_CASES[name]
    out_type = F32 if op == "DequantizeLinear" else (U8 if zp is None else helper.np_dtype_to_tensor_dtype(zp.dtype))
    constants = {"s": scale} | ({} if zp is None else {"z": zp})
    node = helper.make_node(op, ["x", "s"] + ([] if zp is None else ["z"]), ["y"], **attributes)
    model = _model(node, {"x": (x_type, shape)}, (out_type, shape), constants)
    lowered, _ = _lowered(model)
    got = _bits_equal_ort(model, lowered, {"x": x.reshape(shape)})
    axis = attributes.get("axis", 1)
    function = reference.quantize_linear if op == "QuantizeLinear" else reference.dequantize_linear
    assert_outputs_bits_equal(got, [function(x.reshape(shape), scale, zp, axis=axis)])


def test_ort_blocked_case_is_left_alone():
    # QuantizeLinear with block_size: ORT's blocked tests; lower leaves it alone and says so.
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=2)
    model = _model(node, {"x": (S8, [2, 4])}, (F32, [2, 4]), {"s": np.ones((2, 2), np.float32)})
    _, report = _lowered(model, gone=False)
    assert [n.reason for n in report.left_alone] == ["blocked quantization (block_size) is not lowered"]


# --- NaN and infinities as ORT quantizes them ---------------------------------------------------------------


@pytest.mark.parametrize("q_type, zero_point", [(S8, 0), (S8, 5), (S8, 127), (U8, 0), (U8, 200), (S16, 0), (S16, -7),
                                                (U16, 9)])
@pytest.mark.parametrize("size", [1, 17, 64])
def test_quantize_linear_gives_nan_and_infinities_what_ort_gives(q_type, zero_point, size):
    specials = np.array([np.nan, np.inf, -np.inf, -np.nan, 1.5, 0], np.float32)
    x = np.resize(specials, size).astype(np.float32)
    model = _model(helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"]), {"x": (F32, [size])}, (q_type, [size]),
                   {"s": np.array(0.5, np.float32), "z": np.array(zero_point, NP[q_type])})
    lowered, _ = _lowered(model)
    got = _bits_equal_ort(model, lowered, {"x": x})
    # Measured on ORT 1.32, x86: NaN quantizes to the type's minimum, whatever the zero point.
    assert (got[0][np.isnan(x)] == np.iinfo(NP[q_type]).min).all()
    assert_outputs_bits_equal(got, [reference.quantize_linear(x, np.array(0.5, np.float32),
                                                              np.array(zero_point, NP[q_type]))])
