"""What verify's report says around its verdict: known differences grouped by reason, a final
output's distance from ORT put in context, and the ORT graph transformers that change a QDQ model's
own bits at ORT's default level."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from helpers import MODELS
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import runtimes
from dql_pass.verification.report import OutputResult
from dql_pass.verification.notes import from_ort_in_context


def test_known_differences_are_one_line_per_reason_with_counts():
    report = dql_pass.verify(MODELS / "mlp_dynamic.onnx", MODELS / "mlp_dynamic.onnx")
    sites = [dataclasses.replace(site, known={"flushes subnormals": 4, "clamps inf": index})
             for index, site in enumerate(report.sites)]
    lines = dataclasses.replace(report, runtime="somewhere", sites=sites).format().splitlines()
    known = [line for line in lines if line.startswith("known difference")]
    assert known == ["known difference of somewhere, 12 cases at 3 sites: flushes subnormals",
                     "known difference of somewhere, 3 cases at 3 sites: clamps inf"]


def test_the_distance_from_ort_is_put_in_context():
    runtime = runtimes.get("reference")
    far = OutputResult("y", False, 7, 0.25, 3.0, "7 of 10 elements differ; max abs 0.25, max rel 3")
    nearer = OutputResult("y", False, 2, 0.125, 1.0, "2 of 10 elements differ; max abs 0.125, max rel 1")
    same = OutputResult("y", True)
    assert from_ort_in_context(runtime, [far], [far]) == [
        "from ORT, 'y': ORIGINAL on reference is as far from ORT (7 of 10 elements differ; max abs 0.25, max rel 3): "
        "that is reference's own float rounding, not the rewrite"]
    assert from_ort_in_context(runtime, [far], [nearer]) == [
        "from ORT, 'y': ORIGINAL on reference against ORIGINAL on ORT: 2 of 10 elements differ; max abs 0.125, max "
        "rel 1; the rest is the rewrite's own difference on reference"]
    assert from_ort_in_context(runtime, [far], [same])[0].startswith("from ORT, 'y': ORIGINAL on reference against "
                                                                       "ORIGINAL on ORT: bit-identical;")
    assert from_ort_in_context(runtime, [same], [same]) == []


def _skip_layer_norm(hidden: int = 384) -> onnx.ModelProto:
    """x + x·DequantizeLinear(w), then LayerNormalization: ORT's SkipLayerNormFusion fuses the Add
    and the norm at its default level, and rounds otherwise."""
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array(rng.integers(0, 255, (hidden,), dtype=np.uint8), "wq"),
            numpy_helper.from_array(np.float32(0.01), "ws"), numpy_helper.from_array(np.uint8(128), "wz"),
            numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "gamma"),
            numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "beta")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], name="dq"),
             helper.make_node("Mul", ["x", "w"], ["h"], name="mul"),
             helper.make_node("Add", ["x", "h"], ["s"], name="skip"),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12, name="ln")]
    shape = ["batch", 16, hidden]
    graph = helper.make_graph(nodes, "skip_layer_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_the_qdq_note_names_the_ort_transformer_that_changes_the_bits():
    model = _skip_layer_norm()
    [note] = [n for n in dql_pass.verify(model, model).notes if "QuantizeLinear/DequantizeLinear" in n]
    assert "through the graph transformers SkipLayerNormFusion (" in note, note
    assert "QDQ groups" not in note  # no QDQ group is fused here: the float ops are
