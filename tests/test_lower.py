"""dql-pass lower: every quantization op of a quantize_dynamic model as float32 primitives, bit-exact.

The reference of each integer op is the exact int64 result (dql_pass.reference). ORIGINAL runs on
ORT through ``load_exact``: on x86 without VNNI ORT's u8s8 MatMulInteger adds pairs of products in
int16 and saturates them (ORT PR #12088), and there its int8 operands are shifted to uint8.
Models are compared on ORT with optimisation "basic", which runs every kernel as written: at "all",
ORT fuses float ops (LayerNormalization, GELU, MatMulIntegerToFloat) and changes the original's own
float bits.
"""

from __future__ import annotations

import json

import collections
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

import pytest
from helpers import MODELS, assert_outputs_bits_equal, digest, installed, sample
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import reference, runtimes
from dql_pass.cli import main
from dql_pass.lowering import LOWERED
from dql_pass.lowering.proof import LIMIT
from dql_pass.runtimes.base import Lack
from tools import models

ORT = runtimes.get("onnxruntime")
GONE = {*LOWERED, "DynamicQuantizeLinear"}
SAMPLES = sorted(p.stem for p in MODELS.glob("*.onnx"))
TINY = models.TransformerShape(layers=1, hidden=32, heads=2, intermediate=64, seq=8)
U8, S8 = TensorProto.UINT8, TensorProto.INT8
NP = {U8: np.uint8, S8: np.int8}


def _ops(model: onnx.ModelProto | ir.Model) -> collections.Counter:
    if isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    return collections.Counter(
        node.op_type for root in (model.graph, *model.functions.values())
        for node in ir.traversal.RecursiveGraphIterator(root)
    )


def _feeds(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, dict[str, np.ndarray]]:
    """Random, all-zero and extreme input sets: ±1000 drives every DQL output to 0 or 255, so
    the integer sums reach their ends."""
    sets: dict[str, dict[str, np.ndarray]] = collections.defaultdict(dict)
    for value in model.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tensor.shape.dim]
        for kind in ("random", "zero", "extreme", "negative"):
            if tensor.elem_type == TensorProto.FLOAT:
                array = {
                    "random": rng.standard_normal(shape), "zero": np.zeros(shape),
                    "extreme": np.where(rng.random(shape) < 0.5, -1e3, 1e3), "negative": np.full(shape, -1e3),
                }[kind].astype(np.float32)
            elif tensor.elem_type == TensorProto.BOOL:
                array = np.full(shape, kind != "zero")
            else:  # token ids and masks
                array = rng.integers(0, 2 if "mask" in value.name else 16, shape).astype(np.int64)
            sets[kind][value.name] = array
    return sets


def _assert_lowered_exact(original: onnx.ModelProto) -> dql_pass.LowerReport:
    lowered, report = dql_pass.lower(original)
    onnx.checker.check_model(lowered, full_check=True)
    assert not GONE & set(_ops(lowered)), _ops(lowered)
    before, after = (ORT.load_exact(original, threads=1, optimize="basic"),
                     ORT.load(lowered, threads=1, optimize="basic"))
    for feeds in _feeds(original, np.random.default_rng(0)).values():
        assert_outputs_bits_equal(after.run(feeds), before.run(feeds))
    return report


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_models_lowered_bit_exact(name):
    report = _assert_lowered_exact(sample(name))
    assert not report.left_alone


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> dict[str, onnx.ModelProto]:
    """A tiny quantize_dynamic transformer (MatMul and Gather quantized) and the CNN with int8 and
    uint8 weights, per tensor and per channel."""
    folder = tmp_path_factory.mktemp("quantized")
    built = {"transformer": models.quantize(models.minilm_model(TINY, vocab=16), folder, "t.onnx",
                                            ("MatMul", "Gather"))}
    for weight_type in ("QUInt8", "QInt8"):
        for per_channel in (False, True):
            name = f"cnn_{weight_type}_{'channel' if per_channel else 'tensor'}"
            built[name] = models.quantize(models.cnn_model(), folder, f"{name}.onnx", ("Conv", "MatMul"),
                                          weight_type=weight_type, per_channel=per_channel)
    return {name: onnx.load(path) for name, path in built.items()}


