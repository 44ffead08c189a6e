"""verify and run-tests: no verdict passes what it did not check, none fails what only the runtime
cannot do."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import runtimes, suites
from dql_pass.errors import one_line
from dql_pass.runtimes.openvino import OpenVino
from dql_pass.runtimes.ort import OnnxRuntime
from helpers import MODELS, dql_model, installed, sample


# -- a known difference excuses the runtime, not a model no holder can run -------------------


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
def test_a_known_difference_does_not_excuse_a_model_that_cannot_run_as_onnx_defines_it(tmp_path, runtime, policy,
                                                                                       opset):
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


# -- a site model the runtime cannot load is not checked there, not a mismatch -------


@pytest.fixture(scope="module")
def conv_for_openvino(tmp_path_factory):
    """The sample ConvInteger model and its lowering for OpenVINO."""
    original = sample("conv_dynamic")
    lowered, _ = dql_pass.lower(original, target="openvino")
    return original, lowered


def test_lowered_conv_sites_keep_the_rank_openvino_needs(conv_for_openvino):
    original, lowered = conv_for_openvino
    report = dql_pass.verify(original, lowered, runtime="openvino")
    conv = [s for s in report.sites if s.name.startswith("ConvInteger")]
    assert len(conv) == 2 and all(s.cases > 0 and s.mismatches == 0 and s.not_checked is None for s in conv)
    assert report.verdict == "PASS", report.format()


_LONG = "the plugin's reason, " * 40 + "and its cause last"


def _refusing(runtime_class, monkeypatch, inputs: set[str]) -> None:
    """``runtime_class`` refuses, with a reason longer than 300 characters, the models whose first input is
    in ``inputs``."""
    load = runtime_class._load

    def refusing(self, model, **options):
        graph = model.graph if isinstance(model, (ir.Model, onnx.ModelProto)) else onnx.load(model).graph
        if (graph.inputs[0].name if isinstance(graph, ir.Graph) else graph.input[0].name) in inputs:
            raise runtimes.RuntimeFailure(_LONG)
        return load(self, model, **options)

    monkeypatch.setattr(runtime_class, "_load", refusing)


@pytest.mark.parametrize("kind, first_input", [("lowered", "input0"), ("dql", "x")])
def test_a_site_model_openvino_refuses_is_not_checked_there_with_its_whole_reason(
    conv_for_openvino, monkeypatch, kind, first_input
):
    original, lowered = conv_for_openvino
    _refusing(OpenVino, monkeypatch, {first_input})
    report = dql_pass.verify(original, lowered, runtime="openvino")
    refused = [s for s in report.sites if (" " in s.name) == (kind == "lowered")]  # lowered rows: "ConvInteger 'name'"
    assert len(refused) == 3 and all(s.mismatches == 0 and s.cases > 0 for s in refused)  # still checked on ORT
    assert all(_LONG in s.not_checked for s in refused)
    assert all(s.not_checked is None for s in report.sites if s not in refused)
    assert all(o.identical for o in report.outputs)
    assert report.verdict == "INCOMPLETE" and report.exit_code == 1
    assert "3 sites not checked on openvino" in report.summary
    assert "and its cause last" in report.format()


def test_a_model_whose_compile_kills_openvino_is_not_checked_there_and_verify_lives(tmp_path):
    """OpenVINO's CPU plugin dies (SIGSEGV) compiling mlp_dynamic's site models lowered for webgpu (lean's
    scale rounding, two Gemms): in the command's own process that ended verify with no verdict. In its
    worker, each crash fails that run, and verify reports those sites not checked."""
    installed("openvino")
    lowered = tmp_path / "lowered.onnx"
    dql_pass.lower_file(MODELS / "mlp_dynamic.onnx", lowered, target="webgpu")  # lean
    report = dql_pass.verify(MODELS / "mlp_dynamic.onnx", lowered, runtime="openvino")
    refused = [s for s in report.sites if s.not_checked]
    assert refused and all(s.mismatches == 0 and s.cases > 0 for s in refused)  # still checked on ORT
    assert any("openvino crashed (SIGSEGV)" in s.not_checked for s in refused), report.format()
    assert report.verdict == "INCOMPLETE"


def test_a_site_model_ort_refuses_too_is_still_a_mismatch(conv_for_openvino, monkeypatch):
    original, lowered = conv_for_openvino
    _refusing(OpenVino, monkeypatch, {"input0"})
    _refusing(OnnxRuntime, monkeypatch, {"input0"})
    report = dql_pass.verify(original, lowered, runtime="openvino")
    conv = [s for s in report.sites if s.name.startswith("ConvInteger")]
    assert all(s.mismatches and "onnxruntime cannot load it either" in s.detail and _LONG in s.detail for s in conv)
    assert report.verdict == "FAIL"


def test_one_line_folds_whitespace_and_keeps_the_whole_reason():
    assert one_line(RuntimeError(_LONG.replace(", ", ",\n  "))) == _LONG


# -- a kept node reads ORIGINAL's constants and carries its attributes ------------------------


def _masked_matmul(weight_change: int = 0, alpha: float = 0.01, function: bool = False) -> onnx.ModelProto:
    """x -> DQL -> MatMulInteger(W) -> Cast -> Mul -> Add(-1e6 bias) -> LeakyRelu(alpha) -> Relu: the
    bias and Relu hide a change of W or alpha from every input that is not huge. With ``function``, the
    MatMulInteger and its weight (a Constant node) sit in a model-local function."""
    weights = np.arange(-12, 12, dtype=np.int8).reshape(4, 6)
    weights[1, 2] += weight_change
    constant = helper.make_node("Constant", [], ["W"], name="weights", value=numpy_helper.from_array(weights, "W"))
    matmul = helper.make_node("MatMulInteger", ["y", "W", "zp"], ["acc"], name="matmul")
    body = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zp"], name="dql"),
        helper.make_node("Cast", ["acc"], ["acc_f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["acc_f", "scale"], ["scaled"], name="mul"),
        helper.make_node("Add", ["scaled", "bias"], ["biased"], name="add"),
        helper.make_node("LeakyRelu", ["biased"], ["leaky"], name="act", alpha=alpha),
        helper.make_node("Relu", ["leaky"], ["out"], name="relu"),
    ]
    bias = numpy_helper.from_array(np.full(6, -1e6, np.float32), "bias")
    opsets = [helper.make_opsetid("", 13)]
    functions = []
    if function:
        functions = [helper.make_function("local", "Product", ["y", "zp"], ["acc"], [constant, matmul], opsets)]
        body.insert(1, helper.make_node("Product", ["y", "zp"], ["acc"], name="product", domain="local"))
        opsets.append(helper.make_opsetid("local", 1))
    else:
        body[1:1] = [constant, matmul]
    graph = helper.make_graph(
        body, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 6])], [bias],
    )
    return helper.make_model(graph, opset_imports=opsets, functions=functions, ir_version=8)


@pytest.mark.parametrize("function", [False, True])
@pytest.mark.parametrize("change, named", [
    ({"weight_change": 1}, "input 1 ('W')"),
    ({"alpha": 0.02}, "attribute 'alpha' is 0.00999"),
])
def test_a_kept_node_whose_constant_or_attribute_changed_fails_whatever_the_inputs(function, change, named):
    original = _masked_matmul(function=function)
    changed = _masked_matmul(**change, function=function)
    assert dql_pass.verify(original, original).verdict == "PASS"
    report = dql_pass.verify(original, changed)
    assert all(o.identical for o in report.outputs)  # the inputs verify makes do not show it
    assert report.verdict == "FAIL", report.format()
    assert any(named in d for d in report.kept_differences)
    where = "function local::Product" if function else "main"
    if "weight_change" in change:
        assert any(d.startswith(f"MatMulInteger 'matmul' in {where}: input 1 ('W') differs in 1 of 24")
                   for d in report.kept_differences)
        assert any(d.startswith(f"Constant 'weights' in {where}: attribute 'value'") for d in report.kept_differences)
    assert "kept node changed: " in report.format()


def test_an_attribute_left_out_is_the_same_as_written_out_at_its_default():
    """LeakyRelu's alpha of 0.01 is its default: a rewrite (or a converter) may spell it out or leave it out."""
    original = _masked_matmul()
    left_out = _masked_matmul()
    (leaky,) = [node for node in left_out.graph.node if node.op_type == "LeakyRelu"]
    assert [a.name for a in leaky.attribute] == ["alpha"]
    del leaky.attribute[:]
    for before, after in ((original, left_out), (left_out, original)):
        report = dql_pass.verify(before, after)
        assert report.verdict == "PASS" and report.kept_differences == [], report.format()
    report = dql_pass.verify(left_out, _masked_matmul(alpha=0.02))
    assert [d.split(": ", 1)[1] for d in report.kept_differences] == [
        "attribute 'alpha' is 0.009999999776482582 in ORIGINAL and 0.019999999552965164 in REWRITTEN"]


