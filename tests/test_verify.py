"""dql_pass.verification and ``dql-pass verify``: accepts correct rewrites, rejects the known wrong ones.

The broken rewrites are built here from dql_pass's own arithmetic expansion, each with one defect
that real runtimes shipped: a reciprocal instead of a division, the zero point added before
rounding, ONNX's unguarded function body, a renamed output.
"""

from __future__ import annotations

import sys


import numpy as np
import onnx
import onnx.inliner
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import decomposition, runtimes, variants
from dql_pass.inputs import cases, describe, large_cases
from dql_pass.graph.walk import graph_scopes
from dql_pass.compare import bit_difference, same_bits
from dql_pass import verify  # through dql_pass first, so that dql_pass.verification names the function
from dql_pass.verification import SiteResult
from dql_pass.verification.synthesis import input_sets

from helpers import (
    MODELS, constant_node, dangling_dql_rewrite, dql_model, embedding_model, onnx_body, quotients, reciprocal_rewrite,
    round_half_up, site_pairs,
    session, value_map,
)

SAMPLES = sorted(MODELS.glob("*.onnx"))
MLP = MODELS / "mlp_dynamic.onnx"
CONTROL_FLOW = MODELS / "control_flow.onnx"


def zero_point_first_rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
    """The arithmetic expansion computing Round(x / scale + zp) instead of Round(x / scale) + zp."""
    rewritten = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    for div in quotients(rewritten, site_pairs(model)):
        (rounding,) = div.outputs[0].consumers()
        (adding,) = rounding.outputs[0].consumers()
        shifted = ir.node("Add", [div.outputs[0], adding.inputs[1]])
        rounded = ir.node("Round", [shifted.outputs[0]])
        div.graph.insert_before(adding, [shifted, rounded])
        adding.outputs[0].replace_all_uses_with(rounded.outputs[0])
        div.graph.remove([adding, rounding], safe=True)
    return ir.to_proto(rewritten)


def floored_zero_point_rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
    """The arithmetic expansion whose y_zero_point output (only) floors instead of rounding; y is right."""
    rewritten = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    names = {n.outputs[2].name for nodes in dql_pass.find_sites(ir.from_proto(model)).values() for n in nodes}
    for node in list(ir.traversal.RecursiveGraphIterator(rewritten.graph)):
        if node.op_type == "Cast" and node.outputs[0].name in names:
            (rounding,) = [node.inputs[0].producer()]
            floored = ir.node("Floor", [rounding.inputs[0]])
            node.graph.insert_before(node, floored)
            node.replace_input_with(0, floored.outputs[0])
    return ir.to_proto(rewritten)


def renamed_output_rewrite(model: onnx.ModelProto, site_output: str) -> onnx.ModelProto:
    """dql_pass's expansion with one DQL output renamed (its consumers follow the new name)."""
    rewritten = ir.from_proto(dql_pass.expand(model)[0])
    values = {v.name: v for node in rewritten.graph for v in node.outputs}
    values[site_output].name = f"{site_output}_renamed"
    return ir.to_proto(rewritten)


def _row(report: dql_pass.VerifyReport, name: str) -> SiteResult:
    (row,) = [s for s in report.sites if s.name == name]
    return row


def _assert_rejected(report: dql_pass.VerifyReport, site: str, input_class: str | None) -> None:
    """The site failed, with ``input_class`` (of:data:`dql_pass.inputs.CLASSES`) among its failing
    input classes when given; its worst case's label is that case's classes."""
    assert not report.passed and report.exit_code == 1 and report.verdict == "FAIL"
    row = _row(report, site)
    assert row.mismatches > 0 and (input_class is None or input_class in row.classes), (row.classes, row.detail)
    assert site in report.format() and (input_class is None or input_class in report.format())
    worst = {c.name: c for c in [*cases(), *large_cases()]}.get(row.worst_case)
    if worst is not None:
        assert row.worst_class == describe(worst.classes("onnxruntime")), (row.worst_case, row.worst_class)


# -- rejections ---------------------------------------------------------------------------------


def test_rejects_reciprocal_of_the_scale(mlp):
    report = verify(mlp, reciprocal_rewrite(mlp))
    for site in ("input_QuantizeLinear", "relu1_QuantizeLinear", "relu2_QuantizeLinear"):
        _assert_rejected(report, site, "reciprocal")


def test_rejects_a_wrong_zero_point_alone(mlp):
    # y is computed right; only the y_zero_point output is wrong (floored), on non-integer zero points.
    report = verify(mlp, floored_zero_point_rewrite(mlp))
    for site in ("input_QuantizeLinear", "relu1_QuantizeLinear", "relu2_QuantizeLinear"):
        _assert_rejected(report, site, None)  # a zero point is no class of inputs: the detail tells
    # Downstream sites also see the first site's error through the model; the first sees only its own.
    detail = _row(report, "input_QuantizeLinear").detail
    assert "y_zero_point differs" in detail and "y differs" not in detail, detail


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reciprocal_is_caught_by_constructed_ties_whatever_the_seed(seed):
    """No sampling luck: the failing cases are constructed ties, present for every seed."""
    model = dql_model(13)
    report = verify(model, reciprocal_rewrite(model), seed=seed, samples=0)
    _assert_rejected(report, "y", "reciprocal")
    assert any(c.category == "tie" and "reciprocal" in c.classes("onnxruntime") for c in cases(seed=seed))


def test_rejects_zero_point_added_before_rounding(mlp):
    report = verify(mlp, zero_point_first_rewrite(mlp))
    _assert_rejected(report, "input_QuantizeLinear", "near tie")


def test_rejects_onnx_unguarded_function_body(mlp):
    report = verify(mlp, onnx_body(mlp))
    for site in ("input_QuantizeLinear", "relu1_QuantizeLinear", "relu2_QuantizeLinear"):
        _assert_rejected(report, site, "zero range")
        assert "infinite" in _row(report, site).classes


def test_rejects_onnx_body_in_subgraphs_and_functions():
    model = onnx.load(CONTROL_FLOW)
    report = verify(model, onnx_body(model))
    assert {s.graph for s in report.sites} == {
        "main", "main/If(if_out).else_branch", "main/If(if_out).then_branch", "main/Loop(loop_out).body",
        "main/Loop(loop_out).body/If(acc_next).then_branch", "main/Scan(scan_state).body", "function local::FakeQuant",
    }
    for row in report.sites:
        assert "zero range" in row.classes, (row.graph, row.classes)


def test_rejects_a_renamed_output(mlp):
    report = verify(mlp, renamed_output_rewrite(mlp, "relu1_scale"))
    row = _row(report, "relu1_QuantizeLinear")
    assert report.exit_code == 1 and row.worst_class == "lost output" and "relu1_scale" in row.detail
    assert "relu1_QuantizeLinear" in report.format()
    assert _row(report, "input_QuantizeLinear").passed and _row(report, "relu2_QuantizeLinear").passed


def test_rejects_a_rewrite_that_lost_an_output_in_a_function():
    model = onnx.load(CONTROL_FLOW)
    rewritten = ir.from_proto(dql_pass.expand(model, mode="function")[0])
    function = rewritten.functions[("local", "FakeQuant", "")]
    (zero_point,) = [v for node in function for v in node.outputs if v.name == "zero_point"]
    zero_point.name = "zp"
    report = verify(model, ir.to_proto(rewritten))
    row = _row(report, "q")
    assert row.worst_class == "lost output" and report.exit_code == 1
    assert all(s.passed for s in report.sites if s.name != "q")


# -- acceptance ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", dql_pass.MODES)
@pytest.mark.parametrize("variant", dql_pass.VARIANTS)
@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_accepts_own_expansions_of_the_sample_models(path, variant, mode):
    model = onnx.load(path)
    report = verify(model, dql_pass.expand(model, variant=variant, mode=mode)[0])
    assert report.passed and report.exit_code == 0, report.format()
    assert len(report.sites) == sum(len(n) for n in dql_pass.find_sites(ir.from_proto(model)).values())
    assert all(s.cases > 0 for s in report.sites)
    assert report.outputs and all(o.identical for o in report.outputs)


@pytest.mark.parametrize("mode", dql_pass.MODES)
@pytest.mark.parametrize("variant", dql_pass.VARIANTS)
def test_accepts_own_expansion_of_a_built_model(variant, mode):
    """Independent of models/: a one-node DQL model of rank 2."""
    model = dql_model(13, rank=2)
    report = verify(model, dql_pass.expand(model, variant=variant, mode=mode)[0])
    assert report.passed, report.format()
    (row,) = report.sites
    comparable = sum(c.comparable for c in cases())
    assert row.cases == comparable + len(large_cases()) + len(report.input_sets)
    assert report.input_sets == ["sample 0", "sample 1", "sample 2", "zeros", "negative", "positive", "heavy tails"]


