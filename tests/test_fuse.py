"""Fusing decomposed DynamicQuantizeLinear back into one node: round trips, ONNX's body, near misses;
every expanded and fused model loads in ORT whenever its input does.

The fuse command is tested in test_cli.py.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

import numpy as np
import onnx
import onnx.backend.test.loader
import onnx.inliner
import onnx_ir as ir
import onnxscript
import pytest
from helpers import (
    assert_outputs_bits_equal, dql_model, dql_outputs, edit_graph, newest_ort_opset, onnx_body, onnx_node_tests,
    run_cli, sample, session, site_nodes, without_clip,
)
from onnxscript import rewriter

import dql_pass
from dql_pass import runtimes
from dql_pass.fusion import UnsupportedOnnxscript, _onnxscript_compat, fuse_rules
from dql_pass.fusion.rules import _BodyFusion, body_problems
from dql_pass.op import MAX_OPSET, MIN_OPSET

SAMPLES = ["mlp_dynamic", "conv_dynamic", "control_flow", "relu_dql", "opset21_dynamic"]
QUANTIZE_DYNAMIC = ["mlp_dynamic", "conv_dynamic", "opset21_dynamic"]


def dql_names(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Graph path -> the names of its DQL nodes."""
    sites = dql_pass.find_sites(ir.serde.deserialize_model(model))
    return {label: sorted(n.name for n in nodes) for label, nodes in sites.items()}


def all_nodes(model: onnx.ModelProto) -> list[str]:
    ir_model = ir.serde.deserialize_model(model)
    containers = [ir_model.graph, *ir_model.functions.values()]
    return [node.op_type for c in containers for node in ir.traversal.RecursiveGraphIterator(c)]


def _feeds(model: onnx.ModelProto, zeros: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tensor.shape.dim]
        if tensor.elem_type == onnx.TensorProto.BOOL:
            feeds[value.name] = np.array(not zeros).reshape(shape)
        else:
            feeds[value.name] = np.zeros(shape, np.float32) if zeros else rng.standard_normal(shape).astype(np.float32)
    return feeds


def assert_same_on_ort(actual: onnx.ModelProto, expected: onnx.ModelProto) -> None:
    """Every graph output bit-identical on random inputs and on all-zero inputs."""
    for zeros in (False, True):
        feeds = _feeds(expected, zeros)
        assert_outputs_bits_equal(session(actual, optimize=False).run(feeds),
                                  session(expected, optimize=False).run(feeds))


def fused(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dql_pass.FuseReport]:
    result, report = dql_pass.fuse(model)
    onnx.checker.check_model(result, full_check=True)
    return result, report


# --- Round trips: fuse(expand(m)) and fuse(onnx_body(m)) give m's DQL nodes back ---------------------------


@pytest.mark.parametrize("zero_range", dql_pass.ZERO_RANGE_POLICIES)
@pytest.mark.parametrize("mode", dql_pass.MODES)
@pytest.mark.parametrize("variant", dql_pass.VARIANTS)
@pytest.mark.parametrize("name", SAMPLES)
def test_fuse_undoes_expand(name, variant, mode, zero_range):
    original = sample(name)
    expanded = dql_pass.expand(original, variant=variant, mode=mode, zero_range=zero_range)[0]
    assert not dql_outputs(expanded)
    result, report = fused(expanded)
    assert dql_outputs(result) == dql_outputs(original)
    assert dql_names(result) == dql_names(original)  # named and unnamed alike
    assert report.total == sum(map(len, dql_outputs(original).values())) and not report.left_alone
    # Only the onnx-reference policy computed something else than ORT's node (1/255 on a zero range).
    assert [("1/255" in note) for note in report.notes.values()] == ([True] if zero_range == "onnx-reference" else [])
    # No trace of the decomposition is left: no dql_pass function, import or initializer.
    assert [f.name for f in result.functions] == [f.name for f in original.functions]
    assert [o.domain for o in result.opset_import] == [o.domain for o in original.opset_import]
    assert {t.name for t in result.graph.initializer} == {t.name for t in original.graph.initializer}
    assert sorted(all_nodes(result)) == sorted(all_nodes(original))
    assert_same_on_ort(result, original)
    if zero_range == "onnxruntime":
        session(result)  # and it loads with ORT's graph optimizations on