@pytest.mark.parametrize("name", ["transformer", "cnn_QUInt8_tensor", "cnn_QUInt8_channel", "cnn_QInt8_tensor",
                                  "cnn_QInt8_channel"])
def test_quantize_dynamic_models_lowered_bit_exact(quantized, name):
    model = quantized[name]
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= set(_ops(model))
    report = _assert_lowered_exact(model)
    assert not report.left_alone
    assert {n.op_type for n in report.lowered} == set(_ops(model)) & GONE


def _nested() -> onnx.ModelProto:
    """MatMulInteger in both branches of an If (reading a main-graph weight) and in a model-local
    function (its weight a Constant node), each after a DQL."""
    w = numpy_helper.from_array(np.arange(-40, 40, dtype=np.int8).reshape(8, 10), "w")

    def branch(name: str, zp: int) -> onnx.GraphProto:
        nodes = [helper.make_node("MatMulInteger", ["y", "w", "y_zp", f"{name}_wzp"], [f"{name}_acc"],
                                  name=f"{name}_mmi"),
                 helper.make_node("Cast", [f"{name}_acc"], [f"{name}_out"], to=TensorProto.FLOAT)]
        return helper.make_graph(nodes, name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [4, 10])],
                                 [numpy_helper.from_array(np.array(zp, np.int8), f"{name}_wzp")])

    body = [
        helper.make_node("Constant", [], ["fw"], value=numpy_helper.from_array(np.full((8, 3), -7, np.int8))),
        helper.make_node("DynamicQuantizeLinear", ["fx"], ["fy", "fs", "fz"]),
        helper.make_node("MatMulInteger", ["fy", "fw", "fz"], ["facc"], name="function_mmi"),
        helper.make_node("Cast", ["facc"], ["fout"], to=TensorProto.FLOAT),
    ]
    function = helper.make_function("local", "QMM", ["fx"], ["fout"], body, [helper.make_opsetid("", 13)])
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zp"], name="dql"),
        helper.make_node("If", ["cond"], ["branch_out"], then_branch=branch("then", 3),
                         else_branch=branch("else", -100)),
        helper.make_node("QMM", ["x"], ["function_out"], domain="local"),
    ]
    graph = helper.make_graph(
        nodes, "nested", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
                          helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("branch_out", [4, 10]),
                                                                             ("function_out", [4, 3]))], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("local", 1)],
                             functions=[function])


def test_subgraphs_and_functions_are_lowered_and_verified():
    original = _nested()
    onnx.checker.check_model(original, full_check=True)
    report = _assert_lowered_exact(original)
    assert sorted((n.graph, n.op_type) for n in report.lowered) == [
        ("function local::QMM", "DynamicQuantizeLinear"), ("function local::QMM", "MatMulInteger"),
        ("main", "DynamicQuantizeLinear"), ("main/If(branch_out).else_branch", "MatMulInteger"),
        ("main/If(branch_out).then_branch", "MatMulInteger"),
    ]
    lowered, _ = dql_pass.lower(original)
    assert "w" not in {t.name for t in lowered.graph.initializer}  # only the lowered nodes read it
    verdict = dql_pass.verify(original, lowered)
    assert verdict.verdict == "PASS", verdict.format()


def test_transformer_embedding_is_dequantized(quantized):
    assert "DequantizeLinear" in _ops(quantized["transformer"])


# --- each op against the int64 reference -----------------------------------------------------------------------------


def _extremes(dtype: np.dtype, shape, rng) -> list[np.ndarray]:
    info = np.iinfo(dtype)
    return [np.zeros(shape, dtype), np.full(shape, info.max, dtype), np.full(shape, info.min, dtype),
            rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)]