@pytest.mark.parametrize("change, verdict", [(0.0, "PASS"), (1.0, "FAIL")])
def test_a_broadcast_constant_given_a_leading_axis_is_kept_unless_a_value_changed(change, verdict):
    # The Add's bias [6] stored as [1, 6] (as some converters write it) computes the same; a value
    # changed too is a kept node changed (Relu masks the output on every input verify makes).
    original = _masked_matmul()
    reshaped = _masked_matmul()
    bias = numpy_helper.to_array(reshaped.graph.initializer[0]).reshape(1, 6).copy()
    bias[0, 3] += change
    reshaped.graph.initializer[0].CopyFrom(numpy_helper.from_array(bias, "bias"))
    report = dql_pass.verify(original, reshaped)
    assert report.verdict == verdict and len(report.kept_differences) == (verdict == "FAIL"), report.format()


def test_a_node_retyped_under_its_name_fails():
    # Add 'add' as Sub 'add' of the negated bias, one entry off: Relu masks it on every input verify
    # makes, and the kept-node check, which pairs nodes of one type, saw no kept node to compare.
    original = _masked_matmul()
    retyped = _masked_matmul()
    add = next(node for node in retyped.graph.node if node.name == "add")
    add.op_type = "Sub"
    bias = -numpy_helper.to_array(retyped.graph.initializer[0])
    bias[3] += 1.0
    retyped.graph.initializer[0].CopyFrom(numpy_helper.from_array(bias, "bias"))
    report = dql_pass.verify(original, retyped)
    assert all(o.identical for o in report.outputs)
    assert report.verdict == "FAIL" and report.kept_differences == ["Add 'add' in main: REWRITTEN has a Sub under "
                                                                    "its name"], report.format()