@pytest.mark.parametrize("name", SAMPLES)
def test_onnx_body_fuses_back_and_the_change_is_reported(name):
    original = sample(name)
    result, report = fused(onnx_body(original))
    assert dql_outputs(result) == dql_outputs(original)
    assert sorted(all_nodes(result)) == sorted(all_nodes(original))  # the Identity nodes are gone too
    assert set(report.notes) == {"onnx_function_body_11"}
    assert "0/0" in report.notes["onnx_function_body_11"] and "y_scale 1.0" in report.notes["onnx_function_body_11"]
    assert_same_on_ort(result, original)


def _at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """The same model importing another ai.onnx opset: its ops mean the same from 11 to the newest."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    model.ir_version = max(model.ir_version, onnx.helper.find_min_ir_version_for(list(model.opset_import), True))
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("opset", sorted({11, 13, 18, 21, newest_ort_opset(), MAX_OPSET}))
@pytest.mark.parametrize("name", QUANTIZE_DYNAMIC)
def test_onnx_body_fuses_back_at_every_opset(name, opset):
    original = _at_opset(sample(name), opset)
    result, _ = fused(onnx_body(original))
    assert dql_outputs(result) == dql_outputs(original)
    if opset <= newest_ort_opset():
        assert_same_on_ort(result, original)


def test_onnx_body_without_identity_and_with_initializers():
    """Exporters drop the Identity nodes or store the constants as initializers; both still fuse."""
    original = sample("mlp_dynamic")
    model = ir.serde.deserialize_model(onnx_body(original))
    ir.passes.common.IdentityEliminationPass()(model)
    ir.passes.common.LiftConstantsToInitializersPass(size_limit=0)(model)
    assert not [n for n in model.graph if n.op_type in ("Identity", "Constant")]
    result, _ = fused(ir.serde.serialize_model(model))
    assert sum(map(len, dql_outputs(result).values())) == 3
    assert not [n for n in result.graph.node if n.op_type in ("ReduceMin", "ReduceMax", "Div", "Round")]
    assert_same_on_ort(result, original)


# Bodies with more than eight commutative nodes fuse in dql_pass's order only (one rule per ordering).
COMMUTED_FORMS = [v for v in dql_pass.VARIANTS if v not in ("residual", "portable", "lean")]


def test_commuted_inputs_fuse():
    original = sample("mlp_dynamic")
    for form in (*COMMUTED_FORMS, "onnx"):
        decomposed = onnx_body(original) if form == "onnx" else dql_pass.expand(original, variant=form)[0]
        model = ir.serde.deserialize_model(decomposed)
        swapped = 0
        for node in model.graph:
            in_first_site = node.name.startswith("input_") or node.outputs[0].name.endswith("__1")
            if node.op_type in ("Min", "Max", "Equal", "Add") and in_first_site:
                a, b = node.inputs
                node.replace_input_with(0, b)
                node.replace_input_with(1, a)
                swapped += 1
        assert swapped >= 2
        result, _ = fused(ir.serde.serialize_model(model))
        assert dql_outputs(result) == dql_outputs(original)
        assert_same_on_ort(result, original)


def test_a_consumer_inside_the_block_keeps_the_graph_sorted():
    """A consumer of y_scale placed before the node that computes y still comes after the fused node."""
    original = sample("mlp_dynamic")

    def move_consumer(graph: ir.Graph) -> None:
        consumer = next(n for n in graph if n.name == "MatMul1_quant_scales_mul")
        graph.remove(consumer)
        graph.insert_before(site_nodes(graph)["QuantizeLinear'"], consumer)

    edited = edit_graph(dql_pass.expand(original)[0], move_consumer)
    onnx.checker.check_model(edited, full_check=True)
    result, _ = fused(edited)
    assert dql_outputs(result) == dql_outputs(original)
    assert_same_on_ort(result, original)


def test_rules_work_with_the_plain_rewriter():
    """fuse_rules() is an ordinary RewriteRuleSet for onnxscript.rewriter.rewrite."""
    original = sample("control_flow")
    for decomposed in (dql_pass.expand(original, variant="arithmetic")[0], onnx_body(original)):
        result = rewriter.rewrite(decomposed, pattern_rewrite_rules=fuse_rules())
        onnx.checker.check_model(result, full_check=True)
        # The rewriter names the unnamed If/Loop/Scan nodes, so graph paths differ: compare the outputs.
        assert sorted(sum(dql_outputs(result).values(), [])) == sorted(sum(dql_outputs(original).values(), []))
        assert_same_on_ort(result, original)


def test_onnx_conformance_expanded_models_fuse():
    """ONNX's own ``_expanded`` node tests, written by its test generator, fuse and pass their data on ORT."""
    for test in onnx_node_tests(expanded=True):
        result, report = fused(test.model)
        assert [n.op_type for n in result.graph.node] == ["DynamicQuantizeLinear"], test.name
        assert [o.name for o in result.graph.output] == ["y", "y_scale", "y_zero_point"]
        assert report.fused == {"main": {"onnx_function_body_11": 1}}
        for inputs, outputs in test.data_sets:
            assert_outputs_bits_equal(session(result, optimize=False).run({"x": inputs[0]}), outputs)


