"""The expansion pass on whole models: every site, every scope, names, constants, opsets, external data."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import MODELS, assert_bits_equal, assert_outputs_bits_equal, dql_model, session
from onnx import TensorProto, helper

import dql_pass
from dql_pass.decomposition import FUNCTION_DOMAIN

SAMPLES = sorted(MODELS.glob("*.onnx"))
COMBINATIONS = [(v, m) for v in dql_pass.VARIANTS for m in dql_pass.MODES]


def _all_nodes(model: ir.Model):
    for root in (model.graph, *model.functions.values()):
        yield from ir.traversal.RecursiveGraphIterator(root)


def _count(model: ir.Model, op_type: str, domains=("", "ai.onnx")) -> int:
    return sum(1 for n in _all_nodes(model) if n.op_type == op_type and n.domain in domains)


def _with_dql_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """Expose main-graph values as extra graph outputs, so DQL outputs are compared too."""
    irm = ir.serde.deserialize_model(model)
    values = {v.name: v for n in irm.graph for v in n.outputs}
    for name in names:
        if name in values and values[name] not in irm.graph.outputs:
            irm.graph.outputs.append(values[name])
    return ir.serde.serialize_model(irm)


def _feeds(model: onnx.ModelProto, seed: int) -> list[dict[str, np.ndarray]]:
    """Random, all-zero and all-negative float inputs; boolean inputs both ways."""
    rng = np.random.default_rng(seed)
    shapes = {
        i.name: ([d.dim_value or 2 for d in i.type.tensor_type.shape.dim], i.type.tensor_type.elem_type)
        for i in model.graph.input
    }
    out = []
    for kind, flag in [("random", True), ("zeros", False), ("negative", True), ("random", False)]:
        feed = {}
        for name, (shape, elem) in shapes.items():
            if elem == TensorProto.BOOL:
                feed[name] = np.array(flag).reshape(shape)
            elif kind == "random":
                feed[name] = rng.standard_normal(shape).astype(np.float32) * np.float32(3)
            elif kind == "zeros":
                feed[name] = np.zeros(shape, np.float32)
            else:
                feed[name] = -np.abs(rng.standard_normal(shape).astype(np.float32)) - np.float32(0.5)
        out.append(feed)
    return out


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("variant, mode", COMBINATIONS)
def test_sample_models_expand_bit_exactly(path, variant, mode):
    original = onnx.load(path)
    before = ir.serde.deserialize_model(original)
    dql_outputs = [v.name for n in before.graph if n.op_type == "DynamicQuantizeLinear" for v in n.outputs]
    expanded_ir = dql_pass.expand(path, variant=variant, mode=mode)[0]
    assert _count(expanded_ir, "DynamicQuantizeLinear") == 0
    assert _count(expanded_ir, "Identity") == _count(before, "Identity")
    expanded = ir.serde.serialize_model(expanded_ir)
    onnx.checker.check_model(expanded, full_check=True)
    onnx.shape_inference.infer_shapes(expanded, check_type=True, strict_mode=True)
    ai_onnx = {o.version for o in original.opset_import if o.domain in ("", "ai.onnx")}
    assert {o.version for o in expanded.opset_import if o.domain in ("", "ai.onnx")} == ai_onnx

    reference = session(_with_dql_outputs(original, dql_outputs))
    candidate = session(_with_dql_outputs(expanded, dql_outputs))
    assert candidate.output_names == reference.output_names
    for feed in _feeds(original, seed=len(path.stem)):
        assert_outputs_bits_equal(candidate.run(feed), reference.run(feed))


def _site_model(opset: int = 13, sites: int = 3) -> onnx.ModelProto:
    nodes, outputs = [], []
    for i in range(sites):
        nodes.append(helper.make_node("Relu" if i % 2 else "Neg", ["x"], [f"a{i}"]))
        nodes.append(helper.make_node("DynamicQuantizeLinear", [f"a{i}"], [f"y{i}", f"s{i}", f"z{i}"], name=f"dql{i}"))
        outputs += [
            helper.make_tensor_value_info(f"y{i}", TensorProto.UINT8, ["n"]),
            helper.make_tensor_value_info(f"s{i}", TensorProto.FLOAT, []),
            helper.make_tensor_value_info(f"z{i}", TensorProto.UINT8, []),
        ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("variant, per_site", [("quantizelinear", 14), ("arithmetic", 19)])
def test_inline_sites_share_constants_and_use_few_nodes(variant, per_site):
    model = _site_model(sites=3)
    expanded = dql_pass.expand(model, variant=variant)[0]
    assert len(expanded.graph.node) == 3 + 3 * per_site  # the three Relu/Neg nodes stay
    shared = [i.name for i in expanded.graph.initializer]
    assert len(shared) == len(set(shared)) <= 3, shared  # 0, 255 and 1 (the zero-range scale is 1 too)
    assert all(n.op_type != "Constant" for n in expanded.graph.node)


def test_function_mode_adds_one_function_per_variant_and_policy():
    model = dql_pass.expand(_site_model(opset=18), mode="function")[0]
    functions = [(f.domain, f.name) for f in model.functions]
    assert functions == [(FUNCTION_DOMAIN, "DynamicQuantizeLinear_quantizelinear_onnxruntime")]
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 18), (FUNCTION_DOMAIN, 1)}
    assert [(o.domain, o.version) for o in model.functions[0].opset_import] == [("", 18)]
    calls = [n for n in model.graph.node if n.domain == FUNCTION_DOMAIN]
    assert [n.name for n in calls] == ["dql0", "dql1", "dql2"]
    again = dql_pass.expand(model, mode="function", variant="arithmetic")[0]
    assert len(again.functions) == 1  # nothing left to expand, nothing added


def test_outputs_keep_their_names_and_consumers():
    model = _site_model(sites=1)
    model.graph.node.append(helper.make_node("Cast", ["y0"], ["y0_float"], to=TensorProto.FLOAT))
    model.graph.output.append(helper.make_tensor_value_info("y0_float", TensorProto.FLOAT, ["n"]))
    model.graph.value_info.append(helper.make_tensor_value_info("s0", TensorProto.FLOAT, []))
    expanded = dql_pass.expand(model)[0]
    produced = {o for n in expanded.graph.node for o in n.output}
    assert {"y0", "s0", "z0"} <= produced
    cast = next(n for n in expanded.graph.node if n.op_type == "Cast" and n.output == ["y0_float"])
    assert list(cast.input) == ["y0"]
    assert [o.name for o in expanded.graph.output] == [o.name for o in model.graph.output]


def _clashing_model() -> onnx.ModelProto:
    """A DQL inside an If branch, with outer names equal to those the pass would pick first."""
    inner = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "Scale", "val_0"], name="dql")],
        "then",
        [],
        [
            helper.make_tensor_value_info("y", TensorProto.UINT8, ["n"]),
            helper.make_tensor_value_info("Scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("val_0", TensorProto.UINT8, []),
        ],
    )
    other = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["y_else"], to=TensorProto.UINT8),
            helper.make_node("Constant", [], ["s_else"], value_float=1.0),
            helper.make_node("Constant", [], ["z_else"], value=helper.make_tensor("z", TensorProto.UINT8, [], [0])),
        ],
        "else",
        [],
        [
            helper.make_tensor_value_info("y_else", TensorProto.UINT8, ["n"]),
            helper.make_tensor_value_info("s_else", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("z_else", TensorProto.UINT8, []),
        ],
    )
    # Outer values named like the pass's candidates: dql/x_min, dql/ReduceMin, dql_pass_q_min, x_scale ...
    clashing = ["dql/x_min", "dql/tmp", "dql/y_scale", "dql_pass_q_min", "dql_pass_q_max", "X_Min", "x_scale"]
    nodes = [helper.make_node("Identity", ["x"], [name], name=name.replace("x_min", "ReduceMin")) for name in clashing]
    nodes.append(helper.make_node("If", ["cond"], ["oy", "os", "oz"], then_branch=inner, else_branch=other, name="if"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n, t, s)
         for n, t, s in [("oy", TensorProto.UINT8, ["n"]), ("os", TensorProto.FLOAT, []),
                         ("oz", TensorProto.UINT8, [])]]
        + [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n"]) for name in clashing],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("variant, mode", COMBINATIONS)
def test_new_names_never_clash_across_scopes(variant, mode):
    model = _clashing_model()
    onnx.checker.check_model(model, full_check=True)
    expanded = dql_pass.expand(model, variant=variant, mode=mode)[0]
    names = [o for n in expanded.graph.node for o in n.output] + [i.name for i in expanded.graph.initializer]
    for node in expanded.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names += [o for n in attr.g.node for o in n.output]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    x = np.array([0.5, -2.0, 7.25], np.float32)
    want = session(model).run({"x": x, "cond": np.array(True)})
    got = session(expanded).run({"x": x, "cond": np.array(True)})
    assert_outputs_bits_equal(got, want)


def test_ai_onnx_domain_spelling():
    model = dql_model(13, domain="ai.onnx")
    expanded = dql_pass.expand(model)[0]
    assert _count(ir.serde.deserialize_model(expanded), "DynamicQuantizeLinear") == 0
    assert {o.version for o in expanded.opset_import if o.domain in ("", "ai.onnx")} == {13}
    onnx.checker.check_model(expanded, full_check=True)
    x = np.array([0, 2, -3, -2.5, 1.34, 0.5], np.float32)
    assert_bits_equal(session(expanded).run({"x": x})[0], np.array([153, 255, 0, 26, 221, 179], np.uint8))


def test_idempotent_and_no_dql_is_unchanged():
    once = dql_pass.expand(ir.serde.deserialize_model(_site_model()))[0]
    twice = dql_pass.ExpandDynamicQuantizeLinearPass()(once)
    assert not twice.modified and twice.report.sites == {}
    plain = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    unchanged = ir.serde.serialize_model(ir.serde.deserialize_model(plain))
    assert dql_pass.expand(plain)[0].SerializeToString() == unchanged.SerializeToString()


def test_non_float_input_is_rejected():
    model = dql_model(13)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(dql_pass.InputError, match="float32"):
        dql_pass.expand(model)[0]


def _external_model(folder: Path) -> Path:
    weight = np.arange(64 * 8, dtype=np.uint8).reshape(64, 8)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["out"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 8])],
        initializer=[onnx.numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = folder / "model.onnx"
    onnx.save(model, path, save_as_external_data=True, location="weights.bin", size_threshold=0)
    return path


@pytest.mark.parametrize("share_data", [False, True])
def test_external_data_next_to_the_input_is_copied_unless_shared(tmp_path, share_data):
    """By default the output stands alone, with its own data file; shared, it refers to the input's."""
    source = _external_model(tmp_path)
    expanded = dql_pass.expand(source)[0]
    assert isinstance(expanded.graph.initializers["w"].const_value, ir.ExternalTensor)
    dql_pass.save_model(expanded, tmp_path / "expanded.onnx", source=source, share_data=share_data)
    written = sorted(p.name for p in tmp_path.iterdir())
    if share_data:
        assert written == ["expanded.onnx", "model.onnx", "weights.bin"]
    else:
        assert len(written) == 4 and re.fullmatch(r"expanded\.onnx\.[0-9a-f]{12}\.data", written[1]), written
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    want = session(onnx.load(source)).run({"x": x})[0]
    got = session(onnx.load(tmp_path / "expanded.onnx")).run({"x": x})[0]
    assert_bits_equal(got, want)


