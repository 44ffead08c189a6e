"""lower at scale: where the lowered weights go, what converting them costs,
and chunk plans for reductions of any declared length.

- An input with external data gives an output with external data, also when lower drops every
  tensor that was external; an output past the protobuf limit gets external data too; the model
  and its data are written as one unit.
- One weight at a time, in int16, is held in both forms: the memory the pass allocates is
  measured with tracemalloc (deterministic: allocations, not timings).
- The worst-case plan is closed form; a declared K of 10^13 is left alone with the reason at
  once instead of allocating 72.8 TiB.
"""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import assert_outputs_bits_equal
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import reference, runtimes
from dql_pass.files import models, protobuf
from dql_pass.cli import main
from dql_pass.lowering import LowerQuantizationPass, products
from dql_pass.lowering.proof import LIMIT, MAX_CHUNKS, Unplanned, plan, plan_uniform
from tools.lower_memory import SIDE, int8_model

ORT = runtimes.get("onnxruntime")


def _data_files(path: Path) -> set[str]:
    return {t.location for t in models.external_tensors(ir.load(path))}


def _run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ORT.load_exact(path, threads=1, optimize="basic").run(feeds)


def _feeds() -> dict[str, np.ndarray]:
    return {"h0": np.random.default_rng(3).standard_normal((1, SIDE), dtype=np.float32)}


# --- where the lowered weights go -------------------------------------------------------------------------------------


def test_an_input_with_external_data_gives_an_output_with_external_data(tmp_path):
    source = int8_model(tmp_path, 9, external=True)  # two 2048 x 2048 int8 weights, all dropped by lower
    output = tmp_path / "lowered.onnx"
    assert main(["lower", str(source), "-o", str(output)]) == 0
    (location,) = _data_files(output)
    assert location.startswith("lowered.onnx.") and location.endswith(".data")
    assert output.stat().st_size < 1 << 20  # the 33 MB of float32 weights are not in the model file
    onnx.checker.check_model(output, full_check=True)
    assert_outputs_bits_equal(_run(output, _feeds()), _run(source, _feeds()))
    # A second write replaces the unit: the new data file is the only one left beside the output.
    assert main(["lower", str(source), "-o", str(output)]) == 0
    assert sorted(p.name for p in tmp_path.glob("lowered.onnx*")) == sorted(["lowered.onnx", *_data_files(output)])


def test_an_output_past_the_protobuf_limit_gets_external_data(tmp_path, monkeypatch):
    source = int8_model(tmp_path, 5, external=False)  # one weight: 4 MiB inline, 16 MiB once lowered
    monkeypatch.setattr(models, "INLINE_LIMIT", 8 << 20, raising=False)
    output = tmp_path / "lowered.onnx"
    assert main(["lower", str(source), "-o", str(output)]) == 0
    assert len(_data_files(output)) == 1
    assert_outputs_bits_equal(_run(output, _feeds()), _run(source, _feeds()))


def test_an_inline_input_below_the_limit_stays_one_file(tmp_path):
    source = int8_model(tmp_path, 5, external=False)
    output = tmp_path / "lowered.onnx"
    assert main(["lower", str(source), "-o", str(output)]) == 0
    assert not _data_files(output) and sorted(p.name for p in tmp_path.iterdir()) == sorted([source.name, output.name])
    assert_outputs_bits_equal(_run(output, _feeds()), _run(source, _feeds()))


def test_weights_kept_beside_the_input_are_copied_unless_shared(tmp_path):
    """expand keeps the input's weights: by default streamed into the output's own data file, so
    that the output stands alone; with share_data, referred to in place and not copied."""
    source = int8_model(tmp_path, 5, external=True)
    output = tmp_path / "expanded.onnx"
    dql_pass.expand_file(source, output)
    (location,) = _data_files(output)
    assert location.startswith("expanded.onnx.") and (tmp_path / location).stat().st_size >= 4 << 20
    dql_pass.expand_file(source, output, share_data=True)
    assert _data_files(output) == {source.name + ".weights"}
    assert not list(tmp_path.glob("expanded.onnx.*"))  # and the sweep took the copy the first write made


