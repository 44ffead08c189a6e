"""Benchmarks of issue 6: one command reproduces every figure of ``BENCHMARKS.md``.

Run from the repository root::

    python -m tools.bench [--quick] [--out docs/BENCHMARKS.md]

What it measures, each part in its own section with its targets:

1. Op level: a one-node DynamicQuantizeLinear model on ORT CPU (one intra-op thread and ORT's default)
   against each dql_pass variant and ONNX's own function body (the node inlined by
   ``onnx.inliner``), at 1K, 64K, 1M and 16M random normal floats; plus the nodes each puts per site.
   Then, on each other installed runtime of ``dql_pass.runtimes`` whose native DQL loads, the
   runtime's ``--target`` variant against that native kernel at 1K and 1M floats.
2. Pass throughput: the whole ``dql-pass expand`` process against the whole
   ``onnx.load`` + ``onnx.inliner`` + ``onnx.save`` process on chains of 100, 1,000 and 10,000 sites,
   and a cProfile of the in-process expansion of the largest chain (written to ``--profile``).
3. Memory: ``dql-pass expand`` on a model with over 2 GiB of uint8 weights in external data (a sparse
   file, so it is built in no time) and about 100 sites, the output written next to the input: wall
   time, peak RSS, bytes read, no weights copied, and the output loads and runs on ORT.
4. Whole models: ORT latency of the sample ``quantize_dynamic`` models in ``models/`` and of a
   MiniLM-sized synthetic transformer (quantized into a temp dir): original, expanded, fused.

Rules it applies (the timing rules are :mod:`tools.harness`'s, the models :mod:`tools.models`'):

- Every comparison runs side by side in one process run, interleaved round robin, and is reported
  as a median and a ratio to the baseline; every contender's outputs are compared bit for bit
  with the baseline's.
- Every model runs on ORT CPU through ``dql_pass.runtimes``.
- Targets are checked in code; BENCHMARKS.md states met or not met from the measured values only.
- Scratch models live in a temp dir and are deleted; nothing but BENCHMARKS.md and its plot is written.
- matplotlib is an optional extra (``pip install '.[bench]'``), imported lazily; without it the plot
  is skipped with a note.
- ``--quick`` is a smoke run (small sizes, few repetitions) that finishes in well under a minute.
"""

from __future__ import annotations

__all__ = ["CONFIGS", "Config", "bench_memory", "bench_models", "bench_ops", "bench_pass", "main",
           "other_runtimes_table", "render", "run"]

import argparse
import cProfile
import dataclasses
import datetime
import io
import logging
import os
import platform
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

import dql_pass
from dql_pass import op, runtimes
from dql_pass.files import external_tensors
from tools import harness, models
from tools.harness import Section, Target, format_time
from tools.models import MINILM, TransformerShape

logger = logging.getLogger("bench")