def test_a_kept_node_reading_a_changed_weight_through_an_identity_fails():
    original = _masked_matmul()
    changed = _masked_matmul(weight_change=1)
    for node in changed.graph.node:
        if node.name == "weights":
            node.output[0] = "W0"
    changed.graph.node.insert(2, helper.make_node("Identity", ["W0"], ["W"], name="copy"))
    report = dql_pass.verify(original, changed)
    assert report.verdict == "FAIL" and any("input 1 ('W') differs" in d for d in report.kept_differences)


# -- exact, for a QDQ model, is the ops as ONNX defines them, not ORT's fused integer kernels --


def _qdq_softmax() -> onnx.ModelProto:
    """Q/DQ around a Softmax: at its default level ORT runs the group as QLinearSoftmax."""
    init = [numpy_helper.from_array(np.float32(0.0217391), "sx"), numpy_helper.from_array(np.uint8(120), "zx"),
            numpy_helper.from_array(np.float32(0.0131), "sy"), numpy_helper.from_array(np.uint8(0), "zy")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
             helper.make_node("Softmax", ["xd"], ["p"], name="softmax"),
             helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["pq"], name="qp"),
             helper.make_node("DequantizeLinear", ["pq", "sy", "zy"], ["y"], name="dqp")]
    shape = [4, 8, 16, 16]
    graph = helper.make_graph(nodes, "qdq_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_a_lowered_qdq_model_is_exact_as_onnx_defines_the_ops_and_the_report_says_what_ort_fuses():
    original = _qdq_softmax()
    lowered, _ = dql_pass.lower(original)
    ort = runtimes.get("onnxruntime")
    assert "QLinearSoftmax" in {n.op_type for n in ort.optimized(original).graph.node}
    x = np.random.default_rng(0).standard_normal((4, 8, 16, 16)).astype(np.float32)
    fused, as_written = ort.load(original).run({"x": x})[0], ort.load(original, optimize="basic").run({"x": x})[0]
    assert (fused != as_written).any()  # ORT's default level is not the ONNX semantics of the group
    assert (ort.load(lowered, optimize="basic").run({"x": x})[0] == as_written).all()
    report = dql_pass.verify(original, lowered)
    assert report.verdict == "PASS", report.format()
    [note] = [n for n in report.notes if "QuantizeLinear/DequantizeLinear" in n]
    assert "exact means the ops as ONNX defines them" in note and "level basic without its QDQ transformers" in note
    differing = int(note.split("ORIGINAL itself gives ")[1].split(" of ")[0].replace(",", ""))
    assert differing > 0, note
    assert note.endswith(f"through the graph transformers QDQSelectorActionTransformer ({differing:,} alone)"), note


def test_a_model_without_qdq_gets_no_qdq_note(conv_for_openvino):
    original, lowered = conv_for_openvino
    assert not any("QuantizeLinear/DequantizeLinear" in n for n in dql_pass.verify(original, lowered).notes)


def _failing_runs(runtime_class, monkeypatch, first_input: str) -> None:
    """Sessions of ``runtime_class`` for models whose first input is ``first_input`` fail every run."""
    load = runtime_class._load

    def failing(self, model, **options):
        session = load(self, model, **options)
        if session.input_names[0] == first_input:
            def run(feeds, outputs=None):
                raise runtimes.RuntimeFailure(_LONG)
            session.run = run
        return session

    monkeypatch.setattr(runtime_class, "_load", failing)


@pytest.mark.parametrize("first_input", ["input0", "x"])
def test_site_cases_openvino_cannot_run_are_not_checked_there_not_mismatches(conv_for_openvino, monkeypatch,
                                                                             first_input):
    original, lowered = conv_for_openvino
    _failing_runs(OpenVino, monkeypatch, first_input)
    report = dql_pass.verify(original, lowered, runtime="openvino")
    refused = [s for s in report.sites if s.not_checked]
    assert len(refused) == 3 and all(s.mismatches == 0 and _LONG in s.not_checked for s in refused)
    assert report.verdict == "INCOMPLETE", report.format()


def _with_branch_constant(else_value: float) -> onnx.ModelProto:
    """A DQL model with an If whose else branch, taken only where some x reaches 1e30 (never, in the sets verify
    makes), makes ``else_value``."""
    model = dql_model(13)
    branch = lambda name, value: helper.make_graph(  # noqa: E731
        [helper.make_node("Constant", [], [f"{name}_out"], name=f"{name}_c", value_float=value)], name, [],
        [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [])],
    )
    model.graph.initializer.append(numpy_helper.from_array(np.array(1e30, np.float32), "huge"))
    model.graph.node.extend([helper.make_node("ReduceMax", ["x"], ["x_max"], keepdims=0),
                             helper.make_node("Less", ["x_max", "huge"], ["cond"])])
    model.graph.node.append(helper.make_node(
        "If", ["cond"], ["chosen"], name="if", then_branch=branch("then", 1.0), else_branch=branch("else", else_value),
    ))
    model.graph.output.append(helper.make_tensor_value_info("chosen", TensorProto.FLOAT, []))
    return model