# --- what converting the weights costs --------------------------------------------------------------------------------


@pytest.mark.parametrize("external", [True, False])
@pytest.mark.parametrize(("shape", "count", "proof", "most"), [
    ((1024, 1024), 8, "chunked", 1.5),
    ((512, 8192), 1, "single", 1.3),  # one tensor, one product: whatever is held per tensor shows whole
])
def test_lowering_holds_one_weight_at_a_time_in_both_forms(tmp_path, external, shape, count, proof, most):
    """The pass and the save together allocate at most 1.5x the float32 output (tracemalloc counts
    numpy's buffers, not protobuf's); int64 copies of the weights, or a second copy of the output
    kept as the constant store's keys, took it to 2.5x. One large tensor: its copy in the input's
    type, the float32 output, and nothing of the output's size besides (int16 copies of the
    weights and a transient copy of the output for the constant store's digest took it to 2.4x)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.integers(-128, 128, shape, dtype=np.int8), f"W{i}") for i in range(count)]
    nodes = [helper.make_node("MatMulInteger", ["a", f"W{i}", "a_zp"], [f"y{i}"]) for i in range(count)]
    graph = helper.make_graph(
        nodes, "wide", [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, shape[0]]),
                        helper.make_tensor_value_info("a_zp", TensorProto.UINT8, [])],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.INT32, None) for i in range(count)], weights)
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    output_bytes = 4 * count * shape[0] * shape[1]
    tracemalloc.start()
    try:
        result = LowerQuantizationPass()(model)
        models.save_model(result.model, tmp_path / "lowered.onnx", external=external)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(result.report.lowered) == count, result.report.format()  # else the next line holds of nothing
    assert all(item.proof.startswith(proof) for item in result.report.lowered), result.report.format()
    assert peak <= most * output_bytes, f"{peak / output_bytes:.2f}x the output"
    assert bool(_data_files(tmp_path / "lowered.onnx")) == external


@pytest.mark.parametrize(("shape", "shift"), [
    ((50, 6), np.array([-128, 127, 0, 5, -3, 1], np.int8)),  # MatMulInteger, per column
    ((8, 3, 3, 3), np.arange(-128, 128, 32).astype(np.int8).reshape(-1, 1, 1, 1)),  # ConvInteger, per output channel
    ((37,), np.array(-128, np.int8)),  # a 1-D B
    ((9, 4), None),
])
def test_the_weights_magnitudes_are_computed_a_block_at_a_time_exactly(monkeypatch, shape, shift):
    monkeypatch.setattr(products, "BLOCK_ELEMENTS", 7)  # several rows per block, and blocks of one row
    weights = np.random.default_rng(5).integers(-128, 128, shape).astype(np.int8)
    centred = weights.astype(np.int64) - (0 if shift is None else shift.astype(np.int64))
    magnitudes = products._magnitudes(weights, shift)
    assert magnitudes.dtype == np.uint8 and np.array_equal(magnitudes, np.abs(centred))
    as_float = products._centred(weights, shift)
    assert as_float.dtype == np.float32 and np.array_equal(as_float, centred)


_SAVE_GROWTH = """
import sys, numpy as np, onnx_ir as ir
from dql_pass.files import models
def peak():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1, 1024]))
graph = ir.Graph([x], [], nodes=[], opset_imports={"": 13}, name="g")
count = int(sys.argv[2])
for i in range(count):  # 64 MiB of float32
    value = ir.Value(name=f"w{i}", const_value=ir.tensor(np.full((1024 // count, 16384), i, np.float32)))
    graph.register_initializer(value)
    node = ir.node("MatMul", [x, value], name=f"m{i}")
    graph.append(node)
    graph.outputs.append(node.outputs[0])
before = peak()
models.save_model(ir.Model(graph, ir_version=8), sys.argv[1])
print(peak() - before)
"""


@pytest.mark.parametrize("count", [16, 1])
def test_a_one_file_model_is_written_without_a_whole_copy_of_its_tensors(tmp_path, count):
    """ir.save serialises the whole model into a proto and then into bytes: two more copies of the
    tensors (+128 MiB here). Written a tensor at a time, the peak grows by a few of them; and a
    tensor's bytes go from its array to the file, so one 64 MiB tensor adds none of its size
    either (serialised as a message of its own, it added three copies)."""
    done = subprocess.run([sys.executable, "-c", _SAVE_GROWTH, str(tmp_path / "m.onnx"), str(count)],
                          capture_output=True, text=True, check=True)
    growth = int(done.stdout.split()[-1])
    assert growth < 32 << 20, f"the peak grew by {growth / 2**20:.0f} MiB"
    assert not _data_files(tmp_path / "m.onnx")
    tensors = {t.name: numpy_helper.to_array(t) for t in onnx.load(tmp_path / "m.onnx").graph.initializer}
    assert sorted(tensors) == sorted(f"w{i}" for i in range(count))
    assert all(tensors[f"w{i}"].size == (16 << 20) // count and (tensors[f"w{i}"] == i).all() for i in range(count))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.int8, np.uint16, np.bool_, np.float64,
                                   ml_dtypes.int4])
def test_a_tensor_written_from_its_array_is_the_tensor_ir_save_writes(tmp_path, monkeypatch, dtype):
    """Its name, type, shape, doc string and metadata, and its bytes, little-endian and packed as
    the spec says (4-bit ones are serialised as a message)."""
    monkeypatch.setattr(protobuf, "_STREAMED", 16)
    values = np.random.default_rng(4).integers(-8, 8, (3, 5, 7)).astype(dtype)
    tensor = ir.tensor(values, name="t", doc_string="a doc")
    tensor.metadata_props["key"] = "value"
    graph = ir.Graph([], [], nodes=[], initializers=[ir.Value(name="t", const_value=tensor)], opset_imports={"": 13})
    model = ir.Model(graph, ir_version=10)
    models.save_model(model, tmp_path / "streamed.onnx")
    ir.save(model, tmp_path / "whole.onnx")
    streamed, whole = (onnx.load(tmp_path / name) for name in ("streamed.onnx", "whole.onnx"))
    assert streamed.SerializeToString() == whole.SerializeToString()
    assert np.array_equal(ir.load(tmp_path / "streamed.onnx").graph.initializers["t"].const_value.numpy(), values)


def test_a_one_file_model_written_tensor_by_tensor_is_the_model_ir_save_writes(tmp_path):
    model = ir.load(int8_model(tmp_path, 9, external=False))
    dql_pass.lower(model)
    models.save_model(model, tmp_path / "streamed.onnx")
    ir.save(model, tmp_path / "whole.onnx")
    streamed, whole = (onnx.load(tmp_path / name) for name in ("streamed.onnx", "whole.onnx"))
    onnx.checker.check_model(tmp_path / "streamed.onnx", full_check=True)
    assert sorted(t.name for t in streamed.graph.initializer) == sorted(t.name for t in whole.graph.initializer)
    tensors = {t.name: t for t in whole.graph.initializer}
    assert all(t.SerializeToString() == tensors[t.name].SerializeToString() for t in streamed.graph.initializer)
    del streamed.graph.initializer[:], whole.graph.initializer[:]
    assert streamed.SerializeToString() == whole.SerializeToString()


def test_lowered_weights_are_exact_in_every_chunk():
    """int16 centring: uint8 weights against a zero point of 255 and int8 ones against -128 span the
    whole 383-wide range of differences."""
    rng = np.random.default_rng(2)
    for dtype, zp in ((np.uint8, 255), (np.int8, -128), (np.int8, 127)):
        b = rng.integers(np.iinfo(dtype).min, int(np.iinfo(dtype).max) + 1, (700, 5)).astype(dtype)
        node = helper.make_node("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["y"])
        graph = helper.make_graph(
            [node], "one", [helper.make_tensor_value_info(n, TensorProto.UINT8, None) for n in ("a", "a_zp")],
            [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
            [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(zp, dtype), "b_zp")])
        lowered, report = dql_pass.lower(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
        assert report.lowered[0].proof.startswith("chunked"), report.format()
        a = rng.integers(0, 256, (3, 700)).astype(np.uint8)
        feeds = {"a": a, "a_zp": np.array(0, np.uint8)}
        expected = reference.matmul_integer(a, b, feeds["a_zp"], np.array(zp, dtype))
        assert_outputs_bits_equal(ORT.load(lowered, threads=1, optimize="basic").run(feeds), [expected])


# --- chunk plans for any declared length ------------------------------------------------------------------------------


def _declared_k(k: int) -> onnx.ModelProto:
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node], "k", [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, k]),
                      helper.make_tensor_value_info("b", TensorProto.UINT8, [k, 1])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_huge_declared_k_is_left_alone_with_the_reason(tmp_path, capsys):
    source = tmp_path / "k.onnx"
    onnx.save(_declared_k(10**13), source)
    assert main(["lower", str(source), "-o", str(tmp_path / "out.onnx")]) == 0
    err = capsys.readouterr()
    assert f"more than {MAX_CHUNKS:,}" in err.out + err.err
    assert "MatMulInteger" in {n.op_type for n in onnx.load(tmp_path / "out.onnx").graph.node}


@pytest.mark.parametrize("depth", [1, 257, 258, 259, 1000, 4097, 258 * MAX_CHUNKS])
@pytest.mark.parametrize("term", [1, 255 * 255, 255 * 255 * 9])
def test_the_worst_case_plan_is_the_fewest_chunks_that_hold(depth, term):
    size = LIMIT // term
    if -(-depth // size) > MAX_CHUNKS:
        with pytest.raises(Unplanned, match=f"needs {-(-depth // size):,} float32 parts"):
            plan_uniform(depth, term, "worst case")
        return
    proof = plan_uniform(depth, term, "worst case")
    assert proof.chunks[0][0] == 0 and proof.chunks[-1][1] == depth
    assert all(a[1] == b[0] for a, b in zip(proof.chunks, proof.chunks[1:]))
    assert all(0 < (stop - start) * term <= LIMIT for start, stop in proof.chunks) or len(proof.chunks) == 1
    assert len(proof.chunks) == (1 if depth * term <= LIMIT else -(-depth // size))
    # The same plan as the one over the rows of the constant-weight planner.
    if depth <= 5000:
        assert plan(np.full((depth, 1), term, np.int64), 1, "worst case").chunks == proof.chunks


def test_a_single_term_past_the_limit_has_no_plan():
    with pytest.raises(Unplanned, match="single term"):
        plan_uniform(2, LIMIT + 1, "worst case")
    with pytest.raises(Unplanned, match="single term"):
        plan(np.array([[LIMIT // 255 + 1], [1]], np.int64), 255, "constant weights")


def test_a_convolution_whose_kernel_window_alone_passes_the_bound_is_left_alone():
    """A 17 x 17 window of uint8 activations by uint8 weights: 289 * 255 * 255 > 2^24 in one channel pair,
    which no cut along the channels can prove exact."""
    node = helper.make_node("ConvInteger", ["x", "w"], ["y"])
    graph = helper.make_graph(
        [node], "c", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 1, 17, 17]),
                      helper.make_tensor_value_info("w", TensorProto.UINT8, [1, 1, 17, 17])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)])
    _, report = dql_pass.lower(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert not report.lowered and "single term" in report.left_alone[0].reason, report.format()


def test_the_memory_tool_writes_its_section(tmp_path, capsys):
    from tools import lower_memory

    out = tmp_path / "BENCHMARKS.md"
    out.write_text("# Benchmarks\n\n## Fusion\n\nkept\n")
    assert lower_memory.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    assert "## Fusion\n\nkept" in text and lower_memory.SECTION in text
    rows = [line for line in text.splitlines() if line.startswith("| 8 MB")]
    assert len(rows) == 3 and all("| after | 0 |" in row and "| yes |" in row for row in rows), rows
    assert ".data" in rows[1] and ".data" not in rows[0]  # external data in, external data out; one file in, one out
    assert "one tensor" in rows[2] and ".data" not in rows[2]
