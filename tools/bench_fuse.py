"""Benchmark of the fusion pass (issue 5): what fusing gives back on ONNX Runtime, and what it costs.

Run from the repository root::

    python -m tools.bench_fuse [--quick] [--out docs/BENCHMARKS.md]

What it measures:

1. Latency on ORT (CPU, one intra-op thread, all graph optimisations) of each sample model of
   ``models/`` in five forms: the original, ONNX's function body inlined by ``onnx.inliner``,
   dql_pass's expansion (quantizelinear, inline), and each of those two fused back by
   :func:`dql_pass.fuse`. The forms run interleaved by :func:`tools.harness.race`: round robin, the
   first one rotating every round, each sample repeating a run as often as the original's takes
   about 2 ms; the table gives medians and ratios to the original. Every form's outputs are
   compared bit for bit with the original's.
2. ORT's ``DynamicQuantizeMatMul`` fusion: the nodes of that type in the graph ORT optimises for
   the original, the expansion and the fused models (``OnnxRuntime.optimized``, one thread, all
   optimizations, as the timed sessions run).
3. The pass itself: in-process ``dql_pass.fuse`` on a chain of N inlined DQL sites, best of three.

The results replace the ``## Fusion`` section of ``--out`` through :func:`tools.harness.write_report`
(added at the end if missing; the file is created if absent); the rest of the file is left as it is. Scratch files
live in a temp dir.
``--quick`` is a smoke run of a few seconds.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

import dql_pass
from dql_pass import runtimes
from tools import harness
from tools.models import inline_onnx_function, random_feeds

logger = logging.getLogger("bench_fuse")

SECTION = "## Fusion"
BATCH = 32  # the size of every symbolic dimension
FORMS = ("original", "ONNX body", "expanded", "fused from ONNX body", "fused from expanded")


@dataclasses.dataclass(frozen=True)
class Config:
    budget: float  # seconds of interleaved rounds per model
    min_rounds: int
    chains: tuple[int, ...]


CONFIGS = {"full": Config(budget=6.0, min_rounds=30, chains=(100, 1000)), "quick": Config(0.5, 5, (50,))}


def forms(original: onnx.ModelProto) -> dict[str, onnx.ModelProto]:
    """The five forms of a model, in the order of FORMS."""
    body, expanded = inline_onnx_function(original), dql_pass.expand(original)[0]
    models = (original, body, expanded, dql_pass.fuse(body)[0], dql_pass.fuse(expanded)[0])
    return dict(zip(FORMS, models))


def dynamic_quantize_matmuls(model: onnx.ModelProto) -> int:
    """``DynamicQuantizeMatMul`` nodes in the graph ORT optimises ``model`` into, as the timed sessions run it."""
    return sum(node.op_type == "DynamicQuantizeMatMul"
               for node in runtimes.get("onnxruntime").optimized(model).graph.node)


def chain(sites: int) -> onnx.ModelProto:
    """x -> (DQL -> dequantize -> Relu) x sites: a graph with ``sites`` DQL and 6 nodes each."""
    nodes, value = [], "x"
    for i in range(sites):
        nodes += [
            helper.make_node("DynamicQuantizeLinear", [value], [f"q{i}", f"s{i}", f"z{i}"], name=f"dql{i}"),
            helper.make_node("Cast", [f"q{i}"], [f"qf{i}"], to=TensorProto.FLOAT),
            helper.make_node("Cast", [f"z{i}"], [f"zf{i}"], to=TensorProto.FLOAT),
            helper.make_node("Sub", [f"qf{i}", f"zf{i}"], [f"c{i}"]),
            helper.make_node("Mul", [f"c{i}", f"s{i}"], [f"d{i}"]),
            helper.make_node("Relu", [f"d{i}"], [f"r{i}"]),
        ]
        value = f"r{i}"
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info(value, TensorProto.FLOAT, [4, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.2f} s"


def bench_models(config: Config) -> tuple[list[str], list[str]]:
    """Latency table rows and DynamicQuantizeMatMul rows for every sample model."""
    latency, matmuls = [], []
    rng = np.random.default_rng(0)
    runtime = runtimes.get("onnxruntime")
    for path in sorted((harness.REPO / "models").glob("*.onnx")):
        original = onnx.load(path)
        versions = forms(original)
        data = random_feeds(original, rng, size=BATCH)
        sessions = {name: runtime.load(model, threads=1, optimize="all") for name, model in versions.items()}
        medians, same, _ = harness.race(sessions, data, config.budget, config.min_rounds)  # "original" first
        wrong = [name for name, ok in same.items() if not ok]
        base = medians["original"]
        cells = [f"{_ms(m)} ({m / base:.2f})" for m in medians.values()]
        latency.append(f"| {path.name} | " + " | ".join(cells) + f" | {', '.join(wrong) or 'all'} |")
        counts = [dynamic_quantize_matmuls(versions[name])
                  for name in ("original", "expanded", "fused from expanded", "fused from ONNX body")]
        matmuls.append(f"| {path.name} | " + " | ".join(map(str, counts)) + " |")
        logger.info("%s: %s", path.name, ", ".join(f"{n} {m / base:.2f}" for n, m in medians.items()))
    return latency, matmuls


def bench_pass(config: Config) -> list[str]:
    rows = []
    for sites in config.chains:
        body = inline_onnx_function(chain(sites))
        seconds = []
        for _ in range(3):
            began = time.perf_counter()
            _, report = dql_pass.fuse(body)
            seconds.append(time.perf_counter() - began)
            assert report.total == sites, report
        best = min(seconds)
        rows.append(f"| {sites} | {len(body.graph.node)} | {best:.2f} s | {len(body.graph.node) / best:,.0f} |")
    return rows


def render(config: Config, mode: str, latency: list[str], matmuls: list[str], passes: list[str]) -> str:
    header = list(FORMS)
    lines = [
        SECTION,
        "",
        f"Written by `python -m tools.bench_fuse{' --quick' if mode == 'quick' else ''}` "
        f"(onnxruntime {harness.version('onnxruntime')}, onnx {onnx.__version__}); "
        "regenerate it with the same command. "
        + ("**A `--quick` smoke run: the figures are not meaningful.** " if mode == "quick" else "")
        + "ORT CPU, one intra-op thread, all graph optimisations, symbolic dimensions of size "
        f"{BATCH}. *ONNX body* is every DQL inlined by `onnx.inliner` (`inline_schema_functions=True`), "
        "*expanded* is `dql_pass.expand` (quantizelinear, inline), *fused* is `dql_pass.fuse` of either. "
        f"The forms run interleaved round robin for {config.budget:g} s per model (at least "
        f"{config.min_rounds} rounds); each cell is the median latency and, in brackets, its ratio "
        "to the original.",
        "",
        "| model | " + " | ".join(header) + " | bit-identical to the original |",
        "|---|" + "---|" * (len(header) + 1),
        *latency,
        "",
        "`DynamicQuantizeMatMul` nodes in the graph ORT optimises (`SessionOptions.optimized_model_filepath`): "
        "ORT fuses DQL + MatMulInteger + Cast + Mul into one only when a real DQL node is there.",
        "",
        "| model | original | expanded | fused from expanded | fused from ONNX body |",
        "|---|---|---|---|---|",
        *matmuls,
        "",
        "The pass itself: in-process `dql_pass.fuse` of a chain of DQL sites (each followed by a "
        "dequantization and a Relu) inlined by `onnx.inliner`, best of three runs.",
        "",
        "| sites | nodes | time | nodes per second |",
        "|---|---|---|---|",
        *passes,
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return harness.section_main(
        __doc__.split("\n\n")[0], logger, CONFIGS,
        lambda config, mode: render(config, mode, *bench_models(config), bench_pass(config)), argv,
    )


if __name__ == "__main__":
    sys.exit(main())