def test_unknown_sizes_written_as_minus_one_get_a_default():
    # paddle2onnx and others write dim_value -1 for an unknown size.
    model = dql_model(13, rank=2)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_value = -1
    report = verify(model, dql_pass.expand(model)[0])
    assert report.passed, report.format()


def test_accepts_the_native_node_and_follows_the_zero_range_policy(mlp):
    assert verify(mlp, mlp).passed
    report = verify(mlp, mlp, zero_range="onnx-reference")
    _assert_rejected(report, "input_QuantizeLinear", "zero range")
    expanded = dql_pass.expand(mlp, zero_range="onnx-reference")[0]
    assert verify(mlp, expanded, zero_range="onnx-reference").passed
    _assert_rejected(verify(mlp, expanded), "input_QuantizeLinear", "zero range")


def test_subgraph_sites_are_checked_and_the_report_says_what_the_models_could_not_show():
    model = onnx.load(CONTROL_FLOW)
    report = verify(model, dql_pass.expand(model)[0])
    inside = [s for s in report.sites if s.graph != "main"]
    assert len(inside) == 6 and all(s.cases > 0 and s.not_reachable is None for s in inside)
    assert all(s.model_level.startswith("not checked in the models") for s in inside)
    assert "checked on the catalogue only" in report.format()


def test_sites_are_found_when_a_rewrite_renames_the_control_flow_nodes():
    model = onnx.load(CONTROL_FLOW)
    rewritten = ir.from_proto(dql_pass.expand(model)[0])
    for node in ir.traversal.RecursiveGraphIterator(rewritten.graph):
        if node.op_type in ("If", "Loop", "Scan"):
            node.name = f"renamed_{node.op_type}"
    report = verify(model, ir.to_proto(rewritten))
    assert report.passed and all(s.cases > 0 for s in report.sites), report.format()


def _two_unnamed_ifs(then_dql: bool, else_dql: bool, names: str) -> onnx.ModelProto:
    """Two unnamed If nodes on input ``c``; each branch is a DQL of ``x`` or a non-DQL stand-in.

    ``names`` is "shared" (every branch names its outputs y, s, z) or "distinct".
    """
    def branch(tag: str, dql: bool) -> onnx.GraphProto:
        y, s, z = ("y", "s", "z") if names == "shared" else (f"y{tag}", f"s{tag}", f"z{tag}")
        nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], [y, s, z])] if dql else [
            helper.make_node("Cast", ["x"], [y], to=TensorProto.UINT8),
            helper.make_node("ReduceMax", ["x"], [s], keepdims=0),
            helper.make_node("Cast", [s], [z], to=TensorProto.UINT8),
        ]
        outputs = [helper.make_tensor_value_info(n, t, d) for n, t, d in ((y, TensorProto.UINT8, [4]),
                                                                          (s, TensorProto.FLOAT, []),
                                                                          (z, TensorProto.UINT8, []))]
        return helper.make_graph(nodes, tag, [], outputs)

    nodes = [
        helper.make_node("If", ["c"], [f"a{i}", f"b{i}", f"d{i}"], then_branch=branch(f"t{i}", then_dql),
                         else_branch=branch(f"e{i}", else_dql))
        for i in range(2)
    ]
    outputs = [
        helper.make_tensor_value_info(f"{k}{i}", t, d)
        for i in range(2) for k, t, d in (("a", TensorProto.UINT8, [4]), ("b", TensorProto.FLOAT, []),
                                          ("d", TensorProto.UINT8, []))
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
              helper.make_tensor_value_info("c", TensorProto.BOOL, [])]
    model = helper.make_model(helper.make_graph(nodes, "two_ifs", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _branch_path(model: onnx.ModelProto, index: int, branch: str) -> str:
    """The path verify reports for the ``branch`` of the ``index``-th node of the main graph."""
    ir_model = ir.from_proto(model)
    graph = ir_model.graph.node(index).attributes[branch].as_graph()
    return graph_scopes(ir_model)[graph][0]


def _with_onnx_body_in(model: onnx.ModelProto, expanded: onnx.ModelProto, index: int, branch: str) -> onnx.ModelProto:
    """``expanded`` with the ``branch`` of its ``index``-th node replaced by ONNX's unguarded body of the
    original branch."""
    broken = onnx.ModelProto()
    broken.CopyFrom(expanded)
    body = onnx_body(model).graph.node[index]
    (source,) = [a.g for a in body.attribute if a.name == branch]
    (target,) = [a.g for a in broken.graph.node[index].attribute if a.name == branch]
    target.CopyFrom(source)
    onnx.checker.check_model(broken, full_check=True)
    return broken


@pytest.mark.parametrize("names", ["shared", "distinct"])
def test_sites_in_two_unnamed_ifs_are_told_apart(names):
    """Two unnamed If nodes used to give their branches one path: one graph was checked twice, the other never."""
    model = _two_unnamed_ifs(then_dql=True, else_dql=True, names=names)
    expanded = dql_pass.expand(model)[0]
    report = verify(model, expanded, samples=1)
    assert report.passed, report.format()
    assert len(report.sites) == 4 and all(s.cases > 0 for s in report.sites)
    assert len({s.graph for s in report.sites}) == 4
    for index, branch in [(0, "then_branch"), (0, "else_branch"), (1, "then_branch"), (1, "else_branch")]:
        report = verify(model, _with_onnx_body_in(model, expanded, index, branch), samples=1)
        (failed,) = [s for s in report.sites if not s.passed]
        assert failed.graph == _branch_path(model, index, branch) and "zero range" in failed.classes, report.format()
        assert report.verdict == "FAIL"


def test_a_broken_else_branch_of_one_of_two_ifs_fails_in_the_sites_and_the_model():
    """A false PASS: the first If's else branch computes ONNX's body, the second If's is right.

    The two sites had equal names and path, so they were counted as one. Booleans were always True,
    so no else branch ran in the models either.
    """
    model = _two_unnamed_ifs(then_dql=False, else_dql=True, names="shared")
    expanded = dql_pass.expand(model)[0]
    assert verify(model, expanded).passed
    report = verify(model, _with_onnx_body_in(model, expanded, 0, "else_branch"))
    assert report.verdict == "FAIL" and len(report.sites) == 2
    (failed,) = [s for s in report.sites if not s.passed]
    assert failed.graph == _branch_path(model, 0, "else_branch") and "zero range" in failed.classes
    # The all-zero set runs the else branches: the zero range reaches the final outputs.
    assert report.input_sets == ["sample 0", "sample 1", "sample 2", "zeros", "negative", "positive", "heavy tails"]
    assert [o.name for o in report.outputs if not o.identical] == ["b0"]


def test_boolean_inputs_take_both_values_and_masks_are_ones_or_padded():
    """A mask of ones only passed a rewrite that stops applying it; padded, no row is all zeros. A flag named
    like a mask (use_mask) kept True passed a rewrite of the branch it turns off."""
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [2])
    mask = helper.make_tensor_value_info("bool_mask", TensorProto.BOOL, [2])
    attention = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [64, 16])
    use_mask = helper.make_tensor_value_info("use_mask", TensorProto.BOOL, [])  # a flag, whatever its name
    model = ir.from_proto(dql_model(13))
    model.graph.inputs.extend(ir.from_proto(v) for v in (flag, mask, attention, use_mask))
    sets = input_sets(model, 3, 0, {}, {"d0": 2})
    assert list(sets) == ["sample 0", "sample 1", "sample 2", "zeros", "negative", "positive", "heavy tails"]
    truths = (True, False, True, False, True, False, True)
    assert [s["flag"].tolist() for s in sets.values()] == [[v, v] for v in truths]
    assert [s["use_mask"].tolist() for s in sets.values()] == list(truths)
    assert all(s["bool_mask"].dtype == np.bool_ and s["bool_mask"][0] for s in sets.values())
    # Padded in the odd random sets only: an all-zero input over a zero mask would make NaN.
    for padded, held in zip((False, True, False, False, False, False, False), sets.values()):
        mask = held["attention_mask"]
        lengths = mask.sum(axis=-1)
        assert mask.dtype == np.int64 and (lengths >= 1).all()
        assert (mask == (np.arange(16) < lengths[:, None])).all()  # ones, then zeros
        assert (lengths < 16).any() == padded