def test_input_proto_is_untouched_and_fusing_again_changes_nothing():
    expanded = dql_pass.expand(sample("control_flow"), mode="function")[0]
    before = expanded.SerializeToString()
    once, report = fused(expanded)
    assert expanded.SerializeToString() == before
    assert report.dropped_functions == ["dql_pass::DynamicQuantizeLinear_quantizelinear_onnxruntime"]
    twice, again = fused(once)
    assert again.total == 0 and not again.left_alone and not again.dropped_functions
    assert twice.graph.node == once.graph.node and twice.functions == once.functions


def _set_attribute(op_type: str, name: str, value: int) -> Callable[[ir.Graph], None]:
    def edit(graph: ir.Graph) -> None:
        node = next(n for n in site_nodes(graph).values() if n.op_type == op_type)
        node.attributes[name] = ir.AttrInt64(name, value)

    return edit


@pytest.mark.parametrize(
    ("op_type", "name", "value", "fuses"),
    [
        ("ReduceMin", "noop_with_empty_axes", 0, True),
        ("ReduceMin", "noop_with_empty_axes", 1, False),  # no axes then means no reduction at all
        ("QuantizeLinear", "output_dtype", onnx.TensorProto.UINT8, True),
        ("QuantizeLinear", "axis", 0, True),  # the scale is a scalar
        ("ReduceMax", "keepdims", 1, False),  # y_scale would not be a scalar
    ],
)
def test_attributes_beyond_the_body(op_type, name, value, fuses):
    original = sample("opset21_dynamic")  # noop_with_empty_axes exists from opset 18
    edited = edit_graph(dql_pass.expand(original, variant="quantizelinear")[0], _set_attribute(op_type, name, value))
    _, report = dql_pass.fuse(edited)  # not checked: with noop_with_empty_axes=1 shapes no longer fit
    assert report.total == (3 if fuses else 2)
    assert bool(report.left_alone) != fuses
    if not fuses:
        assert name in report.left_alone[0].reason, report.left_alone[0]


