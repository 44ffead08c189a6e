"""lower's weight forms: ``integer`` keeps constant int8/uint8 weights in the
file as they are, cast and shifted in the graph; ``float`` stores them cast and shifted as float32.
Both are exact, so their outputs are the same bits; the default is the target's, one attribute of
its adapter."""

from __future__ import annotations

from pathlib import Path


import numpy as np
import onnx
import pytest
from helpers import MODELS, assert_outputs_bits_equal, digest, sample
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import reference, runtimes, variants
from dql_pass.cli import main
from dql_pass.lowering import LowerQuantizationPass
from dql_pass.runtimes import web
from tools import models

ORT = runtimes.get("onnxruntime")
WEIGHTED = ("conv_dynamic", "mlp_dynamic")  # the sample models whose integer ops have constant weights
INTEGER_OPS = ("MatMulInteger", "ConvInteger")
needs_browser = pytest.mark.skipif(web.missing() is not None,
                                   reason=f"the web runtimes are not set up: {web.missing()}")


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The constant weights of the model's integer products, by name."""
    initializers = {t.name: t for t in model.graph.initializer}
    return {n.input[1]: numpy_helper.to_array(initializers[n.input[1]])
            for n in model.graph.node if n.op_type in INTEGER_OPS and n.input[1] in initializers}


