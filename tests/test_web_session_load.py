"""The web adapter's load does only what a run needs: the graph walk the placement log is read
against (functions inlined) is done for placement() alone."""

from __future__ import annotations

import onnx.inliner
import pytest
from onnx import TensorProto, helper

from dql_pass.runtimes import web
from dql_pass.runtimes.web import session as web_session


def _add() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"], name="twice")], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.skipif(not web.unpacked(), reason=f"onnxruntime-web is not unpacked: run `{web.SETUP}`")
def test_a_session_for_runs_does_not_inline_the_graph(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the graph was inlined for a session that only runs")

    monkeypatch.setattr(onnx.inliner, "inline_local_functions", refuse)
    monkeypatch.setattr(web_session.WebSession, "_start", lambda self: None)  # no browser: only the load's own work
    session = web.Wasm()._load(_add(), threads=0, optimize="all")
    try:
        assert session.input_names == ["x"] and session.output_names == ["y"]
    finally:
        session.close()