ORT = runtimes.get("onnxruntime")
THREADS: dict[str, int] = {"1 thread": 1, "default threads": 0}  # 0 lets ORT choose
TARGET_THREADS = "1 thread"  # the anchors are measured with one intra-op thread
SAMPLE_MODELS = ("mlp_dynamic.onnx", "conv_dynamic.onnx", "opset21_dynamic.onnx", "relu_dql.onnx")
# Benchmarks of other commands; listed in BENCHMARKS.md when present, never run from here.
OTHER_TOOLS = {
    "bench_fuse": "the fusion pass and the fused models on ORT; it writes the *Fusion* section of this file",
    "bench_verify": "the whole `dql-pass verify` process on a 24-site quantized transformer; it prints its figures",
    "lower_memory": "peak RSS, time and files of `dql-pass lower` on 100 MB and 500 MB of int8 weights; it writes the "
                    "*Lowering: memory and disk* section of this file",
}
INLINER_SCRIPT = (
    "import sys, onnx, onnx.inliner; m = onnx.load(sys.argv[1]); "
    "m = onnx.inliner.inline_selected_functions(m, [('', 'DynamicQuantizeLinear')], inline_schema_functions=True); "
    "onnx.save(m, sys.argv[2])"
)


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes and time budgets of one run; ``budget`` is seconds per interleaved comparison."""

    op_sizes: tuple[int, ...]
    op_budget: float
    op_min_rounds: int
    runtime_sizes: tuple[int, ...]  # the other runtimes: target variant against their native kernel
    chain_sites: tuple[int, ...]
    pass_budget: float
    pass_min_rounds: int
    memory_sites: int
    memory_side: int  # each weight is side x side uint8
    model_budget: float
    model_min_rounds: int
    transformer: TransformerShape


CONFIGS: dict[str, Config] = {
    "full": Config(
        op_sizes=(1 << 10, 1 << 16, 1 << 20, 1 << 24), op_budget=8.0, op_min_rounds=20,
        runtime_sizes=(1 << 10, 1 << 20),
        chain_sites=(100, 1_000, 10_000), pass_budget=20.0, pass_min_rounds=5,
        # 100 x 4672^2 bytes = 2.03 GiB; 4672^2 is a multiple of 4096, so every weight is page aligned.
        memory_sites=100, memory_side=4672,
        model_budget=6.0, model_min_rounds=30, transformer=MINILM,
    ),
    "quick": Config(
        op_sizes=(1 << 10, 1 << 16), op_budget=0.3, op_min_rounds=5, runtime_sizes=(1 << 10,),
        chain_sites=(10, 100), pass_budget=0.0, pass_min_rounds=1,
        memory_sites=10, memory_side=1024,
        model_budget=0.2, model_min_rounds=5,
        transformer=TransformerShape(layers=1, hidden=64, heads=4, intermediate=256, seq=16),
    ),
}


def _floats(count: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if count >= scale and count % scale == 0:
            return f"{count // scale}{unit}"
    return str(count)


# ---------------------------------------------------------------------------------------------
# 1. Op level

OP_BASELINE = "native DQL"


def _op_contenders() -> dict[str, onnx.ModelProto]:
    model = op.one_node_model(["n"], 21)
    contenders = {OP_BASELINE: model}
    contenders.update({f"dql_pass {v}": dql_pass.expand(model, variant=v)[0] for v in dql_pass.VARIANTS})
    contenders["ONNX function body"] = models.inline_onnx_function(model)
    return contenders


def other_runtimes_table(config: Config) -> tuple[str, list[str], list[list[str]]]:
    """Each other installed runtime's target variant against its native DQL kernel, one thread where
    the runtime takes the setting; a runtime whose native node does not load has no kernel to race.

    Run last: the runtimes stay loaded in this process (their caches and compiled code), which the
    memory and whole-model sections would otherwise measure beside.
    """
    model = op.one_node_model(["n"], 21)
    rng = np.random.default_rng(0)
    rows = []
    for name, runtime in runtimes.RUNTIMES.items():
        if runtime is ORT or not runtime.installed():
            continue
        forms = {OP_BASELINE: model,
                 f"dql_pass {runtime.variant} (target)":
                     dql_pass.expand(model, variant=runtime.variant, runtime=None)[0]}
        for size in config.runtime_sizes:
            x = rng.standard_normal(size, dtype=np.float32)
            expected = dql_pass.dynamic_quantize_linear(x)
            logger.info("op level: %s, %s floats", name, _floats(size))
            try:
                sessions = {form: runtime.load(m, threads=1) for form, m in forms.items()}
                medians, _, rounds = harness.race(sessions, {"x": x}, config.op_budget, config.op_min_rounds)
                exact = {form: harness.same_outputs(expected, s.run({"x": x})) for form, s in sessions.items()}
            except runtimes.RuntimeFailure as error:
                rows.append([name, runtime.version() or "-", _floats(size), "does not run", "-", "-", "-",
                             str(error).splitlines()[0][:200]])
                continue
            finally:
                sessions = {}  # compiled 1M-element models are large: one runtime's at a time
            native, target = medians.values()
            rows.append([name, runtime.version() or "-", _floats(size), format_time(native),
                         f"{format_time(target)} ({runtime.variant})", f"{target / native:.2f}x",
                         " / ".join("yes" if e else "no" for e in exact.values()), str(rounds)])
    return ("Other runtimes: target variant against the native kernel",
            ["runtime", "version", "floats", "native DQL", "target variant", "ratio", "exact (native / target)",
             "rounds"],
            rows)


def bench_ops(config: Config) -> tuple[Section, dict[str, dict[str, list[tuple[int, float]]]]]:
    """Section 1 and, per thread setting and contender, the (size, ratio) points of the plot."""
    contenders = _op_contenders()
    rng = np.random.default_rng(0)
    rows, curves = [], {label: {name: [] for name in contenders} for label in THREADS}
    ratios: dict[tuple[str, str, int], float] = {}
    for label, threads in THREADS.items():
        sessions = {name: ORT.load(model, threads=threads) for name, model in contenders.items()}
        for size in config.op_sizes:
            feeds = {"x": rng.standard_normal(size, dtype=np.float32)}
            logger.info("op level: %s floats, %s", _floats(size), label)
            medians, same, rounds = harness.race(sessions, feeds, config.op_budget, config.op_min_rounds)
            for name, median in medians.items():
                ratio = median / medians[OP_BASELINE]
                ratios[(label, name, size)] = ratio
                curves[label][name].append((size, ratio))
                rows.append([label, _floats(size), name, format_time(median), f"{ratio:.2f}x",
                             "yes" if same[name] else "**no**", str(rounds)])
    node_rows = [
        [name, str(len(model.graph.node)), str(len(model.graph.initializer)),
         ", ".join(sorted({n.op_type for n in model.graph.node}))]
        for name, model in contenders.items()
    ]
    section = Section(
        "1. Op level",
        "One DynamicQuantizeLinear on ORT CPU (opset 21) against the same node expanded: by dql_pass "
        "(each variant) and by `onnx.inliner.inline_selected_functions(..., inline_schema_functions=True)` "
        "(ONNX's function body). Input: random normal float32. Latency is the median of interleaved "
        "`session.run` calls; the ratio is to the native node. *Same bits* compares all three outputs with "
        "the native node's. *Other runtimes* races, on each other installed runtime, the variant "
        "`dql-pass expand --target NAME` picks against that runtime's own DQL kernel (one thread where the "
        "runtime takes the setting; compilers compile once per shape, before timing); *exact* compares each "
        "with the NumPy reference, bit for bit, on the timed input.",
        tables=[
            ("Latency", ["threads", "floats", "contender", "median", "ratio", "same bits", "rounds"], rows),
            ("Nodes per site", ["contender", "nodes", "shared initializers", "op types"], node_rows),
        ],
    )
    one = TARGET_THREADS
    onnx_nodes = len(contenders["ONNX function body"].graph.node)
    ql_nodes = len(contenders["dql_pass quantizelinear"].graph.node)
    section.targets.append(Target(
        f"quantizelinear: fewer nodes per site than ONNX's function body ({onnx_nodes})",
        f"{ql_nodes} nodes", ql_nodes < onnx_nodes,
    ))
    # Each ratio target also shows ONNX's own function body at the same point: the floor it sets.
    for variant, size, limit in (("quantizelinear", 1 << 20, 1.5), ("quantizelinear", 1 << 24, 1.5),
                                 ("quantizelinear", 1 << 10, 1.6), ("arithmetic", 1 << 20, 5.0)):
        target = harness.ratio_target(f"{variant} ≤ {limit:g}x native at {_floats(size)} floats, {one}",
                                      ratios.get((one, f"dql_pass {variant}", size)), limit)
        if target.met is not None:
            target.measured += f" (ONNX function body: {ratios[(one, 'ONNX function body', size)]:.3f}x)"
        section.targets.append(target)
    million = (one, "dql_pass float64", 1 << 20), (one, "dql_pass arithmetic", 1 << 20)
    section.targets.append(harness.ratio_target(
        f"float64 no slower than arithmetic at 1M floats, {one} (float64 / arithmetic)",
        ratios[million[0]] / ratios[million[1]] if all(k in ratios for k in million) else None, 1.0,
    ))
    return section, curves


# ---------------------------------------------------------------------------------------------
# 2. Pass throughput


def profile_expand(source: Path, target: Path, report: Path, top: int = 25) -> list[str]:
    """cProfile of load + expand + save in process; the ``top`` cumulative entries go to ``report``."""
    profiler = cProfile.Profile()
    profiler.runcall(lambda: dql_pass.save_model(dql_pass.expand(source)[0], target, source=source))
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
    report.write_text(text.getvalue())
    return text.getvalue().splitlines()


def bench_pass(config: Config, scratch: Path, profile: Path) -> Section:
    rows, times = [], {}
    for sites in config.chain_sites:
        source = scratch / f"chain{sites}.onnx"
        onnx.save(models.chain_model(sites), source)
        logger.info("pass throughput: %d sites", sites)
        samples = harness.interleaved(
            {
                "dql-pass expand": harness.process([*harness.dql_pass_command(), "expand", os.fspath(source), "-o",
                                                    os.fspath(scratch / f"chain{sites}.dql_pass.onnx")]),
                "onnx inliner": harness.process([sys.executable, "-c", INLINER_SCRIPT, os.fspath(source),
                                                 os.fspath(scratch / f"chain{sites}.inlined.onnx")]),
            },
            budget=config.pass_budget, min_rounds=config.pass_min_rounds,
        )
        ours, theirs = statistics.median(samples["dql-pass expand"]), statistics.median(samples["onnx inliner"])
        times[sites] = (ours, theirs)
        rows.append([f"{sites:,}", format_time(ours), format_time(theirs), f"{ours / theirs:.2f}x",
                     format_time(ours / sites), str(len(samples["onnx inliner"]))])
    marginal_rows, marginals = [], []
    for (small, (o1, i1)), (large, (o2, i2)) in zip(list(times.items()), list(times.items())[1:]):
        ours, theirs = (o2 - o1) / (large - small), (i2 - i1) / (large - small)
        marginals.append(ours)
        marginal_rows.append([f"{small:,} → {large:,}", format_time(ours), format_time(theirs)])
    startup = harness.interleaved(
        {
            "import dql_pass.cli": harness.process([sys.executable, "-c", "import dql_pass.cli"]),
            "import onnx, onnx.inliner": harness.process([sys.executable, "-c", "import onnx, onnx.inliner"]),
        },
        budget=config.pass_budget / 4, min_rounds=config.pass_min_rounds,
    )
    startup_rows = [[name, format_time(statistics.median(v))] for name, v in startup.items()]
    startup_gap = (statistics.median(startup["import dql_pass.cli"])
                   - statistics.median(startup["import onnx, onnx.inliner"]))

    largest = max(config.chain_sites)
    lines = profile_expand(scratch / f"chain{largest}.onnx", scratch / f"chain{largest}.profiled.onnx", profile)
    logger.info("profile of the %d-site expansion written to %s", largest, profile)
    total = next((line.strip() for line in lines if "function calls" in line), "")

    section = Section(
        "2. Pass throughput",
        "Chains of DQL → DequantizeLinear → DQL … built with `onnx.helper`. Wall time of the whole "
        f"`dql-pass expand chain.onnx -o out.onnx` process against the whole process `{INLINER_SCRIPT}` "
        "(ONNX's function body, no checks), interleaved; median of the rounds. `dql-pass expand` also runs "
        "`onnx.checker` with `full_check=True` on the input.",
        tables=[
            ("Whole process", ["sites", "dql-pass expand", "onnx inliner", "ratio", "dql-pass per site", "rounds"],
             rows),
            ("Marginal cost per site (linearity)", ["sites", "dql-pass expand", "onnx inliner"], marginal_rows),
            ("Start-up floor (a process that only imports)", ["process", "median"], startup_rows),
        ],
        notes=[f"Start-up alone (imports) costs dql-pass {format_time(startup_gap)} more than the inliner process; at "
               f"{max(times):,} sites that is {startup_gap / times[max(times)][0]:.0%} of dql-pass's time.",
               f"A cProfile of the in-process load + expand + save of the {largest:,}-site chain "
               f"({total}) is written to `{profile}` (not committed)."],
    )
    big = 10_000
    section.targets.append(harness.ratio_target(
        f"{big:,} sites: dql-pass expand ≤ 1.5x the inliner process",
        times[big][0] / times[big][1] if big in times else None, 1.5,
    ))
    if len(marginals) >= 2:
        growth = marginals[-1] / marginals[-2]
        section.targets.append(Target(
            "linear cost: marginal cost per site of the last step ≤ 1.5x that of the step before",
            f"{growth:.2f}x", growth <= 1.5,
        ))
    else:
        section.targets.append(Target("linear cost (needs three chain sizes)", "-", None))
    return section


# ---------------------------------------------------------------------------------------------
# 3. Memory


def _disk(folder: Path) -> dict[str, tuple[int, int]]:
    """Apparent size and allocated bytes of every file in ``folder``."""
    return {p.name: (p.stat().st_size, p.stat().st_blocks * 512) for p in folder.iterdir() if p.is_file()}


def _external_locations(path: Path) -> set[str]:
    """The external data files the model's tensors point to, in every graph (none is read)."""
    return {tensor.location for tensor in external_tensors(ir.load(path))}