def test_a_site_that_depends_on_another_value_is_not_reachable_and_not_a_pass():
    model = dql_model(13)
    model.graph.input.append(helper.make_tensor_value_info("other", TensorProto.FLOAT, []))
    rewritten = ir.from_proto(dql_pass.expand(model)[0])
    other = rewritten.graph.inputs[1]
    (scale,) = [v for node in rewritten.graph for v in node.outputs if v.name == "y_scale"]
    scale.name = "y_scale_computed"
    product = ir.node("Mul", [scale, other])
    product.outputs[0].name = "y_scale"
    rewritten.graph.append(product)
    rewritten.graph.outputs[1] = product.outputs[0]
    report = verify(model, ir.to_proto(rewritten), inputs={"other": np.array(1, np.float32)})
    (row,) = report.sites
    assert row.not_reachable and "'other'" in row.not_reachable
    assert report.verdict == "INCOMPLETE" and report.exit_code == 1
    assert "not reachable" in report.format()


def _scale_function() -> onnx.FunctionProto:
    """local::Scale(x) = x * factor, with ``factor`` an attribute of the call."""
    factor = helper.make_node("Constant", [], ["factor"])
    factor.attribute.append(onnx.AttributeProto(name="value_float", ref_attr_name="factor",
                                                type=onnx.AttributeProto.FLOAT))
    mul = helper.make_node("Mul", ["x", "factor"], ["scaled"])
    return helper.make_function("local", "Scale", ["x"], ["scaled"], [factor, mul], [helper.make_opsetid("", 13)],
                                attributes=["factor"])


def test_a_site_may_call_a_function_that_takes_attributes():
    """Attributes taken from the caller inside a called function are fine: the call gives them."""
    model = dql_model(13)
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    rewritten.graph.node.insert(0, helper.make_node("Scale", ["x"], ["x_scaled"], domain="local", factor=1.0))
    rewritten.graph.node[1].input[0] = "x_scaled"
    rewritten.functions.append(_scale_function())
    rewritten.opset_import.append(helper.make_opsetid("local", 1))
    report = verify(model, rewritten, samples=0)
    assert report.passed and report.sites[0].cases > 1, report.format()


def test_a_site_inside_a_function_that_reads_its_attributes_is_not_reachable():
    """A node of the site's own computation that takes an attribute from its function cannot run alone."""
    dql = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"])
    function = helper.make_function("local", "Quantize", ["x"], ["y", "y_scale", "y_zero_point"], [dql],
                                    [helper.make_opsetid("", 13)], attributes=["factor"])
    original = dql_model(13)
    original.graph.node[0].CopyFrom(helper.make_node("Quantize", ["x"], ["y", "y_scale", "y_zero_point"],
                                                     domain="local", factor=1.0))
    original.functions.append(function)
    original.opset_import.append(helper.make_opsetid("local", 1))
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(original)
    body = rewritten.functions[0]
    scaled = [*_scale_function().node]
    body.node[0].input[0] = "scaled"
    body.node.insert(0, scaled[1])
    body.node.insert(0, scaled[0])
    report = verify(original, rewritten, samples=0)
    (row,) = report.sites
    assert report.verdict == "INCOMPLETE" and "takes attribute 'value_float' from its function" in row.not_reachable


def test_bit_comparison_tells_signed_zeros_and_nan_payloads_apart():
    zeros, quiet, payload = np.float32([0.0, -0.0]), np.float32(np.nan), np.uint32(0x7FC00001).view(np.float32)
    assert same_bits(zeros, np.float32([0.0, 0.0])).tolist() == [True, False]
    assert (not same_bits(np.asarray(quiet), np.asarray(payload))
            and same_bits(np.asarray(quiet), np.asarray(payload), any_nan=True))
    assert bit_difference("y", np.uint8([1, 2, 3]), np.uint8([1, 2, 3])) is None
    difference = bit_difference("y", np.uint8([1, 5, 3, 7]), np.uint8([1, 2, 3, 4]))
    assert difference.elements == 2 and difference.text == ("y differs in 2 of 4 elements, first at [1]: "
                                                            "got 5, expected 2")
    assert bit_difference("s", np.float32(-0.0), np.float32(0.0)).text == "s differs: got -0.0, expected 0.0"
    assert bit_difference("y", np.uint8([1]), np.float32([1])).elements is None
    assert bit_difference("y", np.uint8([1]), np.uint8([[1]])).text == "y has shape [1], expected [1, 1]"


# -- model level -----------------------------------------------------------------------------------


def test_final_output_difference_is_reported_with_its_size(mlp):
    rewritten = ir.from_proto(dql_pass.expand(mlp)[0])
    bias = rewritten.graph.initializers["B3"]  # the last layer's: every site stays right
    bias.const_value = ir.tensor(bias.const_value.numpy() + np.float32(0.25))
    report = verify(mlp, ir.to_proto(rewritten))
    (output,) = report.outputs
    assert not output.identical and output.max_abs == pytest.approx(0.25, rel=1e-5) and output.max_rel > 0
    assert all(s.passed for s in report.sites)
    assert report.exit_code == 1 and "max abs" in report.format()


def test_model_level_checks_each_site_on_its_actual_input():
    """A rewrite that is right on the catalogue but wrong on big tensors is caught in the model and by the
    large site cases."""
    model = dql_model(13, rank=2)
    rewritten = ir.from_proto(dql_pass.expand(model)[0])
    x = rewritten.graph.inputs[0]
    quantize = next(n for n in rewritten.graph if n.op_type == "QuantizeLinear" and n.inputs[0] is x)
    # Scale x by 1.01 when it has over 1000 elements: no catalogue case is that large.
    assert max(c.x.size for c in cases()) < 1000
    size = ir.node("Size", [x])
    big = ir.node("Greater", [
        size.outputs[0], ir.node("Constant", [], attributes={"value": ir.tensor(np.array(1000, np.int64))}).outputs[0]])
    nudged = ir.node("Mul", [x, ir.node("Constant", [], attributes={"value": ir.tensor(np.float32(1.01))}).outputs[0]])
    chosen = ir.node("Where", [big.outputs[0], nudged.outputs[0], x])
    extra = [size.outputs[0].producer(), big.inputs[1].producer(), big, nudged.inputs[1].producer(), nudged, chosen]
    rewritten.graph.insert_before(quantize, extra)
    quantize.replace_input_with(0, chosen.outputs[0])
    report = verify(model, ir.to_proto(rewritten), dims={"d0": 64, "d1": 64}, samples=3)
    (row,) = report.sites
    # all-zero x is unchanged
    assert row.classes == {"model input": len(report.input_sets) - 1, "near tie": 2}, row.classes


