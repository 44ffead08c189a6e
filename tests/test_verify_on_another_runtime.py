"""verify on another runtime: REWRITTEN's final outputs are held to ORIGINAL run there, or where
ORIGINAL there differs from ORT, to ORIGINAL on ORT (the contract's bits), and the report says
which side differs; a REWRITTEN that matches neither still fails."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers import installed
from onnx import TensorProto, helper, numpy_helper

import dql_pass


def _dequantize(zero_point: int = 255, scale: float = 0.0123) -> onnx.ModelProto:
    """DequantizeLinear with zero point 255: OpenVINO's own kernel folds it into an FMA, which
    rounds otherwise than ORT on some inputs."""
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.array(scale, np.float32), "s"),
         numpy_helper.from_array(np.array(zero_point, np.uint8), "zp")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_a_rewrite_with_orts_bits_passes_where_original_on_the_runtime_differs():
    installed("openvino")
    original = _dequantize()
    report = dql_pass.verify(original, dql_pass.lower(original, target="openvino")[0], runtime="openvino")
    assert report.verdict == "PASS", report.format()
    assert report.from_ort[0].identical
    assert any(note.startswith("final output 'y': ORIGINAL on openvino differs from ORT: ")
               and note.endswith("REWRITTEN on openvino is bit-identical to ORT") for note in report.notes), report.notes


def test_a_rewrite_that_matches_neither_original_on_the_runtime_nor_ort_fails():
    installed("openvino")
    wrong = dql_pass.lower(_dequantize(scale=0.0124), target="openvino")[0]  # another scale: other values
    report = dql_pass.verify(_dequantize(), wrong, runtime="openvino")
    assert report.verdict == "FAIL" and not report.outputs[0].identical, report.format()
    assert not any("bit-identical to ORT" in note for note in report.notes)