def bench_memory(config: Config) -> Section:
    with tempfile.TemporaryDirectory(prefix="bench_memory.") as tmp:
        folder = Path(tmp)
        source = models.big_external_model(folder, config.memory_sites, config.memory_side)
        target = folder / "big_expanded.onnx"
        weight_bytes = config.memory_sites * config.memory_side**2
        before = _disk(folder)
        logger.info("memory: %d sites, %.2f GiB of external weights", config.memory_sites, weight_bytes / 2**30)
        runs = []
        for _ in range(3):
            target.unlink(missing_ok=True)
            runs.append(harness.measure_cli(["expand", os.fspath(source), "-o", os.fspath(target)]))
        after = _disk(folder)
        new_files = {name: after[name] for name in after.keys() - before.keys()}
        locations = _external_locations(target)
        session = ORT.load(target)
        feeds = models.random_feeds(onnx.load(target, load_external_data=False), np.random.default_rng(0))
        (result,) = session.run(feeds)
        del session
        runs_ok = result.shape == (1, config.memory_side) and bool(np.isfinite(result).all())

    wall = statistics.median([w for w, _ in runs])
    peak_mib = max(r["peak_kib"] for _, r in runs) / 1024
    read_mib = max(r["rchar"] for _, r in runs) / 2**20
    copied = sum(size for size, _ in new_files.values()) > weight_bytes // 100 or locations != {"weights.bin"}
    rows = [
        ["external weights", f"{weight_bytes / 2**30:.2f} GiB in one file, {config.memory_sites} × "
                             f"{config.memory_side}×{config.memory_side} uint8"],
        ["DQL sites", str(config.memory_sites)],
        ["wall time, whole process (median of 3)", format_time(wall)],
        ["peak RSS (max of 3)", f"{peak_mib:.0f} MiB"],
        ["bytes read through read() by the process", f"{read_mib:.0f} MiB"],
        ["new files", ", ".join(f"{n} ({s / 1024:.0f} KiB)" for n, (s, _) in sorted(new_files.items()))],
        ["external data the output references", ", ".join(sorted(locations))],
        ["output runs on ORT", "yes" if runs_ok else "**no**"],
    ]
    section = Section(
        "3. Memory",
        "A chain of DQL → MatMulInteger → Cast → Mul whose uint8 weights sit in one external file, "
        "created sparse by truncation. `dql-pass expand big.onnx -o big_expanded.onnx`, output next to the "
        "input, runs in a fresh process that reports its own peak RSS (`VmHWM` of `/proc/self/status`) "
        "and bytes read (`rchar` of `/proc/self/io`; pages read through a memory map count in the RSS "
        "instead). The wall time is of the whole process. The output is then run on ORT with a random "
        "input. Everything is in a temp dir, deleted afterwards.",
        tables=[("Expansion of a model with external weights", ["measure", "value"], rows)],
    )
    section.targets += [
        Target("wall time < 5 s", format_time(wall), wall < 5.0),
        Target("peak RSS < 300 MB", f"{peak_mib * 1.048576:.0f} MB", peak_mib * 1.048576 < 300),
        Target("weights never copied", "copied" if copied else "not copied", not copied),
        # Python reads some 30 MiB of modules, so reads only tell when the weights are far larger.
        Target("weights never read: bytes read < 10% of the weights",
               f"{read_mib:.0f} MiB", None if weight_bytes < 2**30 else read_mib * 2**20 < weight_bytes / 10),
        Target("the output loads and runs on ORT", "yes" if runs_ok else "no", runs_ok),
    ]
    if weight_bytes < 2**31:
        section.notes.append(f"This run used {weight_bytes / 2**30:.2f} GiB of weights, under the 2 GiB of the "
                             "issue (a `--quick` run); the full run uses 2.03 GiB.")
    return section


