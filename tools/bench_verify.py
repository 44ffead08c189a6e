"""Time ``dql-pass verify`` on a 24-site transformer-like model (issue 3: at most 30 s on 2 cores).

Run from the repository root::

    python tools/bench_verify.py [--layers 6] [--hidden 384] [--runs 3]

What it does:

1. Builds a float BERT-like encoder with onnx.helper: int64 ``input_ids`` and ``attention_mask`` of
   symbolic shape ``[batch, sequence]``, a word embedding, then per layer one fused QKV MatMul,
   attention, an output MatMul, LayerNormalization and an Erf GELU feed-forward of two MatMuls:
   four weight MatMuls per layer, so 6 layers give 24 DynamicQuantizeLinear sites.
2. Quantizes it with ``onnxruntime.quantization.quantize_dynamic`` (weight MatMuls only, uint8)
   in a temp dir and expands it with ``dql-pass expand`` (variant and mode selectable).
3. Times the whole ``python -m dql_pass verify ORIGINAL REWRITTEN`` process (interpreter start,
   imports, checker, site and model level) ``--runs`` times and prints the median; each run must
   exit 0. Nothing is left on disk.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, HEAD_SIZE, FFN_FACTOR, OPSET = 1000, 64, 4, 17
TARGET_SECONDS = 30.0


def encoder(layers: int, hidden: int, seed: int = 0) -> tuple[onnx.ModelProto, list[str]]:
    """The float model, and the names of its activation-by-activation MatMuls (not to be quantized)."""
    rng = np.random.default_rng(seed)
    heads = hidden // HEAD_SIZE
    inits = [
        numpy_helper.from_array(np.array([0, 0, heads, HEAD_SIZE], np.int64), "heads_shape"),
        numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "hidden_shape"),
        numpy_helper.from_array(np.array([1, 2], np.int64), "mask_axes"),
        numpy_helper.from_array(np.array(HEAD_SIZE**-0.5, np.float32), "attention_scale"),
        numpy_helper.from_array(np.array(-10000.0, np.float32), "mask_value"),
        numpy_helper.from_array(np.array(2**-0.5, np.float32), "inv_sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes: list[onnx.NodeProto] = []
    activation_matmuls: list[str] = []

    def param(name: str, *dims: int, std: float = 0.02, mean: float = 0.0) -> str:
        inits.append(numpy_helper.from_array(rng.normal(mean, std, dims).astype(np.float32), name))
        return name

    def op(op_type: str, inputs: list[str], output: str, outputs: int = 1, **attrs: object) -> str:
        names = [output] if outputs == 1 else [f"{output}.{i}" for i in range(outputs)]
        nodes.append(helper.make_node(op_type, inputs, names, name=output, **attrs))
        return output

    def dense(x: str, name: str, n_in: int, n_out: int) -> str:
        y = op("MatMul", [x, param(f"{name}.weight", n_in, n_out)], f"{name}.matmul")
        return op("Add", [y, param(f"{name}.bias", n_out)], f"{name}.out")

    def norm(x: str, name: str) -> str:
        scale, bias = param(f"{name}.gamma", hidden, std=0.1, mean=1.0), param(f"{name}.beta", hidden)
        return op("LayerNormalization", [x, scale, bias], f"{name}.out", axis=-1, epsilon=1e-12)

    embedded = op("Gather", [param("word_embeddings", VOCAB, hidden), "input_ids"], "embedded")
    x = norm(embedded, "embeddings.ln")
    mask = op("Cast", ["attention_mask"], "mask.float", to=TensorProto.FLOAT)
    mask = op("Mul", [op("Sub", ["one", mask], "mask.inverted"), "mask_value"], "mask.additive")
    mask = op("Unsqueeze", [mask, "mask_axes"], "mask.broadcast")
    for layer in range(layers):
        p = f"layer{layer}"
        # Split-17 cuts into equal parts, one per output.
        qkv = op("Split", [dense(x, f"{p}.qkv", hidden, 3 * hidden)], f"{p}.split", outputs=3, axis=-1)
        q, k, v = (op("Reshape", [f"{qkv}.{i}", "heads_shape"], f"{p}.{part}.heads") for i, part in enumerate("qkv"))
        q = op("Transpose", [q], f"{p}.q", perm=[0, 2, 1, 3])
        k = op("Transpose", [k], f"{p}.k", perm=[0, 2, 3, 1])
        v = op("Transpose", [v], f"{p}.v", perm=[0, 2, 1, 3])
        scores = op("Mul", [op("MatMul", [q, k], f"{p}.qk"), "attention_scale"], f"{p}.scores")
        scores = op("Add", [scores, mask], f"{p}.scores.masked")
        context = op("MatMul", [op("Softmax", [scores], f"{p}.probs", axis=-1), v], f"{p}.context")
        activation_matmuls += [f"{p}.qk", f"{p}.context"]
        context = op("Transpose", [context], f"{p}.context.t", perm=[0, 2, 1, 3])
        context = op("Reshape", [context, "hidden_shape"], f"{p}.context.merged")
        attended = norm(op("Add", [x, dense(context, f"{p}.output", hidden, hidden)], f"{p}.residual1"), f"{p}.ln1")
        up = dense(attended, f"{p}.ffn.up", hidden, FFN_FACTOR * hidden)
        erf = op("Erf", [op("Mul", [up, "inv_sqrt2"], f"{p}.gelu.scaled")], f"{p}.gelu.erf")
        gelu = op("Mul", [op("Mul", [up, "half"], f"{p}.gelu.half"), op("Add", [erf, "one"], f"{p}.gelu.shift")], f"{p}.gelu")
        down = dense(gelu, f"{p}.ffn.down", FFN_FACTOR * hidden, hidden)
        x = norm(op("Add", [attended, down], f"{p}.residual2"), f"{p}.ln2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))
    graph = helper.make_graph(
        nodes,
        "bench_verify_encoder",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"]) for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model, activation_matmuls


def quantize(model: onnx.ModelProto, exclude: list[str], folder: Path) -> Path:
    """``quantize_dynamic`` of the weight MatMuls (uint8), saved as ``folder/encoder_dynamic.onnx``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source, target = folder / "encoder.float.onnx", folder / "encoder_dynamic.onnx"
    onnx.save(model, source)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_dynamic advises pre-processing on the root logger; not needed here
    try:
        quantize_dynamic(source, target, op_types_to_quantize=["MatMul"], nodes_to_exclude=exclude,
                         weight_type=QuantType.QUInt8)
    finally:
        root.setLevel(level)
    return target