def test_real_model_features_token_ids_masks_contrib_ops_external_data(tmp_path):
    """int64 ids and a mask of symbolic shape, a com.microsoft op, weights in external data."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["embedded"]),
        helper.make_node("Gelu", ["embedded"], ["activated"], domain="com.microsoft"),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mask", "last_axis"], ["mask3"]),
        helper.make_node("Mul", ["activated", "mask3"], ["masked"]),
        helper.make_node("DynamicQuantizeLinear", ["masked"], ["q", "q_scale", "q_zero_point"], name="dql"),
        helper.make_node("MatMulInteger", ["q", "weight", "q_zero_point", "weight_zero_point"], ["product"]),
        helper.make_node("Cast", ["product"], ["product_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["product_float", "q_scale"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny_encoder",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence", 8])],
        [
            numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "embedding"),
            numpy_helper.from_array(rng.integers(0, 256, (32, 8)).astype(np.uint8), "weight"),
            numpy_helper.from_array(np.array(128, np.uint8), "weight_zero_point"),
            numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("com.microsoft", 1)])
    original = tmp_path / "tiny.onnx"
    onnx.save(model, original, save_as_external_data=True, location="tiny.data", size_threshold=0)
    rewritten = tmp_path / "tiny_expanded.onnx"
    dql_pass.save_model(dql_pass.expand(original)[0], rewritten)
    report = verify(original, rewritten, dims={"sequence": 5})
    assert report.passed, report.format()
    assert report.input_sets == ["sample 0", "sample 1", "sample 2"]  # no float input: no all-zero set
    ids = np.full((1, 5), 99, np.int64)  # outside the 16-row embedding: ORT refuses ORIGINAL
    with pytest.raises(dql_pass.InputError, match="ORT cannot run ORIGINAL"):
        verify(original, rewritten, inputs={"input_ids": ids})


# -- what PASS covers ------------------------------------------------------------------------------


def test_a_dangling_copy_of_the_dql_does_not_stand_in_for_what_its_readers_read(mlp):
    """A false PASS: the DQL outputs' names held by an unused copy, the readers rewired
    to a decomposition that rounds ties up. What the readers read is what gets checked."""
    report = verify(mlp, dangling_dql_rewrite(mlp), samples=50)
    for site in ("input_QuantizeLinear", "relu1_QuantizeLinear", "relu2_QuantizeLinear"):
        _assert_rejected(report, site, "near tie")
    # The same rewiring to a right decomposition passes: a dangling copy is harmless.
    report = verify(mlp, dangling_dql_rewrite(mlp, half_up=False))
    assert report.passed, report.format()


def test_a_dangling_copy_with_renamed_readers_is_not_a_pass(mlp):
    """The readers renamed as well: what they read cannot be found, so the sites are not checked, not passed."""
    rewritten = ir.from_proto(dangling_dql_rewrite(mlp))
    for node in rewritten.graph:
        if node.op_type == "MatMulInteger":
            node.outputs[0].name += "_renamed"
    report = verify(mlp, ir.to_proto(rewritten))
    assert report.verdict == "INCOMPLETE" and report.exit_code == 1, report.format()
    row = _row(report, "relu1_QuantizeLinear")
    assert "REWRITTEN has no MatMulInteger node making 'matmul2_output_quantized' in main" in row.not_reachable
    assert row.model_level == "not checked in the models: what reads it in REWRITTEN is unknown"


def test_a_site_whose_readers_read_two_values_checks_both():
    """y is a graph output and read by a Cast: the output reads the right y, the Cast a y that rounds ties up."""
    model = dql_model(13)
    model.graph.node.append(helper.make_node("Cast", ["y"], ["y_float"], to=TensorProto.FLOAT))
    model.graph.output.append(helper.make_tensor_value_info("y_float", TensorProto.FLOAT, ["d0"]))
    rewritten = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    values = value_map(rewritten)
    zero_point = ir.node("Cast", [values["y_zero_point"]], attributes={"to": ir.DataType.FLOAT})
    low, high, half = constant_node(np.float32(0)), constant_node(np.float32(255)), constant_node(np.float32(0.5))
    quotient = ir.node("Div", [values["x"], values["y_scale"]])
    floored = ir.node("Floor", [ir.node("Add", [quotient.outputs[0], half.outputs[0]]).outputs[0]])
    shifted = ir.node("Add", [floored.outputs[0], zero_point.outputs[0]])
    clipped = ir.node("Clip", [shifted.outputs[0], low.outputs[0], high.outputs[0]])
    y_half_up = ir.node("Cast", [clipped.outputs[0]], attributes={"to": ir.DataType.UINT8})
    reader = values["y_float"].producer()
    nodes = [zero_point, low, high, half, quotient, floored.inputs[0].producer(), floored, shifted, clipped, y_half_up]
    rewritten.graph.insert_before(reader, nodes)
    reader.replace_input_with(0, y_half_up.outputs[0])
    report = verify(model, ir.to_proto(rewritten), samples=0)
    _assert_rejected(report, "y", "near tie")
    (row,) = report.sites
    comparable = sum(c.comparable for c in cases())
    assert row.cases == 2 * (comparable + len(large_cases()) + len(report.input_sets))  # both values, every case
    assert all(o.identical for o in report.outputs), report.format()  # no set holds a tie


def test_graph_outputs_are_compared_by_name_and_position():
    """Reordered or extra graph outputs fail: a caller reads outputs by position, and gets more."""
    model = onnx.load(MODELS / "relu_dql.onnx")
    rewritten = ir.from_proto(dql_pass.expand(model)[0])
    outputs = rewritten.graph.outputs
    outputs[0], outputs[1] = outputs[1], outputs[0]
    report = verify(model, ir.to_proto(rewritten), samples=0)
    assert report.verdict == "FAIL"
    assert [(o.name, o.detail) for o in report.outputs if not o.identical] == [
        ("y", "REWRITTEN has 'relu_out_quantized' as output 0"),
        ("relu_out_quantized", "REWRITTEN has 'y' as output 1"),
    ]
    outputs[0], outputs[1] = outputs[1], outputs[0]
    outputs.append(value_map(rewritten)["relu_out"])
    report = verify(model, ir.to_proto(rewritten), samples=0)
    assert report.verdict == "FAIL" and report.outputs[-1].name == "relu_out" and not report.outputs[-1].identical
    assert "relu_out" in report.format() and "output that ORIGINAL does not have" in report.format()


def _without_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its symbolic batch dimensions fixed to 1."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in [*fixed.graph.input, *fixed.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "batch":
                dim.dim_value = 1
    return fixed


def test_a_rewrite_that_fixes_the_batch_to_one_fails(mlp):
    report = verify(mlp, _without_batch(dql_pass.expand(mlp)[0]))
    assert report.verdict == "FAIL" and "onnxruntime cannot run REWRITTEN" in report.model_error
    assert not any(note.startswith("ORIGINAL does not run") for note in report.notes), report.notes  # no fallback


def _failing_on_zeros(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` expanded, its output multiplied by 1 through a Gather whose index is out of bounds
    when the input is all zeros: ORT runs it on every input set but the all-zero one."""
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(dql_pass.expand(model)[0])
    graph, x, y = rewritten.graph, rewritten.graph.input[0].name, rewritten.graph.output[0].name
    graph.initializer.extend([numpy_helper.from_array(np.array([0.0], np.float32), "fz_table"),
                              numpy_helper.from_array(np.float32(0), "fz_zero"),
                              numpy_helper.from_array(np.float32(1), "fz_one")])
    graph.node.extend([
        helper.make_node("ReduceMax", [x], ["fz_max"], keepdims=0),
        helper.make_node("Equal", ["fz_max", "fz_zero"], ["fz_all_zero"]),
        helper.make_node("Cast", ["fz_all_zero"], ["fz_index"], to=TensorProto.INT64),  # 1: past the table's end
        helper.make_node("Gather", ["fz_table", "fz_index"], ["fz_gathered"]),
        helper.make_node("Add", ["fz_gathered", "fz_one"], ["fz_factor"]),
        helper.make_node("Mul", [y + "_unfactored", "fz_factor"], [y]),
    ])
    producer = next(n for n in graph.node if y in n.output)
    producer.output[list(producer.output).index(y)] = y + "_unfactored"
    return rewritten


def test_a_rewrite_that_fails_on_a_later_input_set_only_fails(mlp):
    rewritten = _failing_on_zeros(mlp)
    sets = input_sets(ir.from_proto(mlp), 2, 0, {}, {})
    assert list(sets)[:3] == ["sample 0", "sample 1", "zeros"]
    for label in ("sample 0", "sample 1"):  # REWRITTEN runs the sets before the all-zero one
        session(rewritten).run(sets[label])
    report = verify(mlp, rewritten)
    assert report.verdict == "FAIL" and "onnxruntime cannot run REWRITTEN" in report.model_error, report.format()
    assert all(not o.identical for o in report.outputs)


@pytest.mark.parametrize(("target", "failed", "ran", "others"), [
    ([4], [2], 1, None),
    ([-1, 8], [3, 1], 2, "sample 1 with batch=4; the other sets with batch=2: "),
    ([-1, 12], [2, 1], 3, None),
], ids=["batch-one", "even-batch", "batch-of-three"])
def test_an_original_that_fails_at_a_default_batch_runs_at_another_and_the_report_says_so(target, failed, ran, others):
    """x [batch, 4] reshaped to ``target``: [4] runs at batch 1 only, [-1, 8] at an even batch only
    (then the sets take 2 and 4, so that a rewrite fitted to 2 still fails), [-1, 12] at a multiple of 3."""
    shape = numpy_helper.from_array(np.array(target, np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("DynamicQuantizeLinear", ["flat"], ["y", "y_scale", "y_zero_point"], name="dql"),
    ]
    out_shape = [d if d > 0 else "rows" for d in target]
    outputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in (("y", TensorProto.UINT8, out_shape),
                                                                      ("y_scale", TensorProto.FLOAT, []),
                                                                      ("y_zero_point", TensorProto.UINT8, []))]
    graph = helper.make_graph(nodes, "batch_one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              outputs, [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    report = verify(model, dql_pass.expand(model)[0])
    assert report.passed, report.format()
    note, *rest = report.notes
    tried = "; nor ".join(f"with batch={batch} (ORT cannot run ORIGINAL: " for batch in failed)
    assert note.startswith(f"ORIGINAL does not run {tried.split(' (')[0]} (ORT cannot run ORIGINAL: "), note
    assert all(f"with batch={batch} (ORT cannot run ORIGINAL: " in note for batch in failed), note
    assert note.count("; nor with ") == len(failed) - 1 and f"note: {note}" in report.format()
    took = f"batch={ran} in every set" if others is None else "the sizes the next note gives"
    assert note.endswith(f": both models ran with {took}"), note
    assert [r[:len(others)] for r in rest] == ([others] if others else []), rest
    assert report.sites[0].model_level == f"checked on {len(report.input_sets)} input sets"
    assert report.dims == {"batch": ran}


def test_a_batch_given_for_one_input_is_the_batch_of_the_others():
    """Inputs that share the batch may name it apart: a given size for one, by --dim or by an array,
    is every batch-like dimension's (a default of 1 for the other would broadcast and hide its rows)."""
    model = ir.from_proto(dql_model(13, rank=2))
    model.graph.inputs.append(ir.from_proto(helper.make_tensor_value_info("extra", TensorProto.FLOAT, ["n", 8])))
    by_dim = input_sets(model, 3, 0, {}, {"d0": 4})
    by_array = input_sets(model, 3, 0, {"x": np.zeros((4, 16), np.float32)}, {})
    for sets in (by_dim, by_array):
        assert {sets[label]["extra"].shape for label in sets} == {(4, 8)}
    empty = input_sets(model, 3, 0, {}, {"d0": 0})
    assert {empty[label]["extra"].shape for label in empty} == {(0, 8)}
    # Where an input names its batch, only that name counts: an LSTM's first axis is its sequence.
    lstm = ir.from_proto(dql_model(13, rank=2))
    lstm.graph.inputs.append(ir.from_proto(helper.make_tensor_value_info("steps", TensorProto.FLOAT,
                                                                         ["seq", "batch", 8])))
    sets = input_sets(lstm, 3, 0, {}, {"seq": 64})
    assert [sets[label]["steps"].shape[:2] for label in list(sets)[:3]] == [(64, 2), (64, 3), (64, 1)]


def test_synthesized_inputs_take_the_sizes_of_the_given_ones():
    """A given input of batch 3 sets the batch of the synthesized ones; the default batch (a name that
    says batch, or a first axis) is 2, other sizes 16."""
    model = ir.from_proto(dql_model(13, rank=2))
    model.graph.inputs.extend(ir.from_proto(helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "d1"]))
                              for n in ("a", "b"))
    given = input_sets(model, 1, 0, {"a": np.zeros((3, 5), np.float32)}, {})
    assert [given["sample 0"][n].shape for n in ("x", "a", "b")] == [(3, 5), (3, 5), (3, 5)]
    assert input_sets(model, 1, 0, {}, {})["sample 0"]["b"].shape == (2, 16)