# ---------------------------------------------------------------------------------------------
# 4. Whole models


CONTENDERS = ("original", "expanded", "fused")


def _contenders(model: onnx.ModelProto) -> dict[str, onnx.ModelProto]:
    """The model, its expansion and that expansion fused back, in the order of CONTENDERS."""
    expanded = dql_pass.expand(model)[0]
    return dict(zip(CONTENDERS, (model, expanded, dql_pass.fuse(expanded)[0])))


def _model_rows(name: str, model: onnx.ModelProto, config: Config, budget: float) -> tuple[list[list[str]], dict]:
    available = _contenders(model)
    rows, ratios = [], {}
    rng = np.random.default_rng(0)
    for label, threads in THREADS.items():
        logger.info("whole models: %s, %s", name, label)
        sessions = {c: ORT.load(m, threads=threads) for c, m in available.items()}
        feeds = models.random_feeds(model, rng)
        medians, same, rounds = harness.race(sessions, feeds, budget, config.model_min_rounds)
        row = [name, str(models.dql_count(model)), label, format_time(medians["original"])]
        for contender in CONTENDERS[1:]:
            ratios[(label, contender)] = medians[contender] / medians["original"]
            row.append(f"{format_time(medians[contender])} ({ratios[(label, contender)]:.3f}x)"
                       + ("" if same[contender] else ", **outputs differ**"))
        rows.append(row + [str(rounds)])
    return rows, ratios


