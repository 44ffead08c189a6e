"""What the adapters share in dql_pass.runtimes.sessions: a model handed to a runtime as a file of
its own, read from any form that dql_pass reads."""

from __future__ import annotations

import warnings

import numpy as np
import onnx

from dql_pass.op import one_node_model
from dql_pass.runtimes.sessions import as_file, conform, output_types


def test_a_private_copy_of_an_onnxtxt_model_is_protobuf_and_warns_nothing(tmp_path):
    model = one_node_model(["n"], 21)
    text = tmp_path / "m.onnxtxt"
    onnx.save(model, text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with as_file(text) as path:
            copy = onnx.load(path)
    assert path != text and path.suffix == ".onnx"
    assert [str(w.message) for w in caught if "onnxtxt" in str(w.message)] == []
    assert [(n.op_type, list(n.input), list(n.output)) for n in copy.graph.node] == [
        (n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    assert [v.name for v in copy.graph.output] == [v.name for v in model.graph.output]


def test_an_output_the_model_does_not_type_is_taken_as_the_runtime_gives_it():
    """A REWRITTEN without value_info has site outputs of no declared type: verify on webgpu read that
    as a KeyError (a traceback)."""
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])], [onnx.ValueInfoProto(name="y")]))
    assert output_types(model) == [None]
    array = np.arange(2, dtype=np.float32)
    assert conform(array, None) is array
