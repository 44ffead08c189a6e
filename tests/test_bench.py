"""Tests of tools/bench.py: its model builders, its interleaving, and a whole ``--quick`` run (about 20 s)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import dql_pass

TOOL = Path(__file__).resolve().parent.parent / "tools" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def test_chain_model_is_valid_and_expands(bench):
    model = bench.chain_model(3, width=5)
    onnx.checker.check_model(model, full_check=True)
    assert _ops(model) == ["DynamicQuantizeLinear", "DequantizeLinear"] * 3
    expanded = dql_pass.expand(model)
    assert "DynamicQuantizeLinear" not in _ops(expanded)
    x = {"x0": np.linspace(-3, 2, 5, dtype=np.float32)}
    run = [ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)[0]
           for m in (model, expanded)]
    assert np.array_equal(run[0].view(np.uint32), run[1].view(np.uint32))


def test_big_external_model_references_a_sparse_weights_file(bench, tmp_path):
    path = bench.big_external_model(tmp_path, sites=3, side=64)
    weights = tmp_path / "weights.bin"
    assert weights.stat().st_size == 3 * 64 * 64
    model = onnx.load(path, load_external_data=False)
    onnx.checker.check_model(path, full_check=True)
    external = {
        t.name: {e.key: e.value for e in t.external_data}
        for t in model.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
    }
    assert external == {
        f"W{i}": {"location": "weights.bin", "offset": str(i * 4096), "length": "4096"} for i in range(3)
    }
    assert _ops(model).count("DynamicQuantizeLinear") == 3
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"h0": np.ones((1, 64), np.float32)})
    assert out.shape == (1, 64) and not out.any()  # zero weights


def test_minilm_model_quantizes_to_four_dql_per_layer(bench, tmp_path):
    shape = bench.TransformerShape(layers=2, hidden=32, heads=4, intermediate=64, seq=8)
    model = bench.minilm_model(shape)
    onnx.checker.check_model(model, full_check=True)
    quantized = onnx.load(bench.quantize(model, tmp_path, "q.onnx"))
    assert _ops(quantized).count("DynamicQuantizeLinear") == 4 * shape.layers
    assert _ops(quantized).count("MatMulInteger") == 6 * shape.layers


def test_minilm_model_with_tokens_takes_ids_and_a_mask_of_any_length(bench, tmp_path):
    """The form tools/bench_verify.py times: int64 ids and mask, symbolic batch and sequence."""
    shape = bench.TransformerShape(layers=2, hidden=32, heads=4, intermediate=64, seq=None)
    model = bench.minilm_model(shape, vocab=50)
    onnx.checker.check_model(model, full_check=True)
    inputs = {v.name: v.type.tensor_type for v in model.graph.input}
    assert {n: t.elem_type for n, t in inputs.items()} == {"input_ids": onnx.TensorProto.INT64,
                                                          "attention_mask": onnx.TensorProto.INT64}
    assert all([d.dim_param for d in t.shape.dim] == ["batch", "sequence"] for t in inputs.values())
    quantized = onnx.load(bench.quantize(model, tmp_path, "q.onnx"))
    assert _ops(quantized).count("DynamicQuantizeLinear") == 4 * shape.layers
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.arange(2 * 5, dtype=np.int64).reshape(2, 5)
    full, masked = (session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
                    for mask in (np.ones_like(ids), np.tril(np.ones_like(ids))))
    assert full.shape == (2, 5, 32)
    assert not np.array_equal(full, masked)  # the mask reaches the attention scores

def test_interleaved_rotates_the_first_contender(bench):
    calls: list[str] = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    samples = bench.interleaved(contenders, budget=0.0, min_rounds=3, inner=2)
    assert {name: len(times) for name, times in samples.items()} == {"a": 3, "b": 3, "c": 3}
    timed = calls[3:]  # after one warm-up call each
    firsts = [timed[i * 6] for i in range(3)]
    assert firsts == ["a", "b", "c"]
    assert all(timed.count(name) == 6 for name in "abc")


def test_quick_run_writes_every_section(tmp_path):
    out, profile = tmp_path / "B.md", tmp_path / "profile.txt"
    done = subprocess.run(
        [sys.executable, str(TOOL), "--quick", "--out", str(out), "--profile", str(profile)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    for title in ("## Machine and versions", "## Targets", "## 1. Op level", "## 2. Pass throughput",
                  "## 3. Memory", "## 4. Whole models"):
        assert title in text
    assert "**outputs differ**" not in text and "| **no** |" not in text
    assert "cumulative" in profile.read_text()
    plot = tmp_path / "benchmarks" / "op_ratio.png"
    if importlib.util.find_spec("matplotlib"):
        assert 0 < plot.stat().st_size < 100_000
    else:
        assert not plot.exists() and "matplotlib is not installed" in text


def test_write_report_keeps_the_sections_of_other_tools(bench, tmp_path):
    out = tmp_path / "B.md"
    out.write_text("# Benchmarks\n\nold intro\n\n## 1. Op level\n\nold figures\n\n## Fusion\n\nfused figures\n")
    bench.write_report(out, "# Benchmarks\n\nnew intro\n\n## 1. Op level\n\nnew figures\n")
    assert out.read_text() == "# Benchmarks\n\nnew intro\n\n## 1. Op level\n\nnew figures\n\n## Fusion\n\nfused figures\n"
    bench.write_report(out, "# Benchmarks\n\n## 1. Op level\n\nnewer\n")
    assert out.read_text().count("## Fusion") == 1 and "new figures" not in out.read_text()


def test_same_bits_needs_every_output_and_every_bit(bench):
    a, b = np.array([0.0, 1.0], np.float32), np.array(7, np.uint8)
    assert bench._same_bits([a, b], [a.copy(), b.copy()])
    assert not bench._same_bits([a, b], [a])  # a lost output
    assert not bench._same_bits([a], [np.array([-0.0, 1.0], np.float32)])  # -0.0 is not 0.0
    assert not bench._same_bits([a], [a.astype(np.float64)])


def test_write_report_replaces_a_section_without_a_head_in_place(bench, tmp_path):
    """How tools/bench_fuse.py writes its ``## Fusion`` section."""
    out = tmp_path / "B.md"
    bench.write_report(out, "## Fusion\n\nfirst\n")
    assert out.read_text() == "# Benchmarks\n\n## Fusion\n\nfirst\n"
    out.write_text("# Benchmarks\n\nintro\n\n## 1. Op level\n\nops\n\n## Fusion\n\nfirst\n\n## Other\n\nother\n")
    bench.write_report(out, "## Fusion\n\nsecond\n")
    assert out.read_text() == "# Benchmarks\n\nintro\n\n## 1. Op level\n\nops\n\n## Fusion\n\nsecond\n\n## Other\n\nother\n"
