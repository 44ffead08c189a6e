"""Benchmark of the lowering pass (issue 12): a lowered model's time against the original's on ORT.

Run from the repository root::

    python -m tools.bench_lower [--quick] [--out docs/BENCHMARKS.md]

What it measures:

1. Latency on ORT (CPU, one intra-op thread) of each model in two forms, the ``quantize_dynamic``
   original and :func:`dql_pass.lower` of it (no target: the arithmetic expansion), run
   interleaved by :func:`tools.harness.race`; the table gives medians and the lowered/original
   ratio, with all graph optimisations (as users run) and with "basic" (every kernel as written).
   The models: the quantized MiniLM-sized transformer of :mod:`tools.models` (target: at most
   1.6x), the CNN of :func:`tools.models.cnn_model`, and the sample models holding MatMulInteger
   or ConvInteger.
2. Whether the lowered outputs equal the original's bit for bit, at "basic": at "all", ORT fuses
   float ops (LayerNormalization, GELU) differently in the two forms, and changes the original's
   own bits.
3. Where the time goes on the transformer: ORT's profile (one thread, all optimisations), summed
   by op type, for both forms.

The results replace the ``## Lowering`` section of ``--out`` through :func:`tools.harness.write_report`.
Scratch files live in a temp dir. ``--quick`` is a smoke run of a few seconds.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

import dql_pass
from dql_pass import runtimes
from tools import harness, models

logger = logging.getLogger("bench_lower")

SECTION = "## Lowering"
TARGET = 1.6  # lowered / original on the transformer, all optimisations
LEVELS = ("all", "basic")


@dataclasses.dataclass(frozen=True)
class Config:
    budget: float  # seconds of interleaved rounds per model and level
    min_rounds: int
    transformer: models.TransformerShape
    profile_runs: int


CONFIGS = {
    "full": Config(budget=6.0, min_rounds=30, transformer=models.MINILM, profile_runs=50),
    "quick": Config(0.5, 5, models.TransformerShape(layers=1, hidden=64, heads=2, intermediate=128, seq=16), 3),
}


def _models(config: Config, folder: Path) -> dict[str, tuple[onnx.ModelProto, int]]:
    """Each benchmark model with the size of its symbolic dimensions."""
    built = {
        "transformer": (models.quantize(models.minilm_model(config.transformer), folder, "transformer.onnx"), 1),
        "cnn": (models.quantize(models.cnn_model(channels=16, side=32), folder, "cnn.onnx", ("Conv", "MatMul")), 8),
    }
    built |= {path.name: (path, 32) for path in sorted((harness.REPO / "models").glob("*_dynamic.onnx"))}
    return {name: (onnx.load(path), size) for name, (path, size) in built.items()}


def _profile(model: onnx.ModelProto, feeds: dict[str, np.ndarray], runs: int) -> dict[str, float]:
    """Microseconds per run spent in each op type, from ORT's profile (one thread, all optimisations).

    Profiling is a session option the runtime layer does not offer, so the session is made here, with
    ORT imported as everywhere: its telemetry off.
    """
    from dql_pass.runtimes.ort import import_onnxruntime

    ort = import_onnxruntime()

    with tempfile.TemporaryDirectory(prefix="bench_lower.") as folder:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder, "profile"))
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    totals: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            totals[event["args"]["op_name"]] += event["dur"] / runs
    return dict(totals)


def bench(config: Config) -> tuple[list[list[str]], float | None, list[list[str]]]:
    """Latency rows, the transformer's ratio at all optimisations, and its profile rows."""
    runtime = runtimes.get("onnxruntime")
    rows, ratio, profile = [], None, []
    with tempfile.TemporaryDirectory(prefix="bench_lower.") as folder:
        for name, (original, size) in _models(config, Path(folder)).items():
            lowered, report = dql_pass.lower(original)
            feeds = models.random_feeds(original, np.random.default_rng(0), size=size)
            cells = []
            for level in LEVELS:
                sessions = {form: runtime.load(model, threads=1, optimize=level)
                            for form, model in (("original", original), ("lowered", lowered))}
                medians, same, _ = harness.race(sessions, feeds, config.budget, config.min_rounds)
                if level == "basic":
                    exact = same["lowered"]
                if name == "transformer" and level == "all":
                    ratio = medians["lowered"] / medians["original"]
                cells += [harness.format_time(medians["original"]), harness.format_time(medians["lowered"]),
                          f"{medians['lowered'] / medians['original']:.2f}x"]
            chunked = sum(item.proof.startswith("chunked") for item in report.lowered)
            rows.append([name, str(len(report.lowered)), str(chunked), *cells, "yes" if exact else "**no**"])
            logger.info("%s: %s", name, ", ".join(cells))
            if name == "transformer":
                before, after = (_profile(model, feeds, config.profile_runs) for model in (original, lowered))
                for op in sorted(set(before) | set(after),
                                 key=lambda op: -max(before.get(op, 0), after.get(op, 0)))[:10]:
                    profile.append([op, f"{before.get(op, 0) / 1e3:.2f} ms", f"{after.get(op, 0) / 1e3:.2f} ms"])
                profile.append(["total", f"{sum(before.values()) / 1e3:.2f} ms", f"{sum(after.values()) / 1e3:.2f} ms"])
    return rows, ratio, profile