def _one_node(
    node: onnx.NodeProto, inputs: dict[str, int], output_type: int, constants: dict[str, np.ndarray],
    shapes: dict[str, list] = {}
) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info(n, t, shapes.get(n)) for n, t in inputs.items()],
        [helper.make_tensor_value_info(node.output[0], output_type, None)],
        [numpy_helper.from_array(a, n) for n, a in constants.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _lowered_session(model: onnx.ModelProto, expected_gone: str) -> runtimes.Session:
    lowered, report = dql_pass.lower(model)
    assert [n.op_type for n in report.lowered] == [expected_gone], report.format()
    assert expected_gone not in _ops(lowered)
    return ORT.load(lowered, threads=1, optimize="basic")


MATMUL_TYPES = [(U8, U8), (U8, S8), (S8, S8)]


@pytest.mark.parametrize("a_type, b_type", MATMUL_TYPES)
@pytest.mark.parametrize("b_zero_point", ["absent", "tensor", "column"])
@pytest.mark.parametrize("constant_b", [True, False])
def test_matmul_integer_equals_int64_reference(a_type, b_type, b_zero_point, constant_b):
    rng = np.random.default_rng(1)
    a_info, b_info = np.iinfo(NP[a_type]), np.iinfo(NP[b_type])
    b = rng.integers(b_info.min, int(b_info.max) + 1, (37, 5)).astype(NP[b_type])
    b_zp = {"absent": None, "tensor": np.array(b_info.max, NP[b_type]), "column": b[0].copy()}[b_zero_point]
    inputs = {"a": a_type, "a_zp": a_type}
    constants = {} if b_zp is None else {"b_zp": b_zp}
    if constant_b:
        constants["b"] = b
    else:
        inputs["b"] = b_type
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zp"] + ([] if b_zp is None else ["b_zp"]), ["y"])
    model = _one_node(node, inputs, TensorProto.INT32, constants, {"b": [37, 5]})
    lowered = _lowered_session(model, "MatMulInteger")
    native = ORT.load_exact(model, threads=1, optimize="none")
    for a in _extremes(NP[a_type], (3, 37), rng):
        for a_zp in (a_info.min, a_info.max, a.flat[0]):
            feeds = {"a": a, "a_zp": np.array(a_zp, NP[a_type]), "b": b}
            expected = reference.matmul_integer(a, b, feeds["a_zp"], b_zp)
            assert_outputs_bits_equal(lowered.run(feeds), [expected])
            assert_outputs_bits_equal(native.run(feeds), [expected])


@pytest.mark.parametrize("w_type", [U8, S8])
@pytest.mark.parametrize("w_zero_point", ["tensor", "channel"])
@pytest.mark.parametrize("attributes", [
    dict(pads=[1, 1, 1, 1]), dict(pads=[0, 1, 2, 0], strides=[2, 1], dilations=[1, 2]),
    dict(pads=[1, 1, 1, 1], group=2),
    dict(auto_pad="SAME_UPPER", strides=[2, 2]),
])
def test_conv_integer_equals_int64_reference(w_type, w_zero_point, attributes):
    rng = np.random.default_rng(2)
    info = np.iinfo(NP[w_type])
    group = attributes.get("group", 1)
    w = rng.integers(info.min, int(info.max) + 1, (6, 4 // group, 3, 3)).astype(NP[w_type])
    w_zp = w[:1, 0, 0, 0].copy() if w_zero_point == "tensor" else w[:, 0, 0, 0].copy()
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], kernel_shape=[3, 3], **attributes)
    model = _one_node(node, {"x": U8, "x_zp": U8}, TensorProto.INT32, {"w": w, "w_zp": w_zp})
    lowered = _lowered_session(model, "ConvInteger")
    # ORT refuses a per-channel w_zp ("Non per-tensor quantization is not supported"): the reference alone decides.
    native = ORT.load_exact(model, threads=1, optimize="none") if w_zero_point == "tensor" else None
    pads = attributes.get("pads")
    if attributes.get("auto_pad") == "SAME_UPPER":
        # 9x8 input, stride 2, kernel 3: 5x4 outputs need 2 rows and 1 column, the odd one at the end
        pads = [1, 0, 1, 1]
    for x in _extremes(np.uint8, (2, 4, 9, 8), rng):
        for x_zp in (0, 255, 131):
            feeds = {"x": x, "x_zp": np.array(x_zp, np.uint8)}
            expected = reference.conv_integer(x, w, feeds["x_zp"], w_zp, pads=pads, strides=attributes.get("strides"),
                                              dilations=attributes.get("dilations"), group=group)
            assert_outputs_bits_equal(lowered.run(feeds), [expected])
            if native is not None:
                assert_outputs_bits_equal(native.run(feeds), [expected])


@pytest.mark.parametrize("q_type", [U8, S8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_and_dequantize_linear_equal_reference(q_type, per_axis):
    rng = np.random.default_rng(3)
    info = np.iinfo(NP[q_type])
    scale = np.array([0.5, 0.7, 1.3, 1e-3], np.float32) if per_axis else np.array(0.05, np.float32)
    zp = np.array([info.min, 0, 3, info.max], NP[q_type]) if per_axis else np.array(info.max // 2, NP[q_type])
    constants = {"scale": scale, "zp": zp}
    shapes = {"x": [3, 4, 8], "q": [3, 4, 8]}
    quantize = _one_node(helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["y"], axis=1),
                         {"x": TensorProto.FLOAT}, q_type,
                         constants, shapes)
    dequantize = _one_node(helper.make_node("DequantizeLinear", ["q", "scale", "zp"], ["y"], axis=1), {"q": q_type},
                           TensorProto.FLOAT,
                           constants, shapes)
    # Ties of x / scale, huge and infinite values, and random ones.
    x = np.concatenate([np.arange(-2.5, 2.5, 0.25), [1e30, -1e30, np.inf, -np.inf],
                        rng.standard_normal(4) * 200]).astype(np.float32)
    x = np.resize(x, (3, 4, 8)).astype(np.float32)
    lowered = _lowered_session(quantize, "QuantizeLinear")
    assert_outputs_bits_equal(lowered.run({"x": x}), [reference.quantize_linear(x, scale, zp, axis=1)])
    assert_outputs_bits_equal(ORT.load(quantize, optimize="none").run({"x": x}), lowered.run({"x": x}))
    lowered = _lowered_session(dequantize, "DequantizeLinear")
    for q in _extremes(NP[q_type], (3, 4, 8), rng):
        assert_outputs_bits_equal(lowered.run({"q": q}), [reference.dequantize_linear(q, scale, zp, axis=1)])
        assert_outputs_bits_equal(ORT.load(dequantize, optimize="none").run({"q": q}), lowered.run({"q": q}))


def test_quantize_linear_for_a_float64_target_divides_in_float64(monkeypatch):
    # A runtime whose exact DQL variant is float64 divides through the reciprocal: QuantizeLinear
    # then divides in float64 too, and still equals the reference on ties and specials.
    monkeypatch.setattr(runtimes.get("reference"), "variant", "float64")
    scale = np.array([0.1, 0.3, 7.0], np.float32)
    model = _one_node(helper.make_node("QuantizeLinear", ["x", "scale", "zp"], ["y"], axis=-1),
                      {"x": TensorProto.FLOAT}, U8,
                      {"scale": scale, "zp": np.array([0, 128, 255], np.uint8)})
    lowered, report = dql_pass.lower(model, target="reference")
    assert "DOUBLE" in {TensorProto.DataType.Name(n.attribute[0].i) for n in lowered.graph.node if n.op_type == "Cast"}
    x = (np.arange(-600, 600, dtype=np.float32)[:, None] * scale / 2).astype(np.float32)
    x[:3] = [[np.inf, -np.inf, 1e-40]] * 3
    got = ORT.load(lowered, optimize="basic").run({"x": x})
    assert_outputs_bits_equal(got, [reference.quantize_linear(x, scale, np.array([0, 128, 255], np.uint8), axis=-1)])


def test_quantize_linear_is_left_alone_for_a_target_without_an_exact_division(monkeypatch):
    monkeypatch.setattr(runtimes.get("reference"), "variant", "residual")
    model = _one_node(helper.make_node("QuantizeLinear", ["x", "scale"], ["y"]), {"x": TensorProto.FLOAT}, U8,
                      {"scale": np.array(0.1, np.float32)})
    _, report = dql_pass.lower(model, target="reference")
    assert [n.reason for n in report.left_alone] == ["the target's exact variant residual does not divide in float32 "
                                                     "or float64"]


# --- the proof -------------------------------------------------------------------------------------------------------


def _beyond_bound() -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """MatMulInteger whose int8 weights sit at -128 against zero point 127: 255 * 255 per term, and
    K = 600 terms, so the bound is 39 million, past 2^24."""
    rng = np.random.default_rng(4)
    b = np.full((600, 3), -128, np.int8)
    b[rng.random(b.shape) < 0.1] = 127  # some terms are 0, so the partial sums are not all multiples of 65025
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"])
    model = _one_node(node, {"a": U8, "a_zp": U8}, TensorProto.INT32, {"b": b, "b_zp": np.array(127, np.int8)})
    a = rng.integers(200, 256, (4, 600)).astype(np.uint8)
    return model, a, b


def test_chunked_form_is_exact_where_one_float32_matmul_is_not():
    model, a, b = _beyond_bound()
    lowered, report = dql_pass.lower(model)
    (item,) = report.lowered
    assert item.proof.startswith("chunked into 3 float32 parts"), item.proof
    assert _ops(lowered)["MatMul"] == 3 and _ops(lowered)["Slice"] == 3
    feeds = {"a": a, "a_zp": np.array(0, np.uint8)}
    expected = reference.matmul_integer(a, b, feeds["a_zp"], np.array(127, np.int8))
    assert np.abs(expected).max() > LIMIT
    assert_outputs_bits_equal(ORT.load(lowered, threads=1, optimize="basic").run(feeds), [expected])
    # The same product as one float32 MatMul, as a lowering without the proof would write it.
    single = helper.make_graph(
        [helper.make_node("Cast", ["a"], ["af"], to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["af", "bf"], ["yf"]),
         helper.make_node("Cast", ["yf"], ["y"], to=TensorProto.INT32)],
        "single", [helper.make_tensor_value_info("a", U8, None)],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array((b.astype(np.float32) - 127), "bf")],
    )
    got = ORT.load(helper.make_model(single, opset_imports=[helper.make_opsetid("", 13)]), threads=1).run({"a": a})[0]
    assert not np.array_equal(got, expected)


def test_bound_at_the_limit_is_one_matmul():
    # 258 terms of 255 * 255 sum to 16,776,450 <= 2^24; one more term is past it.
    for depth, parts in ((258, 1), (259, 2)):
        b = np.full((depth, 2), -128, np.int8)
        node = helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"])
        model = _one_node(node, {"a": U8, "a_zp": U8}, TensorProto.INT32, {"b": b, "b_zp": np.array(127, np.int8)})
        lowered, report = dql_pass.lower(model)
        assert _ops(lowered)["MatMul"] == parts, report.format()
        a = np.full((1, depth), 255, np.uint8)
        feeds = {"a": a, "a_zp": np.array(0, np.uint8)}
        assert_outputs_bits_equal(ORT.load(lowered, optimize="basic").run(feeds),
                                  [reference.matmul_integer(a, b, 0, np.int8(127))])


def test_activation_by_activation_uses_the_types_worst_case():
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"])
    graph = helper.make_graph(
        [node], "aa", [helper.make_tensor_value_info(n, U8, s) for n, s in (("a", [2, 300]), ("b", [300, 4]),
                                                                            ("a_zp", []), ("b_zp", []))],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    lowered, report = dql_pass.lower(model)
    (item,) = report.lowered
    assert item.proof.startswith("chunked into 2") and "worst case of uint8 weights" in item.proof, item.proof
    rng = np.random.default_rng(5)
    feeds = {"a": np.full((2, 300), 255, np.uint8), "b": rng.integers(0, 256, (300, 4)).astype(np.uint8),
             "a_zp": np.array(0, np.uint8), "b_zp": np.array(255, np.uint8)}
    expected = reference.matmul_integer(*feeds.values())
    assert_outputs_bits_equal(ORT.load(lowered, optimize="basic").run(feeds), [expected])


# --- the report, left alone, untouched -------------------------------------------------------------------------------


def test_what_cannot_be_lowered_is_left_alone_with_the_reason():
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale"], ["q"], name="dynamic_scale"),
        helper.make_node("MatMulInteger", ["q", "b", "row_zp"], ["y"], name="per_row"),
    ]
    graph = helper.make_graph(
        nodes, "alone",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("x", [2, 3]), ("scale", []))],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(np.ones((3, 2), np.uint8), "b"),
         numpy_helper.from_array(np.array([1, 2], np.uint8), "row_zp")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    result = dql_pass.LowerQuantizationPass()(ir.serde.deserialize_model(model))
    assert not result.modified and not result.report.lowered
    assert {(n.node, n.reason) for n in result.report.left_alone} == {
        ("dynamic_scale", "its scale is not a float32 constant"),
        ("per_row", "A has more than one zero point (per row)")}


def test_grouped_convolution_past_the_bound_is_left_alone():
    w = np.full((4, 300, 1, 1), -128, np.int8)
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp", "w_zp"], ["y"], name="grouped", group=2)
    model = _one_node(node, {"x": U8, "x_zp": U8}, TensorProto.INT32, {"w": w, "w_zp": np.array(127, np.int8)})
    _, report = dql_pass.lower(model)
    assert [n.reason for n in report.left_alone] == ["the bound 19,507,500 exceeds 2^24 and a grouped convolution "
                                                     "(group 2) is not cut"]


def test_report_names_each_proof_and_what_the_target_lacks(monkeypatch):
    monkeypatch.setattr(runtimes.get("reference"), "lacks", (Lack("reference", "Relu", 6, "test", "no Relu here"),))
    _, report = dql_pass.lower(sample("mlp_dynamic"), target="reference")
    proofs = {n.node: n.proof for n in report.lowered}
    assert proofs["MatMul1_quant"] == "single float32 (bound 555,645 <= 2^24, constant weights)"
    assert proofs["input_QuantizeLinear"] == f"expanded, variant {runtimes.get('reference').variant}"
    assert [(lack.op_type, lack.since_version) for lack in report.lacking] == [("Relu", 6)]
    assert "still blocks reference: Relu-6 does not run on reference (test): no Relu here" in report.format()
    assert report.to_dict()["lacking"] == ["Relu-6 does not run on reference (test): no Relu here"]


def test_weights_only_the_lowered_nodes_read_are_dropped():
    lowered, _ = dql_pass.lower(sample("mlp_dynamic"))
    names = {t.name for t in lowered.graph.initializer}
    assert not any(name.endswith("_quantized") or name.endswith("W_zero_point") for name in names), names


def test_lowering_is_idempotent_and_a_model_without_quantization_is_untouched(tmp_path):
    once, _ = dql_pass.lower(sample("conv_dynamic"))
    source = tmp_path / "once.onnx"
    onnx.save(once, source)
    result = dql_pass.lower_file(source, tmp_path / "twice.onnx")
    assert not result.modified and not result.report.lowered
    assert digest(tmp_path / "twice.onnx") == digest(source)


def _names(model: onnx.ModelProto) -> collections.Counter:
    model = ir.serde.deserialize_model(model)
    return collections.Counter(v.name for root in (model.graph, *model.functions.values())
                               for node in ir.traversal.RecursiveGraphIterator(root) for v in node.outputs)


def test_lowered_names_are_unique_and_outputs_keep_theirs():
    original = sample("control_flow")
    lowered, _ = dql_pass.lower(original)
    before, after = _names(original), _names(lowered)
    # Functions may reuse their callers' names; no new name does, and no name gains a second value.
    assert not [name for name, count in after.items() if count > max(before[name], 1)]
    assert [o.name for o in lowered.graph.output] == [o.name for o in original.graph.output]


# --- verify -----------------------------------------------------------------------------------------------------------


def test_verify_passes_a_lowered_model_and_checks_each_lowered_op():
    original = onnx.load(MODELS / "conv_dynamic.onnx")
    lowered, _ = dql_pass.lower(original)
    report = dql_pass.verify(original, lowered)
    assert report.verdict == "PASS", report.format()
    rows = {site.name: site for site in report.sites}
    assert {"ConvInteger 'Conv1_quant'", "ConvInteger 'Conv2_quant'", "MatMulInteger 'MatMul_quant'"} <= set(rows)
    assert all(rows[name].cases >= 12 for name in rows if "Integer" in name)


def test_verify_fails_a_wrong_lowering():
    original = onnx.load(MODELS / "conv_dynamic.onnx")
    lowered, _ = dql_pass.lower(original)
    # One shifted weight of the first convolution off by one: a lowering that got one term wrong.
    weight = next(t for t in lowered.graph.initializer if t.name.startswith("dql_pass_Conv1_quant/weight"))
    array = numpy_helper.to_array(weight).copy()
    array.flat[0] += 1
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    report = dql_pass.verify(original, lowered)
    assert report.verdict == "FAIL"
    (row,) = [site for site in report.sites if site.name == "ConvInteger 'Conv1_quant'"]
    assert row.mismatches and "output differs" in row.detail, report.format()


# --- command line -----------------------------------------------------------------------------------------------------


def test_cli_lower(tmp_path, capsys):
    out = tmp_path / "lowered.onnx"
    assert main(["lower", "-v", str(MODELS / "conv_dynamic.onnx"), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("lowered 6 nodes (2 ConvInteger, 1 MatMulInteger, 3 DynamicQuantizeLinear) into")
    assert "ConvInteger 'Conv1_quant' in main: single float32 (bound 325,635 <= 2^24, constant weights)" in printed
    assert not GONE & set(_ops(onnx.load(out)))


def test_cli_lower_prints_a_summary_and_the_proofs_only_under_v(tmp_path, capsys):
    source, out, report = MODELS / "conv_dynamic.onnx", tmp_path / "lowered.onnx", tmp_path / "report.json"
    assert main(["lower", str(source), "-o", str(out), "--json", str(report)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "'Conv1_quant'" not in "\n".join(lines)  # no line per node
    assert lines[1:4] == ["     2 ConvInteger: single float32", "     1 MatMulInteger: single float32",
                          "     3 DynamicQuantizeLinear: expanded, variant arithmetic"]
    nodes = lambda path: len(onnx.load(path).graph.node)  # noqa: E731 (one graph, no function)
    size = (nodes(source), nodes(out), source.stat().st_size, out.stat().st_size)
    assert lines[4] == "  nodes {:,} -> {:,}; size {:,} -> {:,} bytes ({:.1f}x)".format(*size, size[3] / size[2])
    assert lines[5].startswith("  weights float (the default without --target): 8-bit weights stored cast and "
                               "shifted as float32, four times their size")
    held = json.loads(report.read_text())
    assert (held["nodes_before"], held["nodes_after"], held["bytes_before"], held["bytes_after"]) == size


@pytest.mark.parametrize("argv, message", [
    (["lower", "missing.onnx", "-o", "out.onnx"], "missing.onnx: no such file"),
    (["lower", str(MODELS / "mlp_dynamic.onnx"), "-o", "out.onnx", "--target", "nowhere"],
     "unknown runtime 'nowhere'; choose from onnxruntime"),
])
def test_cli_lower_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not Path("out.onnx").exists()


# --- other runtimes ---------------------------------------------------------------------------------------------------

# Bit equality with ORT needs every Conv and MatMul quantized: the float ops left are elementwise or
# reshapes, which every runtime computes alike. The transformer keeps float MatMul, Softmax, Erf and
# LayerNormalization, whose order of summation is each runtime's own: `python -m tools.check_lowered`
# shows it on every runtime, outside the suite.
OTHER_RUNTIMES = ["onnx2torch", "onnx2pytorch", "tract"]


@pytest.mark.parametrize("name", OTHER_RUNTIMES)
@pytest.mark.parametrize("model_name", ["mlp_dynamic", "cnn_QUInt8_tensor", "cnn_QInt8_channel"])
def test_lowered_models_run_bit_exact_on_other_runtimes(quantized, name, model_name):
    runtime = installed(name)
    original = sample(model_name) if model_name in SAMPLES else quantized[model_name]
    lowered, report = dql_pass.lower(original, target=name)
    assert not report.lacking, report.lacking
    before, after = (ORT.load_exact(original, threads=1, optimize="basic"),
                     runtime.load(lowered, threads=1, optimize="basic"))
    for feeds in _feeds(original, np.random.default_rng(0)).values():
        assert_outputs_bits_equal(after.run(feeds), before.run(feeds))


def test_a_lowered_value_that_keeps_the_name_but_is_not_read_is_not_what_gets_checked():
    """A decoy: the correct lowered MatMul stays under the old name, unread, while the
    Cast that reads it in ORIGINAL reads a copy plus 1. The site checks what the Cast reads."""
    original = sample("mlp_dynamic")
    lowered, _ = dql_pass.lower(original)
    model = ir.from_proto(lowered)
    matmul = next(n for n in original.graph.node if n.op_type == "MatMulInteger").output[0]
    value = next(v for n in model.graph for v in n.outputs if v.name == matmul)
    [reader] = [use.node for use in value.uses()]
    one = ir.node("Constant", [], attributes={"value": ir.tensor(np.array(1, np.int32))})
    decoy = ir.node("Add", [value, one.outputs[0]])
    model.graph.insert_before(reader, [one, decoy])
    reader.replace_input_with(0, decoy.outputs[0])
    report = dql_pass.verify(original, ir.to_proto(model), samples=0)
    assert report.verdict == "FAIL"
    assert any(s.mismatches for s in report.sites if s.name.startswith("MatMulInteger")), report.format()


@pytest.mark.parametrize("suffix", [".json", ".textproto", ".onnxtxt"])
def test_a_model_written_in_a_text_form_is_read_back_by_every_command(tmp_path, suffix):
    """lower -o w.json writes onnx's JSON form (the form follows the extension, as onnx.save does):
    every command reads it back, lower, fuse and verify, as it reads a binary model."""
    source = MODELS / "mlp_dynamic.onnx"
    written = tmp_path / f"w{suffix}"
    dql_pass.lower_file(source, written)
    assert not written.read_bytes().startswith(b"\x08")  # the text form, not protobuf's bytes
    again = dql_pass.lower_file(written, tmp_path / "again.onnx")
    assert again.report.lowered == [] and again.report.left_alone == []  # nothing left to lower
    dql_pass.fuse_file(written, tmp_path / "fused.onnx")
    assert dql_pass.verify(source, written, samples=1).passed
    assert main(["-q", "verify", str(source), str(written), "--samples", "1"]) == 0


def test_reading_an_onnxtxt_model_warns_nothing(tmp_path, capsys):
    """onnx warns that onnxtxt is experimental on every read; dql_pass checks the file and says nothing of it."""
    written = tmp_path / "w.onnxtxt"
    dql_pass.lower_file(MODELS / "mlp_dynamic.onnx", written)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dql_pass.fuse_file(written, tmp_path / "fused.onnx")
    assert [str(w.message) for w in caught if "onnxtxt" in str(w.message)] == []


def test_a_broken_text_form_is_one_clear_line(tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text('{"ir_version": "8", "graph": {')
    assert main(["lower", str(broken), "-o", str(tmp_path / "out.onnx")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "not a valid ONNX model in the json form" in error, error