def _swapped_inner_branches() -> onnx.ModelProto:
    """The control-flow sample with the branches of the If in its Loop's body swapped: the inputs verify
    makes do not tell the two apart at the model level."""
    model = onnx.load(MODELS / "control_flow.onnx")
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = next(a.g for a in loop.attribute if a.name == "body")
    inner = next(n for n in body.node if n.op_type == "If")
    then_branch, else_branch = (next(a for a in inner.attribute if a.name == name) for name in ("then_branch",
                                                                                                 "else_branch"))
    then_graph = onnx.GraphProto()
    then_graph.CopyFrom(then_branch.g)
    then_branch.g.CopyFrom(else_branch.g)
    else_branch.g.CopyFrom(then_graph)
    return model


def test_an_if_whose_branches_are_swapped_fails_though_its_outputs_agree_on_every_input_set():
    # Two random sets: their outputs agree (a third, the default, reaches the difference too).
    report = dql_pass.verify(MODELS / "control_flow.onnx", _swapped_inner_branches(), samples=2)
    assert all(o.identical for o in report.outputs)
    assert report.verdict == "FAIL", report.format()
    assert any("in main/Loop(loop_out).body/If(acc_next).then_branch: REWRITTEN has it in "
               "main/Loop(loop_out).body/If(acc_next).else_branch, where ORIGINAL has not" in d
               for d in report.kept_differences)