def test_an_overridable_constant_is_not_a_constant():
    """An initializer that is also a graph input can change at run time: no site that reads it fuses."""
    model = ir.serde.deserialize_model(dql_pass.expand(sample("mlp_dynamic"))[0])
    model.graph.inputs.append(model.graph.initializers["dql_pass_q_max"])
    edited = ir.serde.serialize_model(model)
    result, report = fused(edited)
    assert report.total == 0 and len(report.left_alone) == 3
    assert all("'dql_pass_q_max' is a graph input" in item.reason for item in report.left_alone)


def test_an_ai_onnx_import_fuses_into_a_valid_model():
    # The opset spelled "ai.onnx": the rewriter's new node imports "", which must not read as opset 1.
    model = dql_model(13)
    model.opset_import[0].domain = "ai.onnx"
    fused, report = dql_pass.fuse(dql_pass.expand(model)[0])
    assert report.total == 1 and [n.op_type for n in fused.graph.node] == ["DynamicQuantizeLinear"]
    assert [(o.domain, o.version) for o in fused.opset_import] == [("", 13)]
    onnx.checker.check_model(fused, full_check=True)
    x = np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32)
    assert_outputs_bits_equal(session(fused).run({"x": x}), session(dql_model(13)).run({"x": x}))


def test_a_model_without_decomposition_is_left_as_it_was():
    original = sample("conv_dynamic")
    result, report = fused(original)
    assert report.total == 0 and not report.left_alone and not report.notes
    assert result.graph.node == original.graph.node and result.graph.initializer == original.graph.initializer


# --- ORT's DynamicQuantizeMatMul fusion comes back ---------------------------------------------------------


def _optimized_op_types(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in runtimes.get("onnxruntime").optimized(model).graph.node]


@pytest.mark.parametrize(("name", "count"), [("mlp_dynamic", 3), ("conv_dynamic", 1), ("opset21_dynamic", 3)])
def test_ort_fuses_dynamic_quantize_matmul_again(name, count):
    original = sample(name)
    before = _optimized_op_types(original).count("DynamicQuantizeMatMul")
    assert before == count
    assert _optimized_op_types(dql_pass.expand(original)[0]).count("DynamicQuantizeMatMul") == 0
    for decomposed in (dql_pass.expand(original, variant="arithmetic", mode="function")[0], onnx_body(original)):
        assert _optimized_op_types(fused(decomposed)[0]).count("DynamicQuantizeMatMul") == before


# --- Near misses are left alone, and the report says why ----------------------------------------------------


def _insert(graph: ir.Graph, before: ir.Node, node: ir.Node) -> ir.Value:
    graph.insert_before(before, node)
    return node.outputs[0]


def _reciprocal_for_y(graph: ir.Graph) -> None:
    """y = Round(x * (1 / scale)) instead of Round(x / scale) (arithmetic variant)."""
    div = site_nodes(graph)["Div''"]
    x, scale = div.inputs
    recip = _insert(graph, div, ir.node("Reciprocal", [scale]))
    mul = ir.node("Mul", [x, recip])
    graph.insert_before(div, mul)
    div.outputs[0].replace_all_uses_with(mul.outputs[0])
    graph.remove(div, safe=True)


def _scale_by_multiplication(graph: ir.Graph) -> None:
    """scale = range * (1/255) instead of range / 255 (quantizelinear variant)."""
    div = site_nodes(graph)["Div"]
    reciprocal = graph.initializers["dql_pass_q_max"].const_value.numpy() ** -1
    factor = ir.Value(name="one_255th", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([]),
                      const_value=ir.tensor(np.float32(reciprocal)))
    graph.register_initializer(factor)
    mul = ir.node("Mul", [div.inputs[0], factor])
    graph.insert_before(div, mul)
    div.outputs[0].replace_all_uses_with(mul.outputs[0])
    graph.remove(div, safe=True)


def _wrong_constant(graph: ir.Graph) -> None:
    """The Where that saturates the zero point uses 254 instead of 255."""
    where = site_nodes(graph)["Where'"]
    wrong = ir.Value(name="q_254", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([]),
                     const_value=ir.tensor(np.float32(254)))
    graph.register_initializer(wrong)
    where.replace_input_with(2, wrong)


