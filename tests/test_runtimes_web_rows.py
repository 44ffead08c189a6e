"""RUNTIMES.md's rows for the web runtimes: where the nodes of each form run, counted from the
placement a runtime reports, and the placement log read so that every node is counted. No browser
is needed: the placements are given."""

from __future__ import annotations

import collections

from onnx import helper

from dql_pass.runtimes import web
from dql_pass.runtimes.web.cost import read_placement
from tools import models
from tools import runtimes as tool

_LOG = "2026-12-01 19:39:15.784499 [V:onnxruntime:, session_state.cc:1380 VerifyEachNodeIsAssignedToAnEp]  "


def test_every_node_on_one_provider_counts_them_when_the_optimizer_changed_their_number():
    """97 nodes in the graph, 95 after constant folding, all on WebGPU: the log names none, yet
    the provider's list holds 95 (it held one placeholder)."""
    log = [_LOG + "All nodes placed on [WebGpuExecutionProvider]. Number of nodes: 95"]
    nodes = [f"Add (n{i})" for i in range(97)]
    assert read_placement(log, nodes) == {"WebGpuExecutionProvider": ["?"] * 95}
    assert read_placement(log[:1], nodes[:95]) == {"WebGpuExecutionProvider": nodes[:95]}


class _Placing:
    """A runtime that reports a placement per model, or refuses the model."""

    name, variant = "webgpu", "portable"

    def __init__(self, placed) -> None:
        self._placed = placed

    def placement(self, model):
        if isinstance(self._placed, Exception):
            raise self._placed
        return self._placed


def test_a_placement_counts_nodes_per_provider_with_memcpy_apart_and_the_cpu_op_types():
    placed = tool.placement(_Placing({
        "CPUExecutionProvider": ["Round (r0)", "Round (r1)", "Sign (s)", "MemcpyToHost (m2)"],
        "WebGpuExecutionProvider": ["Div (d)", "MemcpyFromHost (m0)", "MemcpyToHost (m1)", "?", "?"],
    }), None)
    assert placed.providers == {"CPUExecutionProvider": 3, "WebGpuExecutionProvider": 3}
    assert placed.memcpy == 3 and placed.on_cpu == {"Round": 2, "Sign": 1} and placed.failure is None
    assert tool._on_cpu(placed) == "3 of 6: 2 Round, 1 Sign"
    refused = tool.placement(_Placing(tool.RuntimeFailure("no provider takes Cast\nat transformer_memcpy.cc")), None)
    assert refused.failure == "does not load: no provider takes Cast … at transformer_memcpy.cc"
    assert tool.placement(object(), None) is None  # a runtime that does not tell where nodes run


def _result(placements: dict) -> tool.RuntimeResult:
    result = tool.RuntimeResult("webgpu", "1.30.0", "", "portable")
    result.placements = {key: tool.placement(_Placing(placed), None) for key, placed in placements.items()}
    return result


def test_the_placement_table_has_a_row_per_form_and_opset_and_the_op_types_that_fall_back():
    gpu, cpu = "WebGpuExecutionProvider", "CPUExecutionProvider"
    result = _result({
        ("native", 21): {cpu: ["DynamicQuantizeLinear (dql)"]},
        ("residual", 21): {cpu: ["Round (a)", "Sign (b)"], gpu: ["Mul (c)", "MemcpyToHost (d)"]},
        ("portable", 21): {gpu: ["?"] * 95},
        ("float64", 13): RuntimeError("Can't create a session"),
    })
    lines = tool._placement_table(result, (21, 13))
    assert lines[2] == "| opset | form | nodes on WebGpuExecutionProvider | nodes on CPUExecutionProvider | " \
                       "Memcpy nodes added | op types on the CPU | refusal |"
    assert lines[4:] == [
        "| 21 | native | 0 | 1 | 0 | 1 DynamicQuantizeLinear |  |",
        "| 21 | residual | 1 | 2 | 1 | 1 Round, 1 Sign |  |",
        "| 21 | portable | 95 | 0 | 0 | none |  |",
        "| 21 | --target (portable) | 95 | 0 | 0 | none |  |",
        "| 13 | float64 | - | - | - | - | does not load: RuntimeError: Can't create a session |",
        "",
    ]