def test_samples_zero_without_a_float_input_is_refused_not_a_pass():
    model = embedding_model(rows=16)
    with pytest.raises(dql_pass.InputError, match="samples=0 leaves no input set"):
        verify(model, dql_pass.expand(model)[0], samples=0)
    # Every input given: one set, the given one, whatever the samples (the sets would all be the same).
    for samples in (0, 2):
        report = verify(model, dql_pass.expand(model)[0], samples=samples,
                        inputs={"input_ids": np.zeros((2, 3), np.int64)})
        assert report.passed and report.input_sets == ["given inputs"], report.format()
        assert " over 1 input set" in report.summary and "1 input sets" not in report.summary


def test_inputs_too_large_to_synthesize_are_bad_input(mlp):
    with pytest.raises(dql_pass.InputError, match=r"would need 166\.9 GiB \(7 input sets: 166\.9 GiB synthesized"):
        verify(mlp, mlp, dims={"batch": 100_000_000})


def _site_size_rewrite(model: onnx.ModelProto, defect: str) -> onnx.ModelProto:
    """The expansion made wrong on large tensors only: ``prefix`` reduces the first 256 elements,
    ``double`` doubles y_scale (and so the quantization) when x has more than 1000 elements."""
    rewritten = ir.from_proto(dql_pass.expand(model)[0])
    graph = rewritten.graph
    x = graph.inputs[0]
    if defect == "prefix":
        flat = ir.node("Reshape", [x, constant_node(np.array([-1], np.int64)).outputs[0]])
        head = ir.node("Slice", [flat.outputs[0], constant_node(np.array([0], np.int64)).outputs[0],
                                 constant_node(np.array([256], np.int64)).outputs[0]])
        extra = [flat.inputs[1].producer(), flat, head.inputs[1].producer(), head.inputs[2].producer(), head]
        first = next(n for n in graph if n.op_type in ("ReduceMin", "ReduceMax"))
        graph.insert_before(first, extra)
        for node in graph:
            if node.op_type in ("ReduceMin", "ReduceMax"):
                node.replace_input_with(0, head.outputs[0])
    else:
        scale = value_map(rewritten)["y_scale"]
        scale.name = "y_scale_right"
        big = ir.node("Greater", [ir.node("Size", [x]).outputs[0], constant_node(np.array(1000, np.int64)).outputs[0]])
        doubled = ir.node("Mul", [scale, constant_node(np.float32(2)).outputs[0]])
        chosen = ir.node("Where", [big.outputs[0], doubled.outputs[0], scale])
        chosen.outputs[0].name = "y_scale"
        extra = [big.inputs[0].producer(), big.inputs[1].producer(), big, doubled.inputs[1].producer(), doubled, chosen]
        graph.insert_after(scale.producer(), extra)
        for use in list(scale.uses()):
            if use.node is not doubled and use.node is not chosen:
                use.node.replace_input_with(use.idx, chosen.outputs[0])
        graph.outputs[1] = chosen.outputs[0]
    return ir.to_proto(rewritten)


@pytest.mark.parametrize("defect", ["prefix", "double"])
def test_large_site_cases_catch_a_rewrite_wrong_only_on_large_tensors(defect):
    model = dql_model(13, rank=3)
    assert max(c.x.size for c in cases()) <= 256
    report = verify(model, _site_size_rewrite(model, defect), samples=0, dims={"d0": 1, "d1": 4, "d2": 4})
    (row,) = report.sites
    assert row.classes == {"near tie": 2} and row.worst_case.startswith("large_ties") and report.verdict == "FAIL", (
        row.classes, row.detail)
    assert f"{row.worst_case} (near tie)" in report.format()  # the worst case, with its input classes
    assert all(o.identical for o in report.outputs)  # 16 elements: the model level cannot see it


def test_a_size_dependent_defect_fails_at_small_model_shapes():
    """Without --dim the model runs small (2 x 16 here, so that verify is quick): the catalogue's large
    cases, which every site runs, catch what only shows on thousands of elements; --dim shows it in
    the model too."""
    model = dql_model(13, rank=2)
    report = verify(model, _site_size_rewrite(model, "double"), samples=0)
    (row,) = report.sites
    assert report.verdict == "FAIL" and row.classes == {"near tie": 2}, row.classes
    assert report.dims == {"d0": 2, "d1": 16}
    report = verify(model, _site_size_rewrite(model, "double"), samples=0, dims={"d1": 1000})
    # Three of the four sets: the third runs at batch 1, 1,000 elements, below where the defect shows.
    assert report.sites[0].classes == {"near tie": 2, "model input": 3}, report.sites[0].classes
    assert not any(o.identical for o in report.outputs if o.name != "y_zero_point")


def _one_op_model(op: str, **attributes) -> onnx.ModelProto:
    """x [batch, 16] -> ``op`` -> DQL."""
    nodes = [helper.make_node(op, ["x"], ["act"], **attributes),
             helper.make_node("DynamicQuantizeLinear", ["act"], ["q", "q_scale", "q_zero_point"], name="dql")]
    outputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in (("q", TensorProto.UINT8, ["batch", 16]),
                                                                      ("q_scale", TensorProto.FLOAT, []),
                                                                      ("q_zero_point", TensorProto.UINT8, []))]
    graph = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _clip_model(bound: float) -> onnx.ModelProto:
    model = _one_op_model("Identity")
    bounds = [numpy_helper.from_array(np.float32(v), n) for v, n in ((-bound, "low"), (bound, "high"))]
    model.graph.initializer.extend(bounds)
    model.graph.node[0].CopyFrom(helper.make_node("Clip", ["x", "low", "high"], ["act"]))
    return model


def _zeroed_row(model: onnx.ModelProto, row: int) -> onnx.ModelProto:
    table = numpy_helper.to_array(model.graph.initializer[0]).copy()
    table[row] = 0
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    changed.graph.initializer[0].CopyFrom(numpy_helper.from_array(table, "embedding"))
    return changed


@pytest.mark.parametrize(
    "original, changed",
    [
        (_one_op_model("Relu"), _one_op_model("LeakyRelu", alpha=1e-30)),  # differs on negative inputs only
        (_clip_model(5), _clip_model(6)),  # differs beyond ±5 only
        (embedding_model(64), _zeroed_row(embedding_model(64), 40)),  # differs on token id 40 only
    ],
    ids=["leaky-relu", "clip", "embedding-row"],
)
def test_non_dql_changes_that_show_only_on_rare_inputs_fail(original, changed):
    report = verify(original, dql_pass.expand(changed)[0])
    assert report.verdict == "FAIL" and not all(o.identical for o in report.outputs), report.format()