def _without_zero_point_saturation(graph: ir.Graph) -> None:
    """The zero point is rounded without Where(Less(zp, 255), zp, 255) (arithmetic variant)."""
    nodes = site_nodes(graph)
    where = nodes["Where'"]
    where.outputs[0].replace_all_uses_with(where.inputs[1])
    graph.remove([where, nodes["Less"]], safe=True)


def _zero_point_before_rounding(graph: ir.Graph) -> None:
    """y = Round(x / scale + zp) instead of Round(x / scale) + zp (arithmetic variant)."""
    nodes = site_nodes(graph)
    round_q, add = nodes["Round'"], nodes["Add"]
    add.replace_input_with(0, round_q.inputs[0])
    round_late = ir.node("Round", [add.outputs[0]])
    graph.insert_after(add, round_late)
    add.outputs[0].replace_all_uses_with(round_late.outputs[0])
    round_late.replace_input_with(0, add.outputs[0])
    graph.remove(round_q, safe=True)


def _other_x_for_y(graph: ir.Graph) -> None:
    """y quantizes -x while the reductions read x (quantizelinear variant)."""
    quantize = site_nodes(graph)["QuantizeLinear'"]
    quantize.replace_input_with(0, _insert(graph, quantize, ir.node("Neg", [quantize.inputs[0]])))


def _onnx_body_nodes(graph: ir.Graph) -> dict[str, ir.Node]:
    """The first inlined ONNX body (site ``__1``), by the body's own value names."""
    return {n.outputs[0].name.removesuffix("__1"): n for n in graph if n.outputs[0].name.endswith("__1")}


def _onnx_reciprocal(graph: ir.Graph) -> None:
    """Min_Scaled = X_Min_Adjusted * (1 / Scale) instead of X_Min_Adjusted / Scale."""
    div = _onnx_body_nodes(graph)["Min_Scaled"]
    div.op_type = "Mul"
    div.replace_input_with(1, _insert(graph, div, ir.node("Reciprocal", [div.inputs[1]])))


def _onnx_without_clip(graph: ir.Graph) -> None:
    """The zero point is rounded without Clip to [0, 255]."""
    clip = _onnx_body_nodes(graph)["Clipped_ZeroPoint_FP"]
    clip.outputs[0].replace_all_uses_with(clip.inputs[0])
    graph.remove(clip, safe=True)


def _onnx_wrong_constant(graph: ir.Graph) -> None:
    """Q_Max is 254 (a Constant node, as the inliner writes it)."""
    constant = _onnx_body_nodes(graph)["Q_Max"]
    constant.attributes["value"] = ir.AttrTensor("value", ir.tensor(np.float32(254)))


def _intermediate_used_outside(graph: ir.Graph) -> None:
    """The range is also a graph output: it must stay computed."""
    value = site_nodes(graph)["Sub"].outputs[0]
    value.type, value.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([])
    graph.outputs.append(value)


