"""ORT's integer products as ONNX defines them where its kernels saturate on this CPU
(dql_pass.runtimes.unsaturated and OnnxRuntime.load_exact), and verify's model level built on them."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import assert_outputs_bits_equal
from onnx import TensorProto, helper, numpy_helper

from dql_pass import reference, runtimes
from dql_pass.cli import main
from dql_pass.runtimes.unsaturated import saturating_nodes, unsaturated

ORT = runtimes.get("onnxruntime")
U8, S8 = TensorProto.UINT8, TensorProto.INT8
NP = {U8: np.uint8, S8: np.int8}
# Every integer product with an int8 operand, as if each saturated: the shifted form must be exact anywhere.
EVERY = frozenset((op, a, b) for op in ("MatMulInteger", "ConvInteger")
                  for a, b in itertools.product((U8, S8), repeat=2) if S8 in (a, b))


def _product(op: str, a_type: int, b_type: int, points: str, constant_b: bool) -> onnx.ModelProto:
    shapes = {"MatMulInteger": ([3, 64], [64, 4]), "ConvInteger": ([1, 8, 5, 5], [4, 8, 3, 3])}[op]
    b = np.full(shapes[1], np.iinfo(NP[b_type]).max, NP[b_type])
    b.flat[::3] = np.iinfo(NP[b_type]).min
    names = ["a", "b"]
    initializers = [numpy_helper.from_array(b, "b")] if constant_b else []
    if points != "absent":
        names += ["a_zp", "b_zp"]
        initializers += [numpy_helper.from_array(np.array(np.iinfo(NP[a_type]).min + 3, NP[a_type]), "a_zp"),
                         numpy_helper.from_array(np.array(7, NP[b_type]), "b_zp")]
    inputs = [helper.make_tensor_value_info("a", a_type, shapes[0])]
    if not constant_b:
        inputs.append(helper.make_tensor_value_info("b", b_type, shapes[1]))
    graph = helper.make_graph([helper.make_node(op, names, ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("op, a_type, b_type", sorted(EVERY))
@pytest.mark.parametrize("points", ["absent", "present"])
@pytest.mark.parametrize("constant_b", [True, False])
def test_an_unsaturated_product_gives_the_exact_result_on_ort(op, a_type, b_type, points, constant_b):
    model = _product(op, a_type, b_type, points, constant_b)
    shifted = unsaturated(ir.from_proto(model), EVERY)
    assert saturating_nodes(shifted, EVERY) == [] and len(saturating_nodes(ir.from_proto(model), EVERY)) == 1
    rng = np.random.default_rng(5)
    info = np.iinfo(NP[a_type])
    a_shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    extreme, drawn = np.full(a_shape, info.max, NP[a_type]), rng.integers(info.min, int(info.max) + 1, a_shape)
    for a in (extreme, drawn.astype(NP[a_type])):
        feeds = {"a": a}
        b = next((numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "b"), None)
        if b is None:
            b_info = np.iinfo(NP[b_type])
            b_shape = [d.dim_value for d in model.graph.input[1].type.tensor_type.shape.dim]
            b = rng.integers(b_info.min, int(b_info.max) + 1, b_shape).astype(NP[b_type])
            feeds["b"] = b
        zps = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("_zp")}
        a_zp, b_zp = zps.get("a_zp", np.array(0, NP[a_type])), zps.get("b_zp")
        expected = (reference.matmul_integer(a, b, a_zp, b_zp) if op == "MatMulInteger"
                    else reference.conv_integer(a, b, a_zp, b_zp))
        assert_outputs_bits_equal(ORT.load(shifted, optimize="none").run(feeds), [expected])


def test_the_saturating_products_are_those_whose_kernel_is_not_exact_here():
    found = ORT.saturating_products()
    for op, a_type, b_type in sorted(EVERY):
        model = _product(op, a_type, b_type, "absent", False)
        shapes = [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input]
        a, b = (np.full(s, np.iinfo(NP[t]).max, NP[t]) for s, t in zip(shapes, (a_type, b_type)))
        expected = (reference.matmul_integer(a, b, np.array(0, NP[a_type]), None) if op == "MatMulInteger"
                    else reference.conv_integer(a, b, np.array(0, NP[a_type]), None))
        exact = bool((ORT.load(model, optimize="none").run({"a": a, "b": b})[0] == expected).all())
        assert ((op, a_type, b_type) in found) == (not exact), (op, a_type, b_type)


def _dql_then_int8_matmul() -> onnx.ModelProto:
    """A DQL feeding a MatMulInteger with int8 weights at ±127, whose pair sums pass int16."""
    w = np.where(np.arange(64 * 4).reshape(64, 4) % 5 == 0, -127, 127).astype(np.int8)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("MatMulInteger", ["q", "w", "z"], ["acc"], name="mm"),
             helper.make_node("Cast", ["acc"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("command", ["lower", "expand"])
def test_verify_passes_a_rewrite_of_a_model_whose_int8_product_saturates_on_ort(tmp_path, capsys, command):
    onnx.save(_dql_then_int8_matmul(), tmp_path / "m.onnx")
    assert main([command, str(tmp_path / "m.onnx"), "-o", str(tmp_path / "r.onnx"), "-q"]) == 0
    assert main(["verify", str(tmp_path / "m.onnx"), str(tmp_path / "r.onnx")]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out
    assert ("saturate on this CPU" in out) == (("MatMulInteger", U8, S8) in ORT.saturating_products())


def _untyped_int8_weight(where: str) -> onnx.ModelProto:
    """uint8 ``a`` times an int8 weight whose type the model does not state: the output of a
    Constant node, of a Transpose, or a function's input (the product inside the function)."""
    w = np.where(np.arange(64 * 4).reshape(64, 4) % 3 == 0, -128, 127).astype(np.int8)
    opset = [helper.make_opsetid("", 13)]
    a = helper.make_tensor_value_info("a", U8, [2, 64])
    out = helper.make_tensor_value_info("y", TensorProto.INT32, None)
    functions = []
    if where == "constant":
        nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")),
                 helper.make_node("MatMulInteger", ["a", "w"], ["y"])]
    elif where == "transpose":
        nodes = [helper.make_node("Constant", [], ["wt"], value=numpy_helper.from_array(w.T.copy(), "wt")),
                 helper.make_node("Transpose", ["wt"], ["w"], perm=[1, 0]),
                 helper.make_node("MatMulInteger", ["a", "w"], ["y"])]
    else:
        functions = [helper.make_function("local", "product", ["p", "q"], ["r"],
                                          [helper.make_node("MatMulInteger", ["p", "q"], ["r"])], opset)]
        nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")),
                 helper.make_node("product", ["a", "w"], ["y"], domain="local")]
    graph = helper.make_graph(nodes, "g", [a], [out])
    return helper.make_model(graph, opset_imports=[*opset, helper.make_opsetid("local", 1)], functions=functions)


@pytest.mark.parametrize("where", ["constant", "transpose", "function"])
def test_an_int8_operand_of_no_stated_type_is_shifted(where):
    model = ir.from_proto(_untyped_int8_weight(where))
    assert len(saturating_nodes(model, EVERY)) == 1
    a = np.full([2, 64], 255, np.uint8)
    a[1, ::2] = 3
    w = np.where(np.arange(64 * 4).reshape(64, 4) % 3 == 0, -128, 127).astype(np.int8)
    expected = reference.matmul_integer(a, w, np.array(0, np.uint8), None)
    assert_outputs_bits_equal(ORT.load(unsaturated(model, EVERY), optimize="none").run({"a": a}), [expected])


def test_verify_passes_a_lowering_whose_int8_weight_is_a_constant_node(tmp_path, capsys):
    model = _dql_then_int8_matmul()
    w = model.graph.initializer.pop()
    model.graph.node.insert(0, helper.make_node("Constant", [], ["w"], value=w))
    onnx.save(model, tmp_path / "m.onnx")
    assert main(["lower", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "r.onnx"), "-q"]) == 0
    assert main(["verify", str(tmp_path / "m.onnx"), str(tmp_path / "r.onnx")]) == 0
    assert "PASS" in capsys.readouterr().out