def bench_models(config: Config, scratch: Path) -> Section:
    rows, notes = [], []
    for name in SAMPLE_MODELS:
        path = harness.REPO / "models" / name
        if not path.is_file():
            notes.append(f"`models/{name}` is missing; run `python -m tools.make_models`.")
            continue
        rows += _model_rows(name, onnx.load(path), config, config.model_budget)[0]
    shape = config.transformer
    label = f"MiniLM-sized ({shape.layers} layers, hidden {shape.hidden}, seq {shape.seq})"
    logger.info("whole models: building and quantizing %s", label)
    minilm = onnx.load(models.quantize(models.minilm_model(shape), scratch, "minilm_dynamic.onnx"))
    minilm_rows, ratios = _model_rows(label, minilm, config, 4 * config.model_budget)
    rows += minilm_rows
    headers = ["model", "DQL sites", "threads", *CONTENDERS, "rounds"]
    section = Section(
        "4. Whole models",
        "ORT CPU latency of the sample `quantize_dynamic` models in `models/` and of a synthetic MiniLM-sized "
        f"encoder ({shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, intermediate "
        f"{shape.intermediate}, sequence {shape.seq}, batch 1, opset 17, MatMul-based with LayerNormalization, "
        "Softmax and Erf GELU) passed through `quantize_dynamic` in a temp dir. *expanded* is `dql_pass.expand` "
        "(quantizelinear, inline), *fused* is that expansion fused back by `dql_pass.fuse`; each cell gives the median "
        "and the ratio to the original, interleaved. "
        "Outputs are compared bit for bit with the original's.",
        tables=[("Latency", headers, rows)],
        notes=notes,
    )
    section.targets.append(harness.ratio_target(
        f"MiniLM-sized model: expanded ≤ 1.05x original, {TARGET_THREADS}",
        ratios.get((TARGET_THREADS, "expanded")) if shape == MINILM else None, 1.05,
    ))
    return section