# case: (how the first DQL of mlp_dynamic is decomposed, the edit, what the reason must say)
NEAR_MISSES = {
    "reciprocal": ("arithmetic", _reciprocal_for_y, "expected Div, got Mul. (at Mul"),
    "mul by 1/255": ("quantizelinear", _scale_by_multiplication, "expected Div, got Mul. (at Mul"),
    "constant 254": ("quantizelinear", _wrong_constant, "'q_254' is float32 254.0, expected float32 255.0"),
    "no clip": ("arithmetic", without_clip, "expected Clip, got Add. (at Add 'input_QuantizeLinear/Add')"),
    "no zero point saturation": ("arithmetic", _without_zero_point_saturation, "expected Where, got Sub"),
    "zero point before rounding": ("arithmetic", _zero_point_before_rounding, "expected Add, got Round"),
    "other x": ("quantizelinear", _other_x_for_y, "x bound to two different values"),
    "intermediate used outside": ("quantizelinear", _intermediate_used_outside, "used outside"),
    "onnx body: reciprocal": ("onnx", _onnx_reciprocal, "got Mul. (at the Mul computing 'Min_Scaled__1')"),
    "onnx body: no clip": ("onnx", _onnx_without_clip, "expected Clip, got Sub"),
    "onnx body: constant 254": ("onnx", _onnx_wrong_constant, "Div input 1 (Q_Max): 'Q_Max__1' is float32 254.0"),
}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_misses_are_left_alone_with_a_reason(case):
    form, edit, reason = NEAR_MISSES[case]
    original = sample("mlp_dynamic")
    edited = edit_graph(onnx_body(original) if form == "onnx" else dql_pass.expand(original, variant=form)[0], edit)
    onnx.checker.check_model(edited, full_check=True)
    result, report = fused(edited)
    # The two other sites fuse; the edited one stays as it was.
    assert sorted(dql_outputs(result)["main"]) == [
        ("relu1_quantized", "relu1_scale", "relu1_zero_point"),
        ("relu2_quantized", "relu2_scale", "relu2_zero_point"),
    ]
    assert [(item.graph, item.x) for item in report.left_alone] == [("main", "input")]
    assert reason in report.left_alone[0].reason, report.left_alone[0]
    assert_same_on_ort(result, edited)


def test_a_local_function_that_is_not_dql_is_not_fused():
    """A call to dql_pass's function name is fused only if the function's body computes DQL."""
    original = sample("mlp_dynamic")
    expanded = ir.serde.deserialize_model(dql_pass.expand(original, variant="arithmetic", mode="function")[0])
    (function,) = expanded.functions.values()
    _without_clip_in(function)
    edited = ir.serde.serialize_model(expanded)
    result, report = fused(edited)
    assert dql_outputs(result) == {}
    assert len(result.functions) == 1
    assert [(item.graph, item.x) for item in report.left_alone] == [(f"function dql_pass::{function.name}", "x")]
    assert_same_on_ort(result, edited)


def _without_clip_in(function: ir.Function) -> None:
    (clip,) = [n for n in function if n.op_type == "Clip"]
    clip.outputs[0].replace_all_uses_with(clip.inputs[0])
    function.remove(clip, safe=True)


# --- The onnxscript seam: the version check, and the invariant the matcher relies on ------------------------


@pytest.mark.parametrize(
    ("version", "supported"),
    [("0.7.0", True), ("0.7.2", True), ("0.6.2", False), ("0.8.0", False), ("0.8.0.dev20260101", False),
     ("0.70.1", False), ("1.0", False), ("unknown", False)],
)
def test_the_onnxscript_version_check(version, supported):
    if supported:
        _onnxscript_compat.check_version(version)
        return
    with pytest.raises(UnsupportedOnnxscript) as raised:
        _onnxscript_compat.check_version(version)
    message = str(raised.value)
    assert isinstance(raised.value, ImportError)
    assert message.count("\n") == 0 and message.count(". ") == 0, message  # one sentence
    assert f"onnxscript 0.7.x, and onnxscript {version} is installed" in message


def test_importing_the_fusion_with_an_unsupported_onnxscript_says_so(monkeypatch):
    """The check runs when dql_pass.fusion is imported, before any of the rewriter's internals are used."""
    monkeypatch.setattr(onnxscript, "__version__", "0.8.0")
    for name in [m for m in sys.modules if m == "dql_pass.fusion" or m.startswith("dql_pass.fusion.")]:
        monkeypatch.delitem(sys.modules, name)
    refused = r"^dql_pass's fusion works with onnxscript 0\.7\.x, and onnxscript 0\.8\.0 is installed"
    with pytest.raises(ImportError, match=refused):
        importlib.import_module("dql_pass.fusion")


