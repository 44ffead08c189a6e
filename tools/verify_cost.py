"""Peak memory and wall time of whole ``dql-pass verify`` processes on large models, side by side with
another checkout.

Run from the repository root::

    python -m tools.verify_cost operand [--k 20000] [--n 2000] [--runs 1] [--before FOLDER]
    python -m tools.verify_cost conv [--side 1024] [--sites 120] [--runs 1] [--before FOLDER] [--profile]

What it does (every model is made in a temporary folder, nothing is left on disk):

- ``operand``: MatMulInteger whose operands are both graph inputs, a uint8 [4, K] and b int8
  [K, N] (K x N bytes), lowered with ``dql-pass lower``; then ``dql-pass verify`` of the pair. The
  figure that matters is the peak RSS over the size of b.
- ``conv``: a stand-in for a background-removal model: a float conv net on 1 x 3 x SIDE x SIDE
  (a strided stem, then stages of 3x3 convolutions with ReLU at halving resolutions, back up by
  Resize), quantized by ORT's ``quantize_dynamic`` (op type Conv: a DynamicQuantizeLinear and a
  ConvInteger per conv, ``--sites`` of them), lowered; then one ORT run of each model (the floor a
  model-level check is measured against) and ``dql-pass verify`` of the pair. ``--profile`` runs
  verify once in this process under cProfile and prints where its time goes.

``--before FOLDER`` (a folder holding another dql_pass, e.g. ``git archive BASE dql_pass | tar -x
-C FOLDER``) runs that version's verify too, the rounds alternating. Each verify is a fresh process
measured by ``os.wait4`` (peak RSS: ``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tools import harness, models


def operand_model(folder: Path, k: int, n: int) -> Path:
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mmi")], "graph_input_operand",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, k]),
         helper.make_tensor_value_info("b", TensorProto.INT8, [k, n])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [4, n])])
    path = folder / "operand.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def conv_model(folder: Path, side: int, sites: int) -> Path:
    """The float conv net, quantized: ``sites`` convolutions, each a DQL and a ConvInteger after quantization."""
    rng = np.random.default_rng(0)
    nodes, weights = [], []
    stages = [(2, 16), (4, 24), (8, 32), (16, 48), (32, 64)]  # (downsampling, channels)
    per_stage = max(1, (sites - 1) // len(stages))
    current, channels, count = "image", 3, 0

    def conv(source: str, inputs: int, outputs: int, stride: int) -> str:
        nonlocal count
        name = f"conv{count}"
        w = (rng.standard_normal((outputs, inputs, 3, 3)) * (2 / (9 * inputs)) ** 0.5).astype(np.float32)
        weights.extend([numpy_helper.from_array(w, f"{name}_w"),
                        numpy_helper.from_array(np.zeros(outputs, np.float32), f"{name}_b")])
        nodes.append(helper.make_node("Conv", [source, f"{name}_w", f"{name}_b"], [f"{name}_out"], name=name,
                                      pads=[1, 1, 1, 1], strides=[stride, stride]))
        nodes.append(helper.make_node("Relu", [f"{name}_out"], [f"{name}_relu"]))
        count += 1
        return f"{name}_relu"

    for _, width in stages:
        current = conv(current, channels, width, 2)
        channels = width
        for _ in range(per_stage - 1):
            current = conv(current, channels, channels, 1)
    current = conv(current, channels, 1, 1)
    scales = numpy_helper.from_array(np.array([1, 1, 2 ** len(stages), 2 ** len(stages)], np.float32), "scales")
    nodes.append(helper.make_node("Resize", [current, "", "scales"], ["mask"], mode="nearest"))
    graph = helper.make_graph(nodes, "conv_stand_in",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, side, side])],
                              [helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 1, side, side])],
                              [*weights, scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return models.quantize(model, folder, "conv.onnx", ("Conv",))


def _one_run(path: Path) -> float:
    """Seconds of one ORT run ("basic", all threads) of the model at ``path`` on a random input."""
    from dql_pass import runtimes

    session = runtimes.get("onnxruntime").load(path, optimize="basic")
    feeds = {"image": np.random.default_rng(1).standard_normal((1, 3, *[int(d) for d in _side(path)]), np.float32)}
    began = time.perf_counter()
    session.run(feeds)
    return time.perf_counter() - began


def _side(path: Path) -> tuple[int, int]:
    dims = onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    return dims[2].dim_value, dims[3].dim_value


def compare(original: Path, rewritten: Path, runs: int, before: Path | None) -> None:
    trees = {"after": harness.REPO} | ({"before": before} if before else {})
    results: dict[str, list[tuple[float, float, str, float]]] = {name: [] for name in trees}
    for run in range(runs):
        order = list(trees)[run % len(trees):] + list(trees)[:run % len(trees)]
        for name in order:
            results[name].append(harness.cli_process(trees[name], "verify", os.fspath(original), os.fspath(rewritten),
                                                      "-q", codes=(0, 1)))
            wall, peak, _, cpu = results[name][-1]
            print(f"  run {run + 1}, {name}: {wall:.1f} s, CPU {cpu:.1f} s, peak RSS {peak:.0f} MiB, load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    for name, done in results.items():
        print(f"{name}: wall median {statistics.median(r[0] for r in done):.1f} s, CPU median "
              f"{statistics.median(r[3] for r in done):.1f} s, peak RSS max "
              f"{max(r[1] for r in done):.0f} MiB; {done[-1][2][:140]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("operand", "conv"))
    parser.add_argument("--k", type=int, default=20000)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--side", type=int, default=1024)
    parser.add_argument("--sites", type=int, default=120)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--before", type=Path)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="verify_cost.") as tmp:
        folder = Path(tmp)
        if args.what == "operand":
            original = operand_model(folder, args.k, args.n)
            print(f"operand b: {args.k * args.n / 2**20:.0f} MiB int8")
        else:
            original = conv_model(folder, args.side, args.sites)
            print(f"conv net on 1x3x{args.side}x{args.side}: {models.dql_count(onnx.load(original))} DQL sites")
        rewritten = folder / "lowered.onnx"
        subprocess.run([sys.executable, "-m", "dql_pass", "lower", os.fspath(original), "-o", os.fspath(rewritten),
                        "-q"], check=True, env={**os.environ, "PYTHONPATH": os.fspath(harness.REPO)})
        if args.what == "conv":
            print(f"one ORT run: ORIGINAL {_one_run(original):.2f} s, lowered {_one_run(rewritten):.2f} s")
        if args.profile:
            import dql_pass

            profile = cProfile.Profile()
            profile.runcall(dql_pass.verify, original, rewritten)
            pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
        compare(original, rewritten, args.runs, args.before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