def test_external_data_follows_an_output_elsewhere(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    source = _external_model(tmp_path / "in")
    dql_pass.save_model(dql_pass.expand(source)[0], tmp_path / "out" / "expanded.onnx", source=source)
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(written) == 2 and written[0] == "expanded.onnx"
    assert re.fullmatch(r"expanded\.onnx\.[0-9a-f]{12}\.data", written[1])
    x = np.ones((2, 64), np.float32)
    want = session(onnx.load(source)).run({"x": x})[0]
    got = session(onnx.load(tmp_path / "out" / "expanded.onnx")).run({"x": x})[0]
    assert_bits_equal(got, want)


def _constant_and_branch_external_model(folder: Path) -> Path:
    """External tensors outside the main graph's initializers: a Constant node and an If branch weight."""
    weight = onnx.numpy_helper.from_array(np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4), "w")
    branch_weight = onnx.numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "bw")

    def branch(name: str, initializer) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("MatMul", ["m", initializer.name], [f"{name}_m"]),
             helper.make_node("DynamicQuantizeLinear", [f"{name}_m"], [f"{name}_y", f"{name}_s", f"{name}_z"])],
            name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.UINT8, [1, 4])],
            initializer=[initializer],
        )

    nodes = [
        helper.make_node("Constant", [], ["w"], value=weight),
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("If", ["c"], ["out"], then_branch=branch("then", branch_weight),
                         else_branch=branch("else", onnx.numpy_helper.from_array(np.eye(4, dtype=np.float32), "ew"))),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", TensorProto.UINT8, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.external_data_helper.convert_model_to_external_data(
        model, location="m.onnx.data", size_threshold=0, convert_attribute=True
    )
    path = folder / "m.onnx"
    onnx.save(model, path)
    return path