def test_token_ids_reach_every_row_of_the_table_they_index():
    model = ir.from_proto(embedding_model(1000))
    sets = input_sets(model, 2, 0, {}, {"sequence": 128})
    ids = np.concatenate([s["input_ids"].ravel() for s in sets.values()])  # sample 1 at batch 3
    assert ids.min() >= 0 and ids.max() < 1000 and ids.max() > 900 and ids.shape == ((2 + 3) * 128,)
    assert sets.notes == ["sample 1 with batch=3; the other sets with batch=2: a rewrite fitted to one size fails "
                          "(--dim sets a size for every set)"]
    three = input_sets(model, 3, 0, {}, {})
    assert [three[label]["input_ids"].shape for label in three] == [(2, 16), (3, 17), (1, 16)]
    assert three.notes[0].startswith("sample 1 with batch=3, sequence=17; sample 2 with batch=1; the other sets with "
                                     "batch=2, sequence=16: ")
    assert not input_sets(model, 3, 0, {}, {"batch": 2, "sequence": 16}).notes
    assert input_sets(ir.from_proto(dql_model(13)), 0, 0, {}, {})["negative"]["x"].max() < 0
    heavy = input_sets(ir.from_proto(dql_model(13)), 0, 0, {}, {"d0": 128})["heavy tails"]["x"]
    assert (np.abs(heavy) > 6).any() and (np.abs(heavy) < 1).any()


# -- models given in memory ------------------------------------------------------------------------


def test_a_proto_whose_external_data_is_not_loaded_is_refused(tmp_path, monkeypatch):
    """Its weights would be read from the current folder: here, a decoy that belongs to neither model."""
    (tmp_path / "model").mkdir()
    (tmp_path / "elsewhere").mkdir()
    path = tmp_path / "model" / "mlp.onnx"
    onnx.save(onnx.load(MLP), path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    weights = tmp_path / "model" / "weights.bin"
    (tmp_path / "elsewhere" / "weights.bin").write_bytes(bytes(weights.stat().st_size))
    proto = onnx.load(path, load_external_data=False)
    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(dql_pass.InputError, match="ORIGINAL is a ModelProto with external data that is not loaded"):
        verify(proto, proto, samples=0)
    assert verify(path, onnx.load(path), samples=0).passed  # loaded with its data: fine


def test_an_ir_model_keeps_its_external_constant_attributes(tmp_path):
    const = helper.make_node("Constant", [], ["c"],
                             value=numpy_helper.from_array(np.arange(16, dtype=np.float32), "c_value"))
    model = _one_op_model("Identity")
    model.graph.node.insert(0, const)
    model.graph.node[1].CopyFrom(helper.make_node("Add", ["x", "c"], ["act"]))
    path = tmp_path / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, location="model.data", size_threshold=0, convert_attribute=True)
    loaded = dql_pass.load_model(path)
    attribute = loaded.graph.node(0).attributes["value"]
    assert isinstance(attribute.value, ir.ExternalTensor)
    assert verify(loaded, loaded, samples=0).passed
    assert loaded.graph.node(0).attributes["value"] is attribute


# -- what is live: a kept copy of the readers does not stand in for what REWRITTEN computes ---------


def _reader_chain(opset: int = 13) -> onnx.ModelProto:
    """x -> DQL "dql" -> DequantizeLinear "deq" -> Identity -> out."""
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"], name="dql"),
        helper.make_node("DequantizeLinear", ["y", "y_scale", "y_zero_point"], ["deq_out"], name="deq"),
        helper.make_node("Identity", ["deq_out"], ["out"], name="last"),
    ]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["n"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _keep_dead_copy(model: onnx.ModelProto, rewritten: ir.Model, graph: ir.Graph, kept: set[str]) -> None:
    """Rename every node and value made in ``graph`` but the graph outputs (the readers follow) and append
    ORIGINAL's nodes named ``kept`` there under the old names, read by nothing."""
    for node in graph:
        node.name = node.name and f"{node.name}_new"
        for value in node.outputs:
            if not value.is_graph_output():
                value.name += "_new"
    original = ir.from_proto(model)
    inputs = {v.name: v for v in graph.inputs}
    inputs |= {v.name: v for v in rewritten.graph.inputs}
    for node in [n for n in original.graph if n.name in kept]:
        original.graph.remove(node)
        for i, value in enumerate(node.inputs):
            if value is not None and value.name in inputs:
                node.replace_input_with(i, inputs[value.name])
        graph.append(node)


def test_a_dead_copy_of_the_readers_does_not_stand_in_for_the_live_path():
    """A false PASS: the DQL and its DequantizeLinear kept, unused; a Floor(x/s + 0.5)
    expansion feeds a new DequantizeLinear that the Identity reads."""
    model = _reader_chain()
    rewritten = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    round_half_up(rewritten.graph)
    _keep_dead_copy(model, rewritten, rewritten.graph, {"dql", "deq"})
    report = verify(model, ir.to_proto(rewritten), samples=50)
    assert report.verdict == "INCOMPLETE", report.format()
    assert "nothing REWRITTEN outputs depends on it" in _row(report, "dql").not_reachable
    # The same with a right expansion: the live path is not the one found, still not a pass.
    fine = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    _keep_dead_copy(model, fine, fine.graph, {"dql", "deq"})
    assert verify(model, ir.to_proto(fine)).verdict == "INCOMPLETE"


def test_an_uncalled_copy_of_a_function_does_not_stand_in_for_the_called_one():
    body = _reader_chain().graph
    function = helper.make_function("local", "F", ["x"], ["out"], list(body.node), [helper.make_opsetid("", 13)])
    graph = helper.make_graph([helper.make_node("F", ["x"], ["out"], domain="local")], "calls",
                              list(body.input), list(body.output))
    model = helper.make_model(graph, functions=[function],
                              opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("local", 1)])
    rewritten = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    wrong = rewritten.functions.pop(("local", "F", ""))
    round_half_up(wrong.graph)
    wrong.name = "G"
    rewritten.functions[wrong.identifier()] = wrong
    kept = ir.from_proto(model).functions[("local", "F", "")]
    rewritten.functions[kept.identifier()] = kept
    rewritten.graph.node(0).op_type = "G"
    # The called function holds the site's names: it is what gets checked, and it fails.
    _assert_rejected(verify(model, ir.to_proto(rewritten), samples=50), "dql", "near tie")
    # Under other names only the uncalled copy holds them: not checked, not passed.
    for node in wrong.graph:
        for value in node.outputs:
            if not value.is_graph_output():
                value.name += "_new"
    report = verify(model, ir.to_proto(rewritten), samples=50)
    assert report.verdict == "INCOMPLETE", report.format()
    assert "only function local::F holds" in _row(report, "dql").not_reachable


def test_an_unused_copy_of_an_if_does_not_stand_in_for_the_used_one():
    """The original If kept under new output names, unused; a new If whose then branch rounds ties up
    makes the graph outputs. The live branch holds the site's names: it is checked, and fails."""
    branch = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], name="dql")], "then", [],
        [helper.make_tensor_value_info(n, t, d) for n, t, d in (("y", TensorProto.UINT8, ["n"]),
                                                                ("s", TensorProto.FLOAT, []),
                                                                 ("z", TensorProto.UINT8, []))])
    other = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y2"], to=TensorProto.UINT8),
         helper.make_node("Constant", [], ["s2"], value_float=1.0),
         helper.make_node("Constant", [], ["z2"], value=numpy_helper.from_array(np.uint8(0)))], "else", [],
        [helper.make_tensor_value_info(n, t, d) for n, t, d in (("y2", TensorProto.UINT8, ["n"]),
                                                                ("s2", TensorProto.FLOAT, []),
                                                                 ("z2", TensorProto.UINT8, []))])
    node = helper.make_node("If", ["c"], ["a", "b", "d"], name="if", then_branch=branch, else_branch=other)
    model = helper.make_model(helper.make_graph(
        [node], "if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
                       helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n, t, d) for n, t, d in (("a", TensorProto.UINT8, ["n"]),
                                                                ("b", TensorProto.FLOAT, []),
                                                                 ("d", TensorProto.UINT8, []))]),
        opset_imports=[helper.make_opsetid("", 13)])
    rewritten = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    used = rewritten.graph.node(0)
    used.name = "if_new"
    round_half_up(used.attributes["then_branch"].as_graph())
    kept = ir.from_proto(model).graph.node(0)
    kept.graph.remove(kept)
    kept.replace_input_with(0, rewritten.graph.inputs[1])
    for value in kept.outputs:
        value.name += "_old"
    rewritten.graph.append(kept)
    report = verify(model, ir.to_proto(rewritten), samples=50)
    assert report.verdict == "FAIL", report.format()
    _assert_rejected(report, "dql", "near tie")