def _dql_pass(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dql_pass", *args], capture_output=True, text=True)
    return time.perf_counter() - start, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", default="quantizelinear")
    parser.add_argument("--mode", default="inline")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_verify.") as tmp:
        folder = Path(tmp)
        original = quantize(*encoder(args.layers, args.hidden), folder)
        sites = sum(n.op_type == "DynamicQuantizeLinear" for n in onnx.load(original).graph.node)
        rewritten = folder / "encoder_expanded.onnx"
        _, done = _dql_pass("expand", str(original), "-o", str(rewritten), "--variant", args.variant, "--mode", args.mode)
        if done.returncode:
            raise SystemExit(f"expand failed: {done.stderr.strip()}")
        size = original.stat().st_size / 2**20
        print(f"model: {args.layers} layers, hidden {args.hidden}, {sites} DQL sites, {size:.1f} MiB; "
              f"rewrite: {args.variant}/{args.mode}")
        times = []
        for run in range(args.runs):
            seconds, done = _dql_pass("verify", str(original), str(rewritten))
            if done.returncode:
                raise SystemExit(f"verify exited {done.returncode}:\n{done.stdout}{done.stderr}")
            times.append(seconds)
            print(f"  run {run + 1}: {seconds:.2f} s  ({done.stdout.strip().splitlines()[-1]})")
        median = statistics.median(times)
        verdict = "met" if median <= TARGET_SECONDS else "NOT met"
        print(f"dql-pass verify, whole process: median {median:.2f} s over {args.runs} runs "
              f"(target <= {TARGET_SECONDS:.0f} s: {verdict})")
    return 0 if median <= TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