def _bodies() -> dict[str, onnx.FunctionProto]:
    """Every body a rule fuses, at every opset: dql_pass's variants and policies, and ONNX's own."""
    schema = onnx.defs.get_schema("DynamicQuantizeLinear")
    bodies = {
        f"onnx-{v}": onnx.FunctionProto.FromString(schema.get_function_with_opset_version(v))
        for v in schema.function_opset_versions
    }
    for opset in range(MIN_OPSET, MAX_OPSET + 1):
        for variant in dql_pass.VARIANTS:
            for zero_range in dql_pass.ZERO_RANGE_POLICIES:
                bodies[f"{variant}-{zero_range}-{opset}"] = dql_pass.function_proto(variant, opset, zero_range)
    return bodies


def test_every_body_keeps_the_matchers_invariant():
    bodies = _bodies()
    assert len(bodies) == 1 + len(dql_pass.VARIANTS) * len(dql_pass.ZERO_RANGE_POLICIES) * (MAX_OPSET - MIN_OPSET + 1)
    assert {name: body_problems(body) for name, body in bodies.items() if body_problems(body)} == {}


def _reversed(body: onnx.FunctionProto) -> None:
    body.node.reverse()


def _zero_point_from_x(body: onnx.FunctionProto) -> None:
    """y_zero_point computed from x by a node of its own, away from y's nodes."""
    (cast,) = [n for n in body.node if n.output == ["y_zero_point"]]
    cast.input[0] = "x"


def _third_reduction(body: onnx.FunctionProto) -> None:
    body.node.append(onnx.helper.make_node("ReduceMin", ["x"], ["unused_min"], keepdims=0))


def _constant_as_float(body: onnx.FunctionProto) -> None:
    constant = next(n for n in body.node if n.op_type == "Constant")
    constant.ClearField("attribute")
    constant.attribute.append(onnx.helper.make_attribute("value_float", 255.0))


@pytest.mark.parametrize(
    ("break_body", "problem"),
    [
        (_reversed, "before they are computed"),
        (_zero_point_from_x, "y_zero_point is computed away from y's nodes"),
        (_third_reduction, "exactly one ReduceMin and one ReduceMax"),
        (_constant_as_float, "does not hold its tensor in 'value'"),
    ],
)
def test_a_body_that_breaks_the_invariant_is_refused(break_body, problem):
    body = dql_pass.function_proto("arithmetic", MIN_OPSET)
    break_body(body)
    assert any(problem in p for p in body_problems(body)), body_problems(body)
    with pytest.raises(ValueError, match="breaks the matcher's invariant"):
        _BodyFusion("broken", body)


# Every output of a rewriting command loads in ORT whenever its input does.

def _clashing_names_model() -> onnx.ModelProto:
    """Node names that are the names expand and fuse derive for the DQL's nodes."""
    model = dql_model(13)
    model.graph.node[0].name = "q"
    taken = ["q/ReduceMin", "q/QuantizeLinear", "q/Cast", "q/Div", "q_1", "q_2", "DynamicQuantizeLinear"]
    for i, name in enumerate(taken):
        reads = "y_scale" if i == 0 else f"i{i - 1}"
        model.graph.node.append(onnx.helper.make_node("Identity", [reads], [f"i{i}"], name=name))
    model.graph.output.append(onnx.helper.make_tensor_value_info(f"i{len(taken) - 1}", onnx.TensorProto.FLOAT, []))
    return model


def test_names_that_clash_with_derived_ones_still_load_in_ort(tmp_path):
    source = tmp_path / "clash.onnx"
    model = _clashing_names_model()
    assert len({n.name for n in model.graph.node}) == len(model.graph.node)
    onnx.save(model, source)
    session(model)
    for variant in dql_pass.VARIANTS:
        expanded, fused = tmp_path / f"{variant}.onnx", tmp_path / f"{variant}_fused.onnx"
        assert run_cli("expand", source, "-o", expanded, "--variant", variant).returncode == 0
        session(onnx.load(expanded))
        assert run_cli("fuse", expanded, "-o", fused).returncode == 0
        session(onnx.load(fused))
