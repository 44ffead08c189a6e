"""verify against false verdicts, through the command line: exit 1 and FAIL (or INCOMPLETE) for a
wrong rewrite, whatever the samples; exit 2 and one line for bad input; never a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import (
    MODELS, Result, assert_bad_input, dangling_dql_rewrite, dql_model, embedding_model, run_cli,
    value_map, with_custom_op,
)
from onnx import TensorProto, helper, numpy_helper

import dql_pass

MLP = MODELS / "mlp_dynamic.onnx"


def _assert_exit(result: Result, code: int, verdict: str = "FAIL") -> None:
    """Exit ``code``; for 1 the last line says ``verdict``."""
    if code == 2:
        assert_bad_input(result, "")
        return
    assert result.returncode == code, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout.rstrip().splitlines()[-1].startswith("PASS" if code == 0 else verdict), result.stdout


def _save(model: onnx.ModelProto | ir.Model, path: Path) -> Path:
    onnx.save(model if isinstance(model, onnx.ModelProto) else ir.to_proto(model), path)
    return path


def test_readers_rewired_away_from_a_dangling_dql_fail_even_with_many_samples(tmp_path):
    model = onnx.load(MLP)
    rewritten = _save(dangling_dql_rewrite(model), tmp_path / "dangling.onnx")
    result = run_cli("verify", MLP, rewritten, "--samples", "50")
    _assert_exit(result, 1)
    assert "input_QuantizeLinear" in result.stdout and "tie" in result.stdout


def test_an_extra_graph_output_fails(tmp_path):
    model = onnx.load(MODELS / "relu_dql.onnx")
    rewritten = ir.from_proto(dql_pass.expand(model)[0])
    extra = value_map(rewritten)["relu_out"]
    extra.type, extra.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(["batch", 16])
    rewritten.graph.outputs.append(extra)
    result = run_cli("verify", MODELS / "relu_dql.onnx", _save(rewritten, tmp_path / "extra.onnx"), "--samples", "0")
    _assert_exit(result, 1)
    assert "final output 'relu_out' differs: an output that ORIGINAL does not have (output 4)" in result.stdout


def test_samples_zero_on_integer_inputs_is_bad_input_not_a_pass(tmp_path):
    model = _save(embedding_model(16), tmp_path / "ids.onnx")
    result = run_cli("verify", model, model, "--samples", "0")
    _assert_exit(result, 2)
    assert "samples=0" in result.stderr


def test_a_zeroed_embedding_row_beyond_sixteen_fails(tmp_path):
    original = embedding_model(64)
    table = numpy_helper.to_array(original.graph.initializer[0]).copy()
    table[40] = 0
    changed = onnx.ModelProto()
    changed.CopyFrom(original)
    changed.graph.initializer[0].CopyFrom(numpy_helper.from_array(table, "embedding"))
    zeroed = _save(dql_pass.expand(changed)[0], tmp_path / "zeroed.onnx")
    result = run_cli("verify", _save(original, tmp_path / "ids.onnx"), zeroed)
    _assert_exit(result, 1)


def test_inputs_too_large_to_synthesize_are_bad_input():
    result = run_cli("verify", MLP, MLP, "--dim", "batch=100000000")
    _assert_exit(result, 2)
    assert "would need 166.9 GiB" in result.stderr


def test_a_sequence_output_is_compared_not_a_traceback(tmp_path):
    model = dql_model(13)
    model.graph.node.append(helper.make_node("SequenceConstruct", ["x", "x"], ["both"]))
    model.graph.output.append(helper.make_tensor_sequence_value_info("both", TensorProto.FLOAT, None))
    path = _save(model, tmp_path / "sequence_out.onnx")
    _assert_exit(run_cli("verify", path, path, "--samples", "1"), 0)


def test_a_flipped_weight_on_empty_inputs_is_not_a_pass(tmp_path):
    model = onnx.load(MLP)
    bias = next(t for t in model.graph.initializer if t.name == "B1")
    array = numpy_helper.to_array(bias).copy()
    array.view(np.uint32)[0] ^= 1 << 22
    bias.CopyFrom(numpy_helper.from_array(array, "B1_changed"))
    node = next(n for n in model.graph.node if "B1" in n.input)  # node and weight renamed: only the models show it
    node.name += "_changed"
    node.input[:] = ["B1_changed" if i == "B1" else i for i in node.input]
    changed = _save(model, tmp_path / "changed.onnx")
    np.save(tmp_path / "empty.npy", np.zeros((0, 64), np.float32))
    for options in (["--dim", "batch=0"], ["--input", f"input={tmp_path / 'empty.npy'}"]):
        result = run_cli("verify", MLP, changed, *options)
        _assert_exit(result, 1, "INCOMPLETE")
        assert "nothing was compared" in result.stdout


def test_expand_verify_on_an_input_verify_cannot_make_writes_and_says_incomplete(tmp_path):
    model = dql_model(13)
    model.graph.node.insert(0, helper.make_node("SequenceAt", ["xs", "zero"], ["x"]))
    model.graph.initializer.append(numpy_helper.from_array(np.int64(0), "zero"))
    model.graph.input[0].CopyFrom(helper.make_tensor_sequence_value_info("xs", TensorProto.FLOAT, ["d0"]))
    output = tmp_path / "out.onnx"
    result = run_cli("expand", _save(model, tmp_path / "sequence_in.onnx"), "-o", output, "--verify")
    _assert_exit(result, 1, "INCOMPLETE")
    assert "cannot synthesize model input 'xs'" in result.stdout and output.exists()


@pytest.mark.parametrize(("samples", "note"), [
    ("2", "sample 1 with batch=3; zeros with batch=1; the other sets with batch=2: "),
    ("0", "negative with batch=3; positive with batch=1; the other sets with batch=2: "),
])
def test_a_bias_fitted_to_the_default_batch_fails(tmp_path, samples, note):
    # A rewrite that holds at one batch size only (a bias tiled for batch 2 under a new node name)
    # gives ORIGINAL's outputs at that size: verify runs the second set at batch 3, whatever the samples.
    rewritten = ir.from_proto(dql_pass.expand(onnx.load(MLP))[0])
    add = next(node for node in rewritten.graph if node.name == "Add3")
    bias = add.inputs[1].const_value.numpy()
    tiled = ir.Value(name="B3_tiled", const_value=ir.tensor(np.tile(bias, (2, 1))))
    rewritten.graph.initializers.add(tiled)
    add.replace_input_with(1, tiled)
    add.name = "Add3_tiled"
    result = run_cli("verify", MLP, _save(rewritten, tmp_path / "tiled.onnx"), "--samples", samples)
    _assert_exit(result, 1)
    assert f"note: {note}" in result.stdout


def test_an_output_squeezed_at_batch_one_fails(tmp_path):
    # Squeeze without axes: the output loses its batch axis when the batch is 1 (the third set).
    rewritten = ir.from_proto(dql_pass.expand(onnx.load(MLP))[0])
    output = rewritten.graph.outputs[0]
    axes = ir.Value(name="axes", const_value=ir.tensor(np.array([0], np.int64)))
    rewritten.graph.initializers.add(axes)
    unsqueezed = ir.node("Unsqueeze", [output, axes])
    squeezed = ir.node("Squeeze", [unsqueezed.outputs[0]])
    rewritten.graph.extend([unsqueezed, squeezed])
    output.name, squeezed.outputs[0].name = "relu3_inner", output.name
    squeezed.outputs[0].type, squeezed.outputs[0].shape = output.type, output.shape
    rewritten.graph.outputs[0] = squeezed.outputs[0]
    result = run_cli("verify", MLP, _save(rewritten, tmp_path / "squeezed.onnx"))
    _assert_exit(result, 1)


def test_a_rewrite_fitted_to_the_default_sequence_length_fails(tmp_path):
    # Zeros added to the token ids along a sequence of 16 (a position table cut to the size that
    # verify's other sets take), upstream of the DQL site, so that only the model level sees it.
    original = embedding_model(16)
    rewritten = ir.from_proto(dql_pass.expand(original)[0])
    ids = value_map(rewritten)["ids"]
    zeros = ir.Value(name="positions", const_value=ir.tensor(np.zeros(16, np.int32)))
    rewritten.graph.initializers.add(zeros)
    add = ir.node("Add", [ids, zeros])
    ir.convenience.replace_all_uses_with(ids, add.outputs[0])
    add.replace_input_with(0, ids)
    rewritten.graph.insert_after(ids.producer(), add)
    result = run_cli("verify", _save(original, tmp_path / "ids.onnx"), _save(rewritten, tmp_path / "fitted.onnx"))
    _assert_exit(result, 1)
    assert "site mismatches" in result.stdout and " 0 site mismatches" in result.stdout  # the sites pass
    assert ("note: sample 1 with batch=3, sequence=17; sample 2 with batch=1; the other sets with batch=2, "
            "sequence=16: ") in result.stdout


def _lean_table(model: onnx.ModelProto, kind: str) -> onnx.TensorProto:
    """One of lean's per-slot tables in an expanded model: its half-ulp offsets ``d`` (-inf in the first
    slots) or its predecessor factors ``phi`` (2^-24 in magnitude)."""
    for tensor in model.graph.initializer:
        table = numpy_helper.to_array(tensor).ravel()  # rows of [1, 769], the Gemms' shape
        phi = np.float32(2.0**-24 + 2.0**-47)
        if table.size == 769 and (np.isneginf(table[0]) if kind == "d" else abs(table[0]) == phi):
            return tensor
    raise AssertionError(f"no table {kind}")


@pytest.mark.parametrize(("kind", "slot"), [("d", 265), ("d", 569), ("d", 632), ("phi", 220), ("phi", 598)])
def test_one_wrong_entry_of_a_lean_table_fails(kind, slot):
    # A tie sent the wrong way (d zeroed) or a threshold one float off (no predecessor) at one slot:
    # these five passed when the boundary cases took four scales a side.
    original = dql_model(13)
    rewritten, _ = dql_pass.expand(original, variant="lean")
    tensor = _lean_table(rewritten, kind)
    table = numpy_helper.to_array(tensor).copy()
    table.reshape(-1)[slot] = 0
    tensor.CopyFrom(numpy_helper.from_array(table, tensor.name))
    report = dql_pass.verify(original, rewritten, samples=0)
    assert report.verdict == "FAIL" and report.sites[0].mismatches, report.format()


def test_a_division_narrowed_to_float16_is_not_a_pass_on_ort():
    # ORT's CPU provider runs the float16 Div in float32 and drops the Casts around it, so both
    # models agree there bit for bit; a runtime that computes in float16 would not.
    rewritten = ir.from_proto(dql_pass.expand(onnx.load(MLP))[0])
    div = next(node for node in rewritten.graph if node.op_type == "Div")
    for index, value in enumerate(list(div.inputs)):
        narrow = ir.node("Cast", [value], attributes={"to": ir.DataType.FLOAT16})
        rewritten.graph.insert_before(div, narrow)
        div.replace_input_with(index, narrow.outputs[0])
    quotient = div.outputs[0]
    wide = ir.node("Cast", [quotient], attributes={"to": ir.DataType.FLOAT})
    ir.convenience.replace_all_uses_with(quotient, wide.outputs[0])
    wide.replace_input_with(0, quotient)
    rewritten.graph.insert_after(div, wide)
    quotient.type = None
    report = dql_pass.verify(MLP, rewritten)
    assert report.verdict == "INCOMPLETE" and report.narrowed.startswith(
        f"REWRITTEN computes in float16 or bfloat16 at 1 node ORIGINAL does not ('{div.name}')"), report.format()
    assert report.model_not_checked is None and "; not checked on onnxruntime: REWRITTEN computes" in report.summary


def test_float16_nodes_of_original_renamed_in_rewritten_are_original_s_own():
    # Counted by op type, not matched by name: a tool that renames every node narrows nothing.
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Relu", ["h"], ["r"], name="relu16"),
             helper.make_node("Cast", ["r"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("DynamicQuantizeLinear", ["f"], ["y", "s", "z"], name="dql")]
    outputs = [helper.make_tensor_value_info(n, t, shape) for n, t, shape in (
        ("y", TensorProto.UINT8, ["batch", 8]), ("s", TensorProto.FLOAT, []), ("z", TensorProto.UINT8, []))]
    graph = helper.make_graph(nodes, "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              outputs)
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    rewritten = ir.from_proto(dql_pass.expand(original)[0])
    for i, node in enumerate(rewritten.graph):
        node.name = f"renamed_{i}"
    report = dql_pass.verify(original, rewritten)
    assert report.verdict == "PASS", report.format()


def test_an_original_ort_cannot_load_leaves_the_model_level_not_checked():
    """A custom op of another domain: the sites are still checked, the model level cannot be (a traceback, once)."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"], name="dql")]
    graph = helper.make_graph(nodes, "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [2, 4])])
    model = with_custom_op(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), "s")
    report = dql_pass.verify(model, model)
    assert report.verdict == "INCOMPLETE" and report.sites[0].cases and not report.mismatches, report.format()
    assert report.model_not_checked.startswith("ORT cannot load ORIGINAL: "), report.format()
