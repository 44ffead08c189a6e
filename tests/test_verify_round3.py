"""Issue 16, verify and run-tests: no verdict passes what it did not check, none fails what only the
runtime cannot do (items 7, 8, 16, 17b, 20b)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dql_pass import suites


# -- item 7: a known difference excuses the runtime, not a model no holder can run -------------------


def _evil(folder) -> None:
    """The folder's model with an unused node of an unknown domain, IR 99 and opset 30: ORT and
    onnx.reference cannot load it."""
    model = onnx.load(folder / "model.onnx")
    model.graph.node.append(helper.make_node("Nope", [model.graph.input[0].name], ["unused"], domain="com.evil"))
    model.opset_import.append(helper.make_opsetid("com.evil", 1))
    model.ir_version = 99
    model.opset_import[0].version = 30
    onnx.save(model, folder / "model.onnx")


@pytest.mark.parametrize("runtime, policy, opset", [
    ("tract", "onnxruntime", 13),  # tract lacks QuantizeLinear with a computed scale: a known difference
    ("onnxruntime", "onnx-reference", 28),  # ORT lacks QuantizeLinear-28: held to onnx.reference instead
])
def test_a_known_difference_does_not_excuse_a_model_that_cannot_run_as_onnx_defines_it(tmp_path, runtime, policy, opset):
    path = tmp_path / "dql"
    suites.generate_suite(path, opsets=(opset,), forms=("quantizelinear",), names=("spec_example",), zero_range=policy)
    [entry] = json.loads((path / suites.MANIFEST).read_text())["cases"]
    assert runtime in entry["known_differences"]
    [before] = suites.run_suite(path, runtime).outcomes
    assert before.status == "XFAIL"  # the listed difference, on a model as generated
    _evil(path / entry["folder"])
    [outcome] = suites.run_suite(path, runtime).outcomes
    assert outcome.status == "FAIL"
    assert "cannot run it either" in outcome.detail and f"known difference on {runtime}" in outcome.detail