# -- outputs of other types, inputs that give nothing to compare or cannot be made -------------------


def _with_sequence_output(model: onnx.ModelProto, second: str) -> onnx.ModelProto:
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    changed.graph.node.append(helper.make_node("Neg", ["x"], ["minus_x"]))
    changed.graph.node.append(helper.make_node("SequenceConstruct", ["x", second], ["both"]))
    changed.graph.output.append(helper.make_tensor_sequence_value_info("both", TensorProto.FLOAT, None))
    return changed


def test_sequence_outputs_are_compared_element_by_element():
    model = _with_sequence_output(dql_model(13), "x")
    assert verify(model, model).passed
    report = verify(model, _with_sequence_output(dql_model(13), "minus_x"))
    (bad,) = [o for o in report.outputs if not o.identical]
    assert bad.name == "both" and bad.differing > 0 and report.verdict == "FAIL", report.format()


def _flipped_weight(model: onnx.ModelProto) -> onnx.ModelProto:
    changed = onnx.ModelProto()
    changed.CopyFrom(model)
    weight = next(t for t in changed.graph.initializer if t.name == "B1")
    array = numpy_helper.to_array(weight).copy()
    array.view(np.uint32)[0] ^= 1 << 22
    weight.CopyFrom(numpy_helper.from_array(array, "B1_changed"))
    # The node and its weight renamed, so it is no node REWRITTEN keeps: only the models can show the change.
    node = next(n for n in changed.graph.node if "B1" in n.input)
    node.name += "_changed"
    node.input[:] = ["B1_changed" if i == "B1" else i for i in node.input]
    return changed


@pytest.mark.parametrize("how", ["dims", "inputs"])
def test_empty_inputs_are_not_a_pass(mlp, how):
    """A flipped weight bit cannot show on a batch of 0: the model level compared nothing."""
    options = {"dims": {"batch": 0}} if how == "dims" else {"inputs": {"input": np.zeros((0, 64), np.float32)}}
    report = verify(mlp, _flipped_weight(mlp), **options)
    assert report.verdict == "INCOMPLETE" and report.exit_code == 1, report.format()
    assert "nothing was compared" in report.model_not_checked
    assert verify(mlp, _flipped_weight(mlp)).verdict == "FAIL"


def _sequence_input_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("SequenceAt", ["xs", "zero"], ["x"]),
        helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"], name="dql"),
    ]
    graph = helper.make_graph(
        nodes, "sequence_in", [helper.make_tensor_sequence_value_info("xs", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info(n, t, d) for n, t, d in (("y", TensorProto.UINT8, ["n"]),
                                                                ("y_scale", TensorProto.FLOAT, []),
                                                                 ("y_zero_point", TensorProto.UINT8, []))],
        [numpy_helper.from_array(np.int64(0), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_an_input_that_cannot_be_synthesized_leaves_the_model_level_not_checked():
    model = _sequence_input_model()
    report = verify(model, dql_pass.expand(model)[0])
    assert report.verdict == "INCOMPLETE" and report.exit_code == 1, report.format()
    assert ("cannot synthesize model input 'xs'" in report.model_not_checked
            and "give it in inputs" in report.model_not_checked)
    assert _row(report, "dql").cases > 0 and _row(report, "dql").model_level.startswith("not checked in the models")


def test_given_inputs_count_toward_the_public_input_cap(mlp, monkeypatch):
    from dql_pass.verification import MAX_INPUT_BYTES, synthesis

    assert MAX_INPUT_BYTES == 4 << 30
    monkeypatch.setattr(synthesis, "MAX_INPUT_BYTES", 1 << 20)
    with pytest.raises(dql_pass.InputError, match=r"GiB to keep track of the sets\), more than the 0 GiB"):
        verify(mlp, mlp, inputs={"input": np.zeros((5000, 64), np.float32)}, samples=0)


def test_a_bug_of_ours_is_a_traceback_not_bad_input(mlp, monkeypatch):
    """Only a runtime's refusal of ORIGINAL is bad input; anything else surfaces as itself."""
    run = sys.modules["dql_pass.verification.model_level"]

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(run, "_exposed", broken)
    with pytest.raises(KeyError):
        verify(mlp, mlp, samples=0)


def test_a_site_model_imports_only_the_domains_it_uses():
    """control_flow.onnx imports the model-local domain 'local' for its function; the main-graph
    site does not call it, and tinygrad refuses a model that imports a domain it does not know."""
    from dql_pass.verification.extract import Scopes, extract, original_sites

    rewritten = dql_pass.expand(ir.load(MODELS / "control_flow.onnx"), variant="float64")[0]
    imports = {}
    for site in original_sites(ir.load(MODELS / "control_flow.onnx")):
        graph, read = Scopes(rewritten).read(site)
        imports[site.graph] = set(extract(rewritten, graph, site, read[0]).opset_imports)  # ai.onnx only
    assert len(imports) == 7 and set(map(frozenset, imports.values())) == {frozenset({""})}


_REWRITES = [*((f"expand {variant} {mode}", variant, mode) for variant in variants.NAMES for mode in variants.MODES),
             *((f"lower {target}", runtimes.get(target).variant, None)
               for target in ("webgpu", "openvino", "reference", "onnxruntime-cuda")), ("as it was", "native", None)]


@pytest.mark.parametrize("rewrite, form, mode", _REWRITES, ids=[r[0] for r in _REWRITES])
def test_a_sites_form_is_read_off_the_ops_rewritten_computes_it_with(rewrite, form, mode):
    """Another runtime's differences are those it states for the site's form, not for its own target's."""
    from dql_pass.verification.extract import Scopes, extract, original_sites
    from dql_pass.verification.site_level import _form

    original = ir.load(MODELS / "mlp_dynamic.onnx")
    if rewrite.startswith("expand"):
        rewritten = dql_pass.expand(original, variant=form, mode=mode, runtime=None)[0]
    elif rewrite.startswith("lower"):
        rewritten = dql_pass.lower(original, target=rewrite.split()[1])[0]
    else:
        rewritten = original
    scopes, forms = Scopes(rewritten), []
    for site in original_sites(ir.load(MODELS / "mlp_dynamic.onnx")):
        graph, read = scopes.read(site)
        forms.append(_form(extract(rewritten, graph, site, read[0], scopes.block(site))))
    assert forms == [form] * 3


def test_part_of_a_site_whose_ops_several_forms_have_has_no_form():
    """arithmetic's site with y dropped has only ops quantizelinear's body has too: it was taken for quantizelinear,
    whose differences on a runtime are not arithmetic's."""
    from dql_pass.decomposition import form_of

    assert form_of({"Div", "Equal", "Max", "Min", "ReduceMax", "ReduceMin", "Sub", "Where"}) is None
    assert form_of(decomposition.variant("float64").op_types) == "float64"  # residual's body has them all too


def _called_twice() -> onnx.ModelProto:
    """local::F(a) = dequantized DQL(Relu(a)), called by main as F(x) and, unnamed, as F(-x)."""
    body = [helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("DynamicQuantizeLinear", ["r"], ["y", "s", "zp"], name="dql"),
            helper.make_node("DequantizeLinear", ["y", "s", "zp"], ["o"])]
    function = helper.make_function("local", "F", ["a"], ["o"], body, [helper.make_opsetid("", 13)])
    graph = helper.make_graph(
        [helper.make_node("F", ["x"], ["o1"], domain="local", name="first"), helper.make_node("Neg", ["x"], ["x2"]),
         helper.make_node("F", ["x2"], ["o2"], domain="local")],
        "twice", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 8]) for name in ("o1", "o2")])
    return helper.make_model(graph, functions=[function], ir_version=8,
                             opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("local", 1)])


@pytest.mark.parametrize("call", ["first", "o2"])
def test_a_call_of_a_site_s_function_that_rewritten_no_longer_makes_leaves_the_site_unchecked(call):
    """The site is checked as the function's body, which REWRITTEN still has for its other call: a call it
    inlined (here with the same DQL, a wrong one passes as well at the model level) is not what was checked."""
    original = _called_twice()
    rewritten = dql_pass.expand(original)[0]
    assert verify(original, rewritten).verdict == "PASS"
    (index, node), = [(i, n) for i, n in enumerate(rewritten.graph.node) if call in (n.name, n.output[0])]
    (function,) = [f for f in rewritten.functions if f.name == "F"]
    inlined = [onnx.NodeProto() for _ in function.node]
    renamed = {"a": node.input[0], "o": node.output[0]}
    for copy, body_node in zip(inlined, function.node):
        copy.CopyFrom(body_node)
        copy.ClearField("name")
        copy.input[:] = [renamed.get(v, f"inlined_{v}" if v else v) for v in copy.input]
        copy.output[:] = [renamed.get(v, f"inlined_{v}") for v in copy.output]
    rewritten.graph.node.pop(index)
    for offset, copy in enumerate(inlined):
        rewritten.graph.node.insert(index + offset, copy)
    report = verify(original, rewritten)
    (site,) = report.sites
    assert report.verdict == "INCOMPLETE", report.format()
    assert site.not_reachable.startswith("REWRITTEN calls no function where ORIGINAL's F ")


