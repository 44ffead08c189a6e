"""Tests of the tools package: the models it builds, the harness's timing and report, and a whole benchmark run.

The ``--quick`` run of ``python -m tools.bench`` takes some 2 minutes on 2 cores, so it is marked ``benchmark`` and
left out of the default run; ``pytest -m benchmark`` runs it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import assert_outputs_bits_equal, session

import dql_pass
from tools import harness, models

REPO = Path(__file__).resolve().parent.parent


def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def test_chain_model_is_valid_and_expands():
    model = models.chain_model(3, width=5)
    onnx.checker.check_model(model, full_check=True)
    assert _ops(model) == ["DynamicQuantizeLinear", "DequantizeLinear"] * 3
    expanded = dql_pass.expand(model)[0]
    assert "DynamicQuantizeLinear" not in _ops(expanded)
    x = {"x0": np.linspace(-3, 2, 5, dtype=np.float32)}
    assert_outputs_bits_equal(session(expanded).run(x), session(model).run(x))


def test_big_external_model_references_a_sparse_weights_file(tmp_path):
    path = models.big_external_model(tmp_path, sites=3, side=64)
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
    assert models.dql_count(model) == 3
    (out,) = session(path).run({"h0": np.ones((1, 64), np.float32)})
    assert out.shape == (1, 64) and not out.any()  # zero weights


def test_minilm_model_quantizes_to_four_dql_per_layer(tmp_path):
    shape = models.TransformerShape(layers=2, hidden=32, heads=4, intermediate=64, seq=8)
    model = models.minilm_model(shape)
    onnx.checker.check_model(model, full_check=True)
    quantized = onnx.load(models.quantize(model, tmp_path, "q.onnx"))
    assert models.dql_count(quantized) == 4 * shape.layers
    assert _ops(quantized).count("MatMulInteger") == 6 * shape.layers


def test_minilm_model_with_tokens_takes_ids_and_a_mask_of_any_length(tmp_path):
    """The form tools.bench_verify times: int64 ids and mask, symbolic batch and sequence."""
    shape = models.TransformerShape(layers=2, hidden=32, heads=4, intermediate=64, seq=None)
    model = models.minilm_model(shape, vocab=50)
    onnx.checker.check_model(model, full_check=True)
    inputs = {v.name: v.type.tensor_type for v in model.graph.input}
    assert {n: t.elem_type for n, t in inputs.items()} == {"input_ids": onnx.TensorProto.INT64,
                                                          "attention_mask": onnx.TensorProto.INT64}
    assert all([d.dim_param for d in t.shape.dim] == ["batch", "sequence"] for t in inputs.values())
    quantized = onnx.load(models.quantize(model, tmp_path, "q.onnx"))
    assert models.dql_count(quantized) == 4 * shape.layers
    encoder = session(model)
    ids = np.arange(2 * 5, dtype=np.int64).reshape(2, 5)
    full, masked = (encoder.run({"input_ids": ids, "attention_mask": mask})[0]
                    for mask in (np.ones_like(ids), np.tril(np.ones_like(ids))))
    assert full.shape == (2, 5, 32)
    assert not np.array_equal(full, masked)  # the mask reaches the attention scores


def test_random_feeds_follow_the_inputs_and_refuse_other_types():
    graph = onnx.helper.make_graph(
        [], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3]),
         onnx.helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
         onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [2])],
        [], [onnx.numpy_helper.from_array(np.zeros(2, np.float32), "w")],
    )
    model = onnx.helper.make_model(graph)
    feeds = models.random_feeds(model, np.random.default_rng(0), size=4, flag=False, negative=True)
    assert sorted(feeds) == ["cond", "x"]  # an initializer listed as an input is not fed
    assert feeds["x"].dtype == np.float32 and feeds["x"].shape == (4, 3) and (feeds["x"] <= 0).all()
    assert feeds["cond"].dtype == np.bool_ and not feeds["cond"]
    model.graph.input.append(onnx.helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2]))
    with pytest.raises(ValueError, match="ids is INT64"):
        models.random_feeds(model, np.random.default_rng(0))


def test_interleaved_rotates_the_first_contender():
    calls: list[str] = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    samples = harness.interleaved(contenders, budget=0.0, min_rounds=3, inner=2)
    assert {name: len(times) for name, times in samples.items()} == {"a": 3, "b": 3, "c": 3}
    timed = calls[3:]  # after one warm-up call each
    firsts = [timed[i * 6] for i in range(3)]
    assert firsts == ["a", "b", "c"]
    assert all(timed.count(name) == 6 for name in "abc")


def test_race_flags_a_session_whose_bits_differ():
    model = models.chain_model(1, width=4)
    doubled = models.chain_model(1, width=4)
    doubled.graph.node.append(onnx.helper.make_node("Add", ["x1", "x1"], ["x1_doubled"]))
    doubled.graph.output[0].name = "x1_doubled"
    feeds = {"x0": np.linspace(-1, 1, 4, dtype=np.float32)}
    sessions = {"base": session(model), "same": session(model), "other": session(doubled)}
    medians, same, rounds = harness.race(sessions, feeds, budget=0.0, min_rounds=2)
    assert same == {"base": True, "same": True, "other": False}
    assert rounds == 2 and set(medians) == set(sessions) and all(m > 0 for m in medians.values())


@pytest.mark.benchmark
def test_quick_run_writes_every_section(tmp_path):
    out, profile = tmp_path / "B.md", tmp_path / "profile.txt"
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench", "--quick", "--out", str(out), "--profile", str(profile)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    for title in ("## Machine and versions", "## Targets", "## 1. Op level", "## 2. Pass throughput",
                  "## 3. Memory", "## 4. Whole models", "## Other benchmarks"):
        assert title in text
    assert "`python -m tools.bench --quick`" in text and "`python -m tools.bench_fuse`" in text
    assert "**outputs differ**" not in text and "| **no** |" not in text
    assert "cumulative" in profile.read_text()
    plot = tmp_path / "benchmarks" / "op_ratio.png"
    if importlib.util.find_spec("matplotlib"):
        assert 0 < plot.stat().st_size < 100_000
    else:
        assert not plot.exists() and "matplotlib is not installed" in text


def test_write_report_keeps_the_sections_of_other_tools(tmp_path):
    out = tmp_path / "B.md"
    out.write_text("# Benchmarks\n\nold intro\n\n## 1. Op level\n\nold figures\n\n## Fusion\n\nfused figures\n")
    harness.write_report(out, "# Benchmarks\n\nnew intro\n\n## 1. Op level\n\nnew figures\n")
    assert out.read_text() == ("# Benchmarks\n\nnew intro\n\n## 1. Op level\n\nnew figures\n"
                               "\n## Fusion\n\nfused figures\n")
    harness.write_report(out, "# Benchmarks\n\n## 1. Op level\n\nnewer\n")
    assert out.read_text().count("## Fusion") == 1 and "new figures" not in out.read_text()


def test_same_outputs_needs_every_output_and_every_bit():
    a, b = np.array([0.0, 1.0], np.float32), np.array(7, np.uint8)
    assert harness.same_outputs([a, b], [a.copy(), b.copy()])
    assert not harness.same_outputs([a, b], [a])  # a lost output
    assert not harness.same_outputs([a], [np.array([-0.0, 1.0], np.float32)])  # -0.0 is not 0.0
    assert not harness.same_outputs([a], [a.astype(np.float64)])


def test_write_report_replaces_a_section_without_a_head_in_place(tmp_path):
    """How tools.bench_fuse writes its ``## Fusion`` section."""
    out = tmp_path / "B.md"
    harness.write_report(out, "## Fusion\n\nfirst\n")
    assert out.read_text() == "# Benchmarks\n\n## Fusion\n\nfirst\n"
    out.write_text("# Benchmarks\n\nintro\n\n## 1. Op level\n\nops\n\n## Fusion\n\nfirst\n\n## Other\n\nother\n")
    harness.write_report(out, "## Fusion\n\nsecond\n")
    assert out.read_text() == ("# Benchmarks\n\nintro\n\n## 1. Op level\n\nops\n\n## Fusion\n\nsecond\n"
                               "\n## Other\n\nother\n")


@pytest.mark.benchmark
def test_quick_runtime_matrix_on_onnxruntime_and_reference(tmp_path):
    out = tmp_path / "RUNTIMES.md"
    done = subprocess.run(
        [sys.executable, "-m", "tools.runtimes", "--quick", "--out", str(out),
         "--runtime", "onnxruntime", "--runtime", "reference"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert done.returncode == 0, done.stderr  # 1 would mean a difference no known difference explains
    text = out.read_text()
    assert "`python -m tools.runtimes --quick`" in text and "UNKNOWN" not in text
    assert "| `onnxruntime` | " in text and "| `reference` | " in text
    # ORT is the contract: no cell of its section is bold (a shortfall); onnx.reference's native node raises on empty.
    ort = text.split("### onnxruntime")[1].split("### reference")[0]
    assert "| 21 | native |" in ort and "**" not in ort
    assert "does not run: ValueError: zero-size array" in text.split("### reference")[1]
