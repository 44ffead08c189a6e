"""The graph inputs (dql_pass.verification.interface): a REWRITTEN that drops an input a caller feeds, takes it
as another type, or no longer reads it, FAILs; where the sets hold it fixed (an overridable initializer at its
stored value; masks were ones), the model level alone gave a PASS."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dql_pass


def _masked(mask_type: int = TensorProto.FLOAT, ir_version: int = 8) -> onnx.ModelProto:
    """out = dequantized DQL(x * mask) + b, b an initializer listed among the inputs."""
    nodes = [
        helper.make_node("Mul", ["x", "mask"], ["xm"], name="mask") if mask_type == TensorProto.FLOAT else
        helper.make_node("Mul", ["x", "mask_float"], ["xm"], name="mask"),
        helper.make_node("DynamicQuantizeLinear", ["xm"], ["y", "scale", "zp"], name="dql"),
        helper.make_node("DequantizeLinear", ["y", "scale", "zp"], ["dequantized"], name="dequantize"),
        helper.make_node("Add", ["dequantized", "b"], ["out"], name="add"),
    ]
    if mask_type != TensorProto.FLOAT:
        nodes.insert(0, helper.make_node("Cast", ["mask"], ["mask_float"], to=TensorProto.FLOAT, name="cast"))
    graph = helper.make_graph(
        nodes, "masked",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("mask", mask_type, ["batch", 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.array([0.5, -1, 2, 0], np.float32), "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=ir_version)


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(node for node in model.graph.node if node.name == name)


def _without_input(model: onnx.ModelProto, name: str) -> None:
    kept = [value for value in model.graph.input if value.name != name]
    del model.graph.input[:]
    model.graph.input.extend(kept)


def _differences(original: onnx.ModelProto, rewritten: onnx.ModelProto) -> list[str]:
    report = dql_pass.verify(original, rewritten)
    assert report.verdict == ("FAIL" if report.input_differences else "PASS"), report.format()
    return report.input_differences


def test_a_rewrite_that_stops_applying_the_mask_and_drops_it_fails():
    original = _masked()
    rewritten = dql_pass.expand(original)[0]
    mask = _node(rewritten, "mask")
    mask.op_type, mask.input[:] = "Identity", ["x"]
    _without_input(rewritten, "mask")
    assert _differences(original, rewritten) == ["'mask': REWRITTEN does not take it"]


def test_an_input_taken_but_no_longer_read_fails():
    original = _masked()
    rewritten = dql_pass.expand(original)[0]
    _node(rewritten, "mask").input[1] = "x"  # x * x: the mask still declared
    assert _differences(original, rewritten) == ["'mask': ORIGINAL reads it, REWRITTEN takes it but does not read it"]


def test_an_overridable_initializer_replaced_by_a_copy_fails():
    """Its stored value is all the sets ever give it: the copy reads the same, a caller's b is ignored."""
    original = _masked()
    rewritten = dql_pass.expand(original)[0]
    rewritten.graph.initializer.append(numpy_helper.from_array(np.array([0.5, -1, 2, 0], np.float32), "b_copy"))
    _node(rewritten, "add").input[1] = "b_copy"
    assert _differences(original, rewritten) == [
        "'b' (an initializer a caller may override): ORIGINAL reads it, REWRITTEN takes it but does not read it"]
    _without_input(rewritten, "b")  # and its initializer gone: nothing a caller feeds, nothing kept of it
    rewritten.graph.initializer.remove(next(t for t in rewritten.graph.initializer if t.name == "b"))
    assert _differences(original, rewritten) == [
        "'b' (an initializer a caller may override): REWRITTEN does not take it"]


def test_an_overridable_initializer_moved_out_of_the_inputs_is_the_same_model():
    """What ORT's warning asks for (onnxruntime/tools/python/remove_initializer_from_input.py)."""
    original = _masked()
    rewritten = dql_pass.expand(original)[0]
    _without_input(rewritten, "b")
    assert _differences(original, rewritten) == []


@pytest.mark.parametrize("change, expected", [
    (lambda value: setattr(value.type.tensor_type, "elem_type", TensorProto.INT32),
     "'mask': of type INT64 in ORIGINAL and INT32 in REWRITTEN"),
    (lambda value: value.type.tensor_type.shape.dim[1].__setattr__("dim_value", 8),
     "'mask': of shape [batch, 4] in ORIGINAL and [batch, 8] in REWRITTEN"),
])
def test_an_input_taken_as_another_type_or_size_fails(change, expected):
    original = _masked(TensorProto.INT64)
    rewritten = dql_pass.expand(original)[0]
    change(next(value for value in rewritten.graph.input if value.name == "mask"))
    report = dql_pass.verify(original, rewritten)
    assert report.verdict == "FAIL" and report.input_differences == [expected], report.format()


def test_the_rewrites_of_dql_pass_take_the_inputs_as_they_were():
    original = _masked(TensorProto.INT64)
    assert _differences(original, dql_pass.expand(original)[0]) == []
    assert _differences(original, dql_pass.lower(original)[0]) == []


def test_before_ir_version_4_initializers_listed_as_inputs_are_not_fed():
    """There every initializer is listed among the inputs, and no runtime lets a caller feed one: a copy of b
    read in its place (a FAIL from IR version 4 on) is the same model."""
    original = _masked(ir_version=3)
    rewritten = dql_pass.expand(original)[0]
    rewritten.graph.initializer.append(numpy_helper.from_array(np.array([0.5, -1, 2, 0], np.float32), "b_copy"))
    _node(rewritten, "add").input[1] = "b_copy"
    assert _differences(original, rewritten) == []