def _feed_sets(model: onnx.ModelProto, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Random, all-zero and ±1000 float inputs (the last drive every DQL output to 0 or 255)."""
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else 2 for d in v.type.tensor_type.shape.dim]
              for v in model.graph.input}
    makers = (lambda s: rng.standard_normal(s), np.zeros, lambda s: np.where(rng.random(s) < 0.5, -1e3, 1e3))
    return [{name: make(shape).astype(np.float32) for name, shape in shapes.items()} for make in makers]


def _lower(model: onnx.ModelProto, weights: str | None, target: str | None = None) -> onnx.ModelProto:
    lowered, report = dql_pass.lower(model, target=target, weights=weights)
    assert not report.left_alone, report.format()
    return lowered


@pytest.fixture(scope="module")
def per_channel(tmp_path_factory) -> onnx.ModelProto:
    """quantize_dynamic's uint8 CNN per channel: its head's zero points lie per column of B, ten values."""
    folder = tmp_path_factory.mktemp("per_channel")
    return onnx.load(models.quantize(models.cnn_model(), folder, "cnn.onnx", ("Conv", "MatMul"), weight_type="QUInt8",
                                     per_channel=True))


@pytest.mark.parametrize("name", [*WEIGHTED, "per_channel"])
@pytest.mark.parametrize("target", [None, "webgpu"])
def test_integer_weights_give_the_float_weights_outputs_bit_for_bit(name, target, request):
    original = request.getfixturevalue(name) if name == "per_channel" else sample(name)
    integer, floating = _lower(original, "integer", target), _lower(original, "float", target)
    assert not {"MatMulInteger", "ConvInteger"} & {n.op_type for n in integer.graph.node}
    before = ORT.load(original, threads=1, optimize="none")
    # Folded at load (all) and run as written (none): both are the float lowering's bits, and ORT's.
    sessions = [ORT.load(m, threads=1, optimize=o) for m in (integer, floating) for o in ("all", "none")]
    for feeds in _feed_sets(original, np.random.default_rng(0)):
        expected = before.run(feeds)
        for session in sessions:
            assert_outputs_bits_equal(session.run(feeds), expected)


@pytest.mark.parametrize("name", WEIGHTED)
def test_integer_weights_are_verified(name, tmp_path):
    lowered = tmp_path / "lowered.onnx"
    assert main(["-q", "lower", str(MODELS / f"{name}.onnx"), "-o", str(lowered), "--weights", "integer",
                 "--verify"]) == 0


@pytest.mark.parametrize("name", WEIGHTED)
def test_integer_weights_stay_in_the_file_as_they_are(name, tmp_path):
    """The weights are the original's tensors, byte for byte, and the file is the original's size
    but for the nodes and the shared constants lower adds (the DQL expansion's: lean's tables are a
    few KB a model, which on these small models outweigh the weights); a weight stored as float32
    is four times its size and fails."""
    source = MODELS / f"{name}.onnx"
    original, out = onnx.load(source), tmp_path / "lowered.onnx"
    dql_pass.lower_file(source, out, target="webgpu")  # not the CLI: it would load the result in a browser
    lowered = onnx.load(out)
    kept = {t.name: numpy_helper.to_array(t) for t in lowered.graph.initializer}
    weights = _weights(original)
    for weight, array in weights.items():
        assert (weight in kept and kept[weight].dtype == array.dtype
                and kept[weight].tobytes() == array.tobytes()), weight

    def tensor_bytes(path: Path) -> int:  # the file but for nodes, value_info, names and the expansion's constants
        model = onnx.load(path)
        added = sum(t.ByteSize() for t in model.graph.initializer if t.name.startswith("dql_pass_"))
        del model.graph.initializer[:]
        return path.stat().st_size - model.ByteSize() - added

    stored = tensor_bytes(out)
    assert stored <= 1.05 * tensor_bytes(source), (stored, tensor_bytes(source))
    assert stored < sum(a.size for a in weights.values()) * 2  # float32 would be 4 bytes an element


def _reduction_past_the_bound(op_type: str, w_zp: np.ndarray) -> tuple[onnx.ModelProto, np.ndarray]:
    """MatMulInteger or ConvInteger whose int8 weights sit mostly at -128 against a zero point of
    127 (255 * 255 per term) over more terms than 2^24 allows, so lower cuts the reduction."""
    rng = np.random.default_rng(5)
    shape = (600, 3) if op_type == "MatMulInteger" else (2, 40, 3, 3)  # K = 600; 40 channels x 9 = 360 terms
    w = np.full(shape, -128, np.int8)
    w[rng.random(shape) < 0.1] = 127
    inputs = ["a", "w", "a_zp", "w_zp"]
    attributes = {} if op_type == "MatMulInteger" else {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    graph = helper.make_graph(
        [helper.make_node(op_type, inputs, ["y"], **attributes)], "cut",
        [helper.make_tensor_value_info(n, TensorProto.UINT8, None) for n in ("a", "a_zp")],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w_zp, "w_zp")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), w


@pytest.mark.parametrize("op_type, w_zp", [
    ("MatMulInteger", np.array(127, np.int8)),
    ("MatMulInteger", np.array([127, -128, 5], np.int8)),  # per column
    ("ConvInteger", np.array([127, -3], np.int8)),  # per output channel
])
def test_a_cut_reduction_over_integer_weights_is_exact(op_type, w_zp):
    model, w = _reduction_past_the_bound(op_type, w_zp)
    rng = np.random.default_rng(6)
    a = rng.integers(200, 256, (4, 600) if op_type == "MatMulInteger" else (1, 40, 5, 4)).astype(np.uint8)
    feeds = {"a": a, "a_zp": np.array(0, np.uint8)}
    if op_type == "MatMulInteger":
        expected = reference.matmul_integer(a, w, feeds["a_zp"], w_zp)
    else:
        expected = reference.conv_integer(a, w, feeds["a_zp"], w_zp, pads=[1, 1, 1, 1])
    assert np.abs(expected).max() > 2**24
    outputs = []
    for weights in variants.WEIGHTS:
        lowered, report = dql_pass.lower(model, weights=weights)
        (item,) = report.lowered
        assert item.proof.startswith("chunked into"), item.proof
        assert ("w" in {t.name for t in lowered.graph.initializer}) == (weights == "integer")
        outputs.append(ORT.load(lowered, threads=1, optimize="all").run(feeds))
        assert_outputs_bits_equal(outputs[-1], [expected])
    assert_outputs_bits_equal(*outputs)


def test_the_default_weights_are_the_targets_and_one_attribute_of_its_adapter(monkeypatch):
    assert LowerQuantizationPass().weights == "float"
    for name, runtime in runtimes.RUNTIMES.items():
        assert LowerQuantizationPass(name).weights == runtime.weights
    assert {name: runtimes.get(name).weights for name in ("webgpu", "wasm", "mnn", "onnxruntime", "openvino")} == {
        "webgpu": "integer", "wasm": "integer", "mnn": "float", "onnxruntime": "float", "openvino": "float"}
    # What an adapter declares is all it takes.
    monkeypatch.setattr(type(runtimes.get("tract")), "weights", "integer")
    kept = lambda target, weights=None: "W_quantized" in {  # noqa: E731
        t.name for t in dql_pass.lower(sample("relu_dql"), target=target, weights=weights)[0].graph.initializer}
    assert (kept("tract") and kept("webgpu") and kept("wasm") and kept(None, "integer")
            and kept("onnxruntime", "integer"))
    assert not kept(None) and not kept("onnxruntime") and not kept("webgpu", "float")


def test_the_report_says_which_weights(tmp_path, capsys):
    assert main(["lower", str(MODELS / "relu_dql.onnx"), "-o", str(tmp_path / "out.onnx"), "--weights", "integer",
                 "--json", str(tmp_path / "report.json")]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("(weights integer)")
    assert '"weights": "integer"' in (tmp_path / "report.json").read_text()


def test_an_unknown_weights_value_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "out.onnx"
    assert main(["lower", str(MODELS / "relu_dql.onnx"), "-o", str(out), "--weights", "int4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--weights" in err and "'int4'" in err and "Traceback" not in err, err
    assert not out.exists()
    with pytest.raises(dql_pass.InputError, match=r"^unknown weights 'int4'; choose from integer, float$"):
        dql_pass.lower(sample("relu_dql"), weights="int4")


@needs_browser
@pytest.mark.web
def test_integer_weights_run_on_webgpu_exactly_and_wholly_there(tmp_path):
    source, lowered = MODELS / "conv_dynamic.onnx", tmp_path / "lowered.onnx"
    before = digest(source)
    assert main(["-q", "lower", str(source), "-o", str(lowered), "--target", "webgpu"]) == 0
    report = dql_pass.verify(source, lowered, runtime="webgpu", samples=1)
    assert report.verdict == "PASS", report.format()
    placement = runtimes.get("webgpu").placement(lowered)
    assert list(placement) == ["WebGpuExecutionProvider"], placement
    assert digest(source) == before


@needs_browser
@pytest.mark.web
def test_a_lowered_transformer_leaves_no_quantization_op_on_the_wasm_cpu(tmp_path):
    """quantize_dynamic puts a small transformer's integer ops on the wasm CPU;
    lowered for webgpu, with its weights integer, none of them, nor Round or Sign, is left there."""
    tiny = models.TransformerShape(layers=1, hidden=32, heads=2, intermediate=64, seq=8)
    original = models.quantize(models.minilm_model(tiny), tmp_path, "t.onnx")
    lowered = tmp_path / "lowered.onnx"
    dql_pass.lower_file(original, lowered, target="webgpu")
    banned = {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "QuantizeLinear", "DequantizeLinear", "Round",
              "Sign"}

    def on_cpu(path: Path) -> set[str]:
        placement = runtimes.get("webgpu").placement(path)
        return {node.split()[0] for node in placement.get("CPUExecutionProvider", [])} & banned

    assert on_cpu(original) == {"DynamicQuantizeLinear", "MatMulInteger"}  # the check can fail
    assert on_cpu(lowered) == set()