def render(config: Config, mode: str, rows: list[list[str]], ratio: float | None, profile: list[list[str]]) -> str:
    target = harness.ratio_target(f"lowered transformer <= {TARGET}x the original (ORT, all optimisations)", ratio,
                                  TARGET)
    shape = config.transformer
    lines = [
        SECTION,
        "",
        f"Written by `python -m tools.bench_lower{' --quick' if mode == 'quick' else ''}` "
        f"(onnxruntime {harness.version('onnxruntime')}, onnx {onnx.__version__}, {harness.cpu_model()}); "
        "regenerate it with the same command. "
        + ("**A `--quick` smoke run: the figures are not meaningful.** " if mode == "quick" else "")
        + "ORT CPU, one intra-op thread. *lowered* is `dql_pass.lower` (no target: MatMulInteger and "
        "ConvInteger as float32 MatMul and Conv, DynamicQuantizeLinear expanded with the arithmetic variant). "
        f"The transformer has {shape.layers} layers, hidden size {shape.hidden}, {shape.heads} heads, "
        f"intermediate size {shape.intermediate}, sequence {shape.seq}, batch 1, its weight MatMuls quantized by "
        "`quantize_dynamic` (uint8); the CNN is `tools.models.cnn_model(channels=16, side=32)` at batch 8 with "
        "every Conv and MatMul quantized; the sample models run at batch 32. "
        f"The two forms run interleaved round robin for {config.budget:g} s per model and level (at least "
        f"{config.min_rounds} rounds); cells are medians. *exact* compares every output bit for bit at 'basic'. "
        f"Load average when the run ended: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; the small models' "
        "ratios (tens of microseconds, dominated by the per-node cost of the expansion's ops) move most with it.",
        "",
        *harness.table(
            ["model", "nodes lowered", "chunked", "original (all)", "lowered (all)", "ratio (all)",
             "original (basic)", "lowered (basic)", "ratio (basic)", "exact"],
            rows,
        ),
        "",
        f"Target: {target.goal}: {target.measured}, {target.verdict}.",
        "",
        f"Where the transformer's time goes: ORT's profile, one thread, all optimisations, mean of "
        f"{config.profile_runs} runs, summed by op type (the ten largest). The original runs ORT's fused "
        "`DynamicQuantizeMatMul` (u8 activations by u8 weights, VNNI); the lowered form runs float32 `MatMul` on "
        "weights four times the size, plus the elementwise ops of the expansion.",
        "",
        *harness.table(["op type", "original", "lowered"], profile),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return harness.section_main(
        __doc__.split("\n\n")[0], logger, CONFIGS, lambda config, mode: render(config, mode, *bench(config)), argv
    )


if __name__ == "__main__":
    sys.exit(main())