def test_lower_leaving_a_subgraphs_copy_of_a_node_alone_moves_nothing(tmp_path):
    """The main graph's MatMulInteger 'mm' is lowered; the then branch's, of the same name, reads a B
    fed at run time and stays: one of two nodes of an identity gone is not a move."""
    def product(prefix: str, b: str, x: str) -> list[onnx.NodeProto]:
        return [helper.make_node("DynamicQuantizeLinear", [x], [f"{prefix}q", f"{prefix}s", f"{prefix}z"]),
                helper.make_node("MatMulInteger", [f"{prefix}q", b, f"{prefix}z"], [f"{prefix}acc"], name="mm"),
                helper.make_node("Cast", [f"{prefix}acc"], [f"{prefix}accf"], to=TensorProto.FLOAT),
                helper.make_node("Mul", [f"{prefix}accf", f"{prefix}s"], [f"{prefix}out"])]

    value = lambda name, dtype, shape: helper.make_tensor_value_info(name, dtype, shape)  # noqa: E731
    then_branch = helper.make_graph(product("t_", "Wd", "xd"), "then", [],
                                    [value("t_out", TensorProto.FLOAT, ["a", "b"])])
    else_branch = helper.make_graph([helper.make_node("Identity", ["xd"], ["e_out"])], "else", [],
                                    [value("e_out", TensorProto.FLOAT, ["a", "b"])])
    graph = helper.make_graph(
        [*product("m_", "W", "x"), helper.make_node("If", ["c"], ["r"], name="if", then_branch=then_branch,
                                                    else_branch=else_branch)], "g",
        [value("x", TensorProto.FLOAT, [2, 4]), value("Wd", TensorProto.UINT8, ["k", "n"]),
         value("xd", TensorProto.FLOAT, ["m", "k"]), value("c", TensorProto.BOOL, [])],
        [value("m_out", TensorProto.FLOAT, [2, 3]), value("r", TensorProto.FLOAT, ["a", "b"])],
        [numpy_helper.from_array(np.random.default_rng(0).integers(0, 256, (4, 3)).astype(np.uint8), "W")])
    source, lowered = tmp_path / "m.onnx", tmp_path / "lowered.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), source)
    dql_pass.lower_file(source, lowered)
    report = dql_pass.verify(source, lowered, dims={"k": 4, "n": 3, "m": 2})
    assert report.kept_differences == [] and report.verdict == "PASS", report.format()


def test_a_kept_node_changed_in_a_subgraph_fails():
    original = _with_branch_constant(2.0)
    assert dql_pass.verify(original, original).verdict == "PASS"
    report = dql_pass.verify(original, _with_branch_constant(3.0))
    assert all(o.identical for o in report.outputs) and report.verdict == "FAIL"
    assert report.kept_differences == ["Constant 'else_c' in main/if.else_branch: attribute 'value_float' is 2.0 "
                                       "in ORIGINAL and 3.0 in REWRITTEN"]


def _centred(axes: list[int]) -> onnx.ModelProto:
    """x - ReduceMean(x, axes) -> DQL -> dequantized, at opset 13, where ReduceMean's axes are an attribute."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["mean"], name="mean", axes=axes),
         helper.make_node("Sub", ["x", "mean"], ["centred"], name="centre"),
         helper.make_node("DynamicQuantizeLinear", ["centred"], ["y", "s", "zp"], name="dql"),
         helper.make_node("DequantizeLinear", ["y", "s", "zp"], ["out"], name="dequantize")],
        "centred", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_kept_node_whose_attribute_a_later_opset_made_an_input_is_compared_by_value():
    """onnx's version converter to opset 18 moves ReduceMean's axes into an input: it was a FAIL (the attribute
    gone, a constant input more) of a model that computes the same."""
    import onnx.version_converter

    original = _centred([1])
    converted = onnx.version_converter.convert_version(dql_pass.expand(original)[0], 18)
    report = dql_pass.verify(original, converted)
    assert report.verdict == "PASS" and report.kept_differences == [], report.format()
    other_axes = onnx.version_converter.convert_version(dql_pass.expand(_centred([0]))[0], 18)
    report = dql_pass.verify(original, other_axes)
    assert report.verdict == "FAIL" and report.kept_differences == [
        "ReduceMean 'mean' in main: input 1 (or the attribute it was) is [1] in ORIGINAL and [0] in REWRITTEN"], (
        report.format())