# ---------------------------------------------------------------------------------------------
# Plot and report


def plot(curves: Mapping[str, Mapping[str, list[tuple[int, float]]]], path: Path) -> str | None:
    """Ratio to native against size, one panel per thread setting; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(1, len(curves), figsize=(9, 3.2), sharey=True, dpi=90)
    for axis, (label, lines) in zip(np.atleast_1d(axes), curves.items()):
        for name, points in lines.items():
            sizes, ratios = zip(*points)
            axis.plot(sizes, ratios, marker="o", label=name)
        axis.set_xscale("log", base=2)
        axis.set_title(f"ORT CPU, {label}")
        axis.set_xlabel("floats")
        axis.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("latency / native DQL")
    np.atleast_1d(axes)[-1].legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return matplotlib.__version__


def render(
    sections: Sequence[Section], mode: str, plot_name: str, plot_version: str | None, load: Sequence[float]
) -> str:
    """BENCHMARKS.md: machine and versions, a summary of the targets, then each section.

    ``load`` is the 1-minute load average before and after the run: other work on the machine
    shows there, and it slows the default-threads figures most.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [
        "# Benchmarks",
        "",
        f"Written by `python -m tools.bench{' --quick' if mode == 'quick' else ''}` on "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; regenerate it with the same "
        "command, do not edit it by hand. Every comparison is measured side by side in one run, interleaved "
        "round robin, and reported as a median and a ratio to its baseline. Targets are checked by the script."
        + (" **This is a `--quick` smoke run: small sizes and few repetitions; the figures are not meaningful.**"
           if mode == "quick" else ""),
        "",
        "## Machine and versions",
        "",
        *harness.table(["item", "value"], [
            ["CPUs (nproc)", str(cpus)],
            ["CPU model", harness.cpu_model()],
            ["memory", harness.memory()],
            ["OS", platform.platform()],
            ["load average (1 min) before / after the run", " / ".join(f"{x:.2f}" for x in load)],
            ["python", platform.python_version()],
            *[[d, harness.version(d)] for d in ("onnx", "onnxruntime", "onnxscript", "onnx_ir", "numpy")],
            ["matplotlib", plot_version or "not installed"],
            ["dql_pass commit", harness.git_commit()],
        ]),
        "",
        "## Targets",
        "",
        *harness.table(["section", "target", "measured", "verdict"],
                       [[s.title, t.goal, t.measured, t.verdict] for s in sections for t in s.targets]),
        "",
    ]
    for section in sections:
        lines += [f"## {section.title}", "", section.intro, ""]
        if section.title.startswith("1.") and plot_version:
            lines += [f"![ratio to the native DQL against size]({plot_name})", ""]
        elif section.title.startswith("1."):
            lines += ["The plot is skipped: matplotlib is not installed (`pip install '.[bench]'`).", ""]
        for caption, headers, rows in section.tables:
            lines += [f"**{caption}**", "", *harness.table(headers, rows), ""]
        lines += ["Targets:", "", *[f"- {t.goal}: {t.measured}, {t.verdict}" for t in section.targets], ""]
        lines += [f"{note}\n" for note in section.notes]
    others = [(tool, what) for tool, what in OTHER_TOOLS.items() if (harness.REPO / "tools" / f"{tool}.py").is_file()]
    if others:
        lines += ["## Other benchmarks", "",
                  "These tools time other commands; this script does not run them:",
                  "", *[f"- `python -m tools.{tool}`: {what}." for tool, what in others], ""]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------------------------