def test_a_call_of_a_site_s_function_made_to_a_copy_leaves_the_site_unchecked():
    """Only the function at the site's path is checked: a copy the other call makes (here the same, a wrong
    one passes as well at the model level) is not."""
    original = _called_twice()
    rewritten = dql_pass.expand(original)[0]
    (function,) = [f for f in rewritten.functions if f.name == "F"]
    copy = rewritten.functions.add()
    copy.CopyFrom(function)
    copy.name = "F2"
    (call,) = [node for node in rewritten.graph.node if node.output[0] == "o2"]
    call.op_type = "F2"
    report = verify(original, rewritten)
    assert report.verdict == "INCOMPLETE", report.format()
    assert report.sites[0].not_reachable.startswith("REWRITTEN calls local::F and local::F2 where ORIGINAL calls "
                                                    "local::F")


def test_a_dql_no_output_depends_on_may_be_dropped_but_a_live_one_may_not():
    """Dead code removal (onnx_ir's RemoveUnusedNodesPass) after the expansion: it was a lost output, a FAIL."""
    original = onnx.load(MLP)
    original.graph.node.append(helper.make_node("DynamicQuantizeLinear", ["input"], ["dy", "ds", "dz"], name="dead"))
    rewritten = ir.from_proto(dql_pass.expand(original)[0])
    ir.passes.common.RemoveUnusedNodesPass()(rewritten)
    report = verify(original, ir.to_proto(rewritten))
    assert report.verdict == "PASS", report.format()
    assert _row(report, "dead").dropped.startswith("no graph output of ORIGINAL depends on it, and REWRITTEN has no")
    assert "dropped: dead in main: " in report.format()
    live = renamed_output_rewrite(onnx.load(MLP), "relu1_quantized")
    assert verify(onnx.load(MLP), live).verdict == "FAIL"


def _unread_y() -> onnx.ModelProto:
    """A live DQL whose y nothing reads: out = y_scale * y_zero_point."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "zp"], name="dql"),
             helper.make_node("Cast", ["zp"], ["zpf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["s", "zpf"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("scale", [None, 1.0001])
def test_an_output_of_a_live_dql_that_nothing_reads_may_be_dropped(scale):
    """Dead code removal after the expansion dropped y, which nothing reads: a lost output, a FAIL. y_scale and the
    zero point are still checked: a wrong scale fails."""
    expanded = ir.from_proto(dql_pass.expand(_unread_y())[0])
    ir.passes.common.RemoveUnusedNodesPass()(expanded)
    rewritten = ir.to_proto(expanded)
    assert "q" not in {name for node in rewritten.graph.node for name in node.output}
    if scale is not None:  # y_scale made 1.0001 times larger
        (at,) = [k for k, node in enumerate(rewritten.graph.node) if "s" in node.output]
        producer = rewritten.graph.node[at]
        producer.output[list(producer.output).index("s")] = "s_before"
        rewritten.graph.initializer.append(numpy_helper.from_array(np.float32(scale), "k"))
        rewritten.graph.node.insert(at + 1, helper.make_node("Mul", ["s_before", "k"], ["s"]))
    report = verify(_unread_y(), rewritten)
    assert report.verdict == ("PASS" if scale is None else "FAIL"), report.format()
    assert report.sites[0].unread.startswith("'q' read by nothing in ORIGINAL and dropped by REWRITTEN: not checked")
    assert report.sites[0].cases > 0 and (scale is None) == (report.sites[0].mismatches == 0)


def test_a_call_of_a_site_s_function_renamed_or_named_is_still_that_call():
    """A call is known by its output names: a tool that names (or renames) every node changes nothing."""
    original = _called_twice()
    rewritten = dql_pass.expand(original)[0]
    for index, node in enumerate(rewritten.graph.node):
        node.name = f"node_{index}"
    report = verify(original, rewritten)
    assert report.verdict == "PASS", report.format()


def test_the_ai_onnx_domain_spelled_out_gives_the_schemas_of_its_opset():
    """Attribute defaults from an import keyed "ai.onnx" came from opset 1's schemas: Softmax's axis, 1 there and
    -1 from opset 13, made a FAIL of the same model imported as "" with the axis written out."""
    def model(domain: str) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node("Softmax", ["x"], ["soft"], name="softmax"),
             helper.make_node("DynamicQuantizeLinear", ["soft"], ["y", "s", "z"], name="dql"),
             helper.make_node("DequantizeLinear", ["y", "s", "z"], ["out"], name="dequantize")],
            "softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4])])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, 13)])

    rewritten = dql_pass.expand(model(""))[0]
    next(n for n in rewritten.graph.node if n.name == "softmax").attribute.append(helper.make_attribute("axis", -1))
    report = verify(model("ai.onnx"), rewritten)
    assert report.verdict == "PASS" and report.kept_differences == [], report.format()


def test_an_if_on_a_constant_condition_folded_into_its_graph_passes():
    """What onnxsim and ORT's constant folding do: the branch taken inlined, the other gone. Its nodes were
    "moved" and the other branch's DQL lost: a FAIL of a model that computes the same."""
    def branch(prefix: str, x: str) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("DynamicQuantizeLinear", [x], [f"{prefix}_y", f"{prefix}_s", f"{prefix}_z"],
                              name=f"{prefix}_dql"),
             helper.make_node("DequantizeLinear", [f"{prefix}_y", f"{prefix}_s", f"{prefix}_z"], [f"{prefix}_out"],
                              name=f"{prefix}_dequantize")],
            prefix, [], [helper.make_tensor_value_info(f"{prefix}_out", TensorProto.FLOAT, [2, 4])])

    graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["negated"], name="neg"),
         helper.make_node("If", ["condition"], ["out"], name="if", then_branch=branch("then", "x"),
                          else_branch=branch("else", "negated"))],
        "constant_if", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.array(True), "condition")])
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    folded = dql_pass.expand(original)[0]
    (if_node,) = [n for n in folded.graph.node if n.op_type == "If"]
    then_branch = next(a.g for a in if_node.attribute if a.name == "then_branch")
    kept = [n for n in folded.graph.node if n.op_type not in ("If", "Neg")]
    del folded.graph.node[:]
    folded.graph.node.extend([*kept, *then_branch.node, helper.make_node("Identity", ["then_out"], ["out"])])
    folded.graph.initializer.extend(then_branch.initializer)
    folded.graph.initializer.remove(next(i for i in folded.graph.initializer if i.name == "condition"))
    report = verify(original, folded)
    assert report.verdict == "PASS" and report.kept_differences == [], report.format()
    assert _row(report, "then_dql").cases > 1 and _row(report, "else_dql").dropped


def test_a_call_of_a_site_s_function_inlined_in_one_branch_is_not_stood_for_by_the_other_branch_s():
    """Both branches of an If call F making 't': REWRITTEN inlines the else branch's call. Matched by output names
    across graphs, the then branch's call stood for it: a PASS of a rewrite that differs where the else runs."""
    body = [helper.make_node("DynamicQuantizeLinear", ["a"], ["y", "s", "zp"], name="dql"),
            helper.make_node("DequantizeLinear", ["y", "s", "zp"], ["o"])]
    function = helper.make_function("local", "F", ["a"], ["o"], body, [helper.make_opsetid("", 13)])
    calling = [helper.make_node("F", ["x"], ["t"], domain="local")]
    inlined = [helper.make_node("Clip", ["x", "low", "high"], ["clipped"]),
               helper.make_node("DynamicQuantizeLinear", ["clipped"], ["i_y", "i_s", "i_zp"]),
               helper.make_node("DequantizeLinear", ["i_y", "i_s", "i_zp"], ["t"])]
    t = helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])

    def model(else_nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node("If", ["flag"], ["out"], then_branch=helper.make_graph(calling, "then", [], [t]),
                              else_branch=helper.make_graph(else_nodes, "else", [], [t]))],
            "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])],
            [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("low", -1e30), ("high", 1e30))])
        return helper.make_model(graph, functions=[function], ir_version=8,
                                 opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("local", 1)])

    report = verify(model(calling), model(inlined))
    assert report.verdict == "INCOMPLETE", report.format()
    assert report.sites[0].not_reachable.startswith("REWRITTEN calls no function where ORIGINAL's F 't' in main/")