def test_on_a_cpu_only_runtime_nothing_falls_back():
    result = _result({("native", 21): {"CPUExecutionProvider": ["DynamicQuantizeLinear (dql)"]}})
    result.name, result.variant = "wasm", "quantizelinear"
    lines = tool._placement_table(result, (21,))
    assert lines[2] == "| opset | form | nodes on CPUExecutionProvider | Memcpy nodes added | refusal |"
    assert lines[4] == "| 21 | native | 1 | 0 |  |"
    assert tool._on_cpu(result.placements[("native", 21)]) == "all 1"
    assert tool._placement_table(tool.RuntimeResult("onnxruntime", "1.32.0", "", "quantizelinear"), (21,)) == []


def test_the_models_table_gets_a_column_of_nodes_on_the_cpu_only_where_a_runtime_placed_them():
    result = _result({("native", 21): {"CPUExecutionProvider": ["DynamicQuantizeLinear (dql)"]}})
    result.forms[("native", 21)] = tool.FormResult()
    placed = tool.Placement(providers=collections.Counter({"WebGpuExecutionProvider": 90, "CPUExecutionProvider": 36}),
                            on_cpu=collections.Counter({"MatMulInteger": 36}))
    result.models = [tool.ModelResult("quantized transformer", True, "yes", "24/24", "", placed)]
    text = "\n".join(tool._details(result, (21,)))
    assert "| model | loads and runs | DQL sites with ORT's bits | outputs with ORT's bits | nodes on the CPU | " \
           "what blocks |" in text
    assert "| quantized transformer | yes | 24/24 | yes | 36 of 126: 36 MatMulInteger |  |" in text
    result.models[0].placement = None
    result.placements = {}
    assert "nodes on the CPU" not in "\n".join(tool._details(result, (21,)))


def test_the_models_table_gets_the_gpu_calls_of_an_inference_where_a_runtime_counted_them():
    """From a runtime's cost: one column of dispatches, submits and readbacks per inference; none
    where nothing was submitted (wasm counts 0 of each: it makes no WebGPU call)."""
    cost = web.Cost(web.GpuCalls(0, 6, 0), web.GpuCalls(297, 26, 7),
                    {"CPUExecutionProvider": ["MatMulInteger (m)"],
                     "WebGpuExecutionProvider": ["Mul (a)", "MemcpyToHost (c)"]})
    assert cost.nodes == {"CPUExecutionProvider": 1, "WebGpuExecutionProvider": 1} and cost.copies == 1
    assert cost.as_dict()["inference"] == {"dispatches": 297, "submits": 26, "readbacks": 7}

    class Costing(_Placing):
        def cost(self, model, feeds):
            return cost

    placed = tool.placement(Costing(None), None, {"x": None})
    assert placed.inference == cost.inference and placed.providers == cost.nodes and placed.memcpy == 1
    result = _result({})
    result.forms[("native", 21)] = tool.FormResult()
    result.models = [tool.ModelResult("mlp", True, "yes", "3/3", "", placed)]
    text = "\n".join(tool._details(result, (21,)))
    assert "| mlp | yes | 3/3 | yes | 1 of 2: 1 MatMulInteger | 297 dispatches, 26 submits, 7 readbacks |  |" in text
    placed.inference = web.GpuCalls(0, 0, 0)
    assert "GPU calls per inference" not in "\n".join(tool._details(result, (21,)))


def test_the_models_the_tools_build_are_of_the_lowest_ir_version_their_opset_needs():
    """As exporters write them: onnx's default, its newest IR (14 for onnx 1.23), is one that
    onnxruntime-web 1.30 refuses, and the transformer of RUNTIMES.md did not load in the browser."""
    small = models.TransformerShape(layers=1, hidden=16, heads=2, intermediate=32, seq=4)
    for model in (models.minilm_model(small), models.chain_model(2), models.cnn_model(channels=2, side=4)):
        assert model.ir_version == helper.find_min_ir_version_for(list(model.opset_import)) <= 13