# 5. Start-up

STARTUP_ROUNDS = {"full": 15, "quick": 3}


def bench_startup(mode: str) -> Section:
    """The command line's start-up: `dql-pass --help` and `dql-pass expand` on the MLP sample, against
    `python -c pass`, each a fresh process, interleaved round robin."""
    sample = harness.REPO / "models" / "mlp_dynamic.onnx"
    with tempfile.TemporaryDirectory(prefix="bench_startup.") as tmp:
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "dql-pass --help": [sys.executable, "-m", "dql_pass", "--help"],
            "dql-pass --version": [sys.executable, "-m", "dql_pass", "--version"],
            "dql-pass expand (MLP sample)": [sys.executable, "-m", "dql_pass", "expand", os.fspath(sample), "-o",
                                             os.fspath(Path(tmp, "expanded.onnx")), "-q"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(STARTUP_ROUNDS[mode]):
            for name, command in commands.items():
                began = time.perf_counter()
                subprocess.run(command, check=True, capture_output=True)
                times[name].append(time.perf_counter() - began)
    base = statistics.median(times["python -c pass"])
    medians = {name: statistics.median(values) for name, values in times.items()}
    rows = [[name, format_time(median), f"{median / base:.1f}×", format_time(median - base)]
            for name, median in medians.items()]
    section = Section(
        "5. Start-up",
        f"Each command a fresh process, the four interleaved round robin, {STARTUP_ROUNDS[mode]} rounds; medians. The "
        "parser is built from leaf modules only and every command imports what it runs, so `--help` loads no graph "
        "library.",
        tables=[("Start-up of the command line", ["command", "median", "against python -c pass", "above it"], rows)],
    )
    section.targets.append(Target("dql-pass --help < 0.5 s", format_time(medians["dql-pass --help"]),
                                  medians["dql-pass --help"] < 0.5))
    return section


def run(mode: str, out: Path, profile: Path) -> list[Section]:
    """Run every part and write ``out`` and its plot; returns the sections."""
    config = CONFIGS[mode]
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench.") as tmp:
        scratch = Path(tmp)
        ops, curves = bench_ops(config)
        sections = [ops, bench_pass(config, scratch, profile), bench_memory(config), bench_models(config, scratch),
                    bench_startup(mode)]
        ops.tables.append(other_runtimes_table(config))
    plot_name = "benchmarks/op_ratio.png"
    plot_version = plot(curves, out.parent / plot_name)
    load.append(os.getloadavg()[0])
    harness.write_report(out, render(sections, mode, plot_name, plot_version, load))
    logger.info("wrote %s", out)
    return sections


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few repetitions")
    parser.add_argument("--out", type=Path, default=harness.REPO / "docs" / "BENCHMARKS.md", help="the report to write")
    parser.add_argument("--profile", type=Path, default=Path(tempfile.gettempdir()) / "bench_profile.txt",
                        help="where to write the cProfile of the largest pass run")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(name)s: %(message)s")
    logger.setLevel(logging.INFO)  # progress of the benchmark only, not every pass run it makes
    run("quick" if args.quick else "full", args.out, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