def test_external_tensors_in_attributes_and_subgraphs_follow_the_output(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    source = _constant_and_branch_external_model(tmp_path / "in")
    target = tmp_path / "out" / "e.onnx"
    dql_pass.save_model(dql_pass.expand(source)[0], target, source=source)
    onnx.checker.check_model(str(target), full_check=True)
    x = np.array([[1.0, -2.0, 0.25, 3.0]], np.float32)
    for flag in (True, False):
        feed = {"x": x, "c": np.array(flag)}
        want = session(onnx.load(source)).run(feed)[0]
        got = session(onnx.load(target)).run(feed)[0]
        assert_bits_equal(got, want)


def test_a_different_function_holding_our_name_is_not_reused():
    name = "DynamicQuantizeLinear_quantizelinear_onnxruntime"
    impostor = helper.make_function(FUNCTION_DOMAIN, name, ["x"], ["y", "y_scale", "y_zero_point"], [
        helper.make_node("Cast", ["x"], ["y"], to=TensorProto.UINT8),
        helper.make_node("ReduceMax", ["x"], ["y_scale"], keepdims=0),
        helper.make_node("Constant", [], ["y_zero_point"], value=helper.make_tensor("z", TensorProto.UINT8, [], [7])),
    ], opset_imports=[helper.make_opsetid("", 13)])
    model = dql_model(13)
    model.graph.node.insert(0, helper.make_node(name, ["x"], ["uy", "us", "uz"], domain=FUNCTION_DOMAIN))
    model.graph.output.extend([helper.make_tensor_value_info("uy", TensorProto.UINT8, ["d0"])])
    model.opset_import.append(helper.make_opsetid(FUNCTION_DOMAIN, 1))
    model.functions.append(impostor)
    expanded = dql_pass.expand(model, mode="function")[0]
    assert sorted(f.name for f in expanded.functions) == [name, f"{name}_1"]
    x = np.array([1, -2, 0.5, 3.25], np.float32)
    assert_outputs_bits_equal(session(expanded).run({"x": x}), session(model).run({"x": x}))
    again = dql_pass.expand(dql_pass.expand(model, mode="function")[0], mode="function")[0]
    assert len(again.functions) == 2


@pytest.mark.parametrize("mode", dql_pass.MODES)
def test_dql_in_a_function_with_an_older_opset(mode):
    # The checker accepts a function importing opset 13 in an opset-17 model when its ops mean the
    # same in both; the stamped Sub and Div changed at 14, so the function moves to 17.
    function = helper.make_function("loc", "F", ["a"], ["y", "s", "z"],
                                    [helper.make_node("DynamicQuantizeLinear", ["a"], ["y", "s", "z"])],
                                    opset_imports=[helper.make_opsetid("", 13)])
    graph = helper.make_graph(
        [helper.make_node("F", ["x"], ["y", "s", "z"], domain="loc")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [5]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("z", TensorProto.UINT8, [])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("loc", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=[function])
    onnx.checker.check_model(model, full_check=True)
    expanded = dql_pass.expand(model, mode=mode)[0]
    onnx.checker.check_model(expanded, full_check=True)
    x = np.array([0, 2, -3, -2.5, 1.34], np.float32)
    assert_outputs_bits_equal(session(expanded).run({"x": x}), session(model).run({"x": x}))


@pytest.mark.parametrize("mode, ir_version", [("inline", 4), ("function", 8)])
def test_ir_version_rises_to_what_the_output_needs(mode, ir_version):
    model = dql_model(11)
    model.ir_version = 3
    expanded = dql_pass.expand(model, mode=mode)[0]
    assert expanded.ir_version == ir_version
    onnx.checker.check_model(expanded, full_check=True)


def test_opsets_beyond_onnx_are_refused_plainly():
    with pytest.raises(dql_pass.InputError, match="opset"):
        dql_pass.expand(dql_model(dql_pass.op.MAX_OPSET + 1))[0]


def test_many_unnamed_sites_get_distinct_names_in_both_modes():
    model = _site_model(sites=50)
    for node in model.graph.node:
        node.name = ""
    for mode in dql_pass.MODES:
        expanded = dql_pass.expand(model, mode=mode)[0]
        # Unnamed stays unnamed (a call in function mode, so that fuse gives it back so); names are unique.
        node_names = [n.name for n in expanded.graph.node if n.op_type not in ("Relu", "Neg") and n.name]
        values = [o for n in expanded.graph.node for o in n.output]
        assert len(set(node_names)) == len(node_names) and len(set(values)) == len(values)
        session(expanded)


@pytest.mark.parametrize("names", [("", ""), ("gate", "gate")], ids=["unnamed", "same name"])
def test_control_flow_nodes_sharing_a_name_get_distinct_graph_paths(names):
    """Two If nodes that a path would tell apart only by name: each branch still gets its own path."""
    def branch(tag: str) -> onnx.GraphProto:
        dql = helper.make_node("DynamicQuantizeLinear", ["x"], [f"{tag}_y", f"{tag}_s", f"{tag}_z"])
        return helper.make_graph([dql], tag, [], [helper.make_tensor_value_info(f"{tag}_y", TensorProto.UINT8, [4])])

    nodes = [helper.make_node("If", ["c"], ["out"], name=names[0], then_branch=branch("a"), else_branch=branch("b")),
             helper.make_node("If", ["c"], ["out"], name=names[1], then_branch=branch("c"), else_branch=branch("d"))]
    nodes[1].output[0] = "out2"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                                           helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("out", TensorProto.UINT8, [4]),
                               helper.make_tensor_value_info("out2", TensorProto.UINT8, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sites = dql_pass.find_sites(ir.from_proto(model))
    assert len(sites) == 4 and all(len(found) == 1 for found in sites.values()), sites


def test_saving_with_a_source_that_is_gone_is_bad_input(tmp_path):
    with pytest.raises(dql_pass.InputError, match="cannot write the output"):
        expanded = dql_pass.expand(ir.from_proto(dql_model(13)))[0]
        dql_pass.save_model(expanded, tmp_path / "o.onnx", source=tmp_path / "gone.onnx")
    assert list(tmp_path.iterdir()) == []
