"""Memory, time and disk of ``dql-pass lower`` on models with 100 MB and 500 MB of int8 weights.

Run from the repository root::

    python -m tools.lower_memory [--quick] [--before FOLDER [--label TEXT]] [--out docs/BENCHMARKS.md]

What it measures, for each model: a chain of DynamicQuantizeLinear -> MatMulInteger(int8 W_i) ->
Cast -> Mul, with random int8 weights of 2048 x 2048 (so every product is cut into chunks), made
in a temp dir; the 100 MB one with its weights in the model file, the 500 MB one with them in
external data. Then the same weights as ONE tensor of 512 rows (a single DQL -> MatMulInteger -> Cast
-> Mul whose product needs no cut), where whatever lower holds per tensor shows whole. ``dql-pass
lower IN -o OUT`` runs in a fresh process that reports its own peak RSS (``VmHWM``); the wall time
is the whole process's. With ``--before FOLDER`` (a checkout of an
older dql_pass, e.g. ``git archive BASE dql_pass | tar -x -C FOLDER``) both versions run, round
robin, side by side. Each cell is the median of the rounds (peak RSS: the largest). The output's
files are listed with their sizes, and the lowered model is run on ORT ("basic" optimisation)
against the original on one random input, compared bit for bit.

The results replace the ``## Lowering: memory and disk`` section of ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dql_pass import op, reference, runtimes
from dql_pass.lowering.rules import RULES
from tools import harness

logger = logging.getLogger("lower_memory")

SECTION = "## Lowering: memory and disk"
SIDE = 2048
DEPTH = 512  # rows of the one-tensor case: random int8 weights stay under 2^24 in one float32 product


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    megabytes: int
    external: bool
    one_tensor: bool = False  # the weights as one square tensor, not 2048 x 2048 ones


CONFIGS = {
    "full": ([Case("100 MB, one file", 100, False), Case("500 MB, external data", 500, True),
              Case("100 MB in one tensor, one file", 100, False, True),
              Case("400 MB in one tensor, external data", 400, True, True)], 3),
    "quick": ([Case("8 MB, one file", 8, False), Case("8 MB, external data", 8, True),
               Case("8 MB in one tensor, one file", 8, False, True)], 1),
}


def int8_model(folder: Path, megabytes: int, external: bool, seed: int = 0, one_tensor: bool = False) -> Path:
    """A chain of DQL -> MatMulInteger(int8 weights) -> Cast -> Mul with about ``megabytes`` MB of
    weights, each 2048 x 2048, or all in one tensor (``one_tensor``) of DEPTH rows: a product that needs no cut."""
    rng = np.random.default_rng(seed)
    depth, width = (DEPTH, megabytes * 10**6 // DEPTH) if one_tensor else (SIDE, SIDE)
    sites = 1 if one_tensor else max(1, round(megabytes * 1e6 / SIDE**2))
    nodes, weights = [], []
    for i in range(sites):
        weights.append(numpy_helper.from_array(rng.integers(-128, 128, (depth, width), dtype=np.int8), f"W{i}"))
        nodes += [
            helper.make_node(op.NAME, [f"h{i}"], [f"q{i}", f"scale{i}", f"zp{i}"], name=f"dql{i}"),
            helper.make_node("MatMulInteger", [f"q{i}", f"W{i}", f"zp{i}", "W_zp"], [f"acc{i}"], name=f"mmi{i}"),
            helper.make_node("Cast", [f"acc{i}"], [f"accf{i}"], to=TensorProto.FLOAT, name=f"cast{i}"),
            # Keep the activations' scale near 1 so that every layer sees a spread of values.
            helper.make_node("Mul", [f"accf{i}", "shrink"], [f"h{i + 1}"], name=f"mul{i}"),
        ]
    graph = helper.make_graph(
        nodes, "int8_chain",
        [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, depth])],
        [helper.make_tensor_value_info(f"h{sites}", TensorProto.FLOAT, [1, width])],
        [*weights, numpy_helper.from_array(np.array(0, np.int8), "W_zp"),
         numpy_helper.from_array(np.array(1 / (64 * depth**0.5), np.float32), "shrink")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = folder / f"int8_{megabytes}mb{'_one' if one_tensor else ''}{'_external' if external else ''}.onnx"
    onnx.save(model, path, save_as_external_data=external, location=path.name + ".weights" if external else None)
    return path


def _run(pythonpath: Path, source: Path, output: Path) -> dict[str, float]:
    """``dql-pass lower SOURCE -o OUTPUT`` with ``pythonpath``'s dql_pass: wall seconds, exit code, peak MiB."""
    env = {**os.environ, "PYTHONPATH": os.fspath(pythonpath)}
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", harness.MEASURED_CLI_SCRIPT, "lower", os.fspath(source), "-o",
                           os.fspath(output)],
                          env=env, cwd=source.parent, capture_output=True, text=True)  # not this checkout's dql_pass
    wall = time.perf_counter() - began
    try:
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        code, peak = measured["code"], measured["peak_kib"] / 1024
    except (IndexError, ValueError):  # died: a traceback, or killed
        code, peak = done.returncode, float("nan")
        logger.warning("%s on %s: exit %s: %s", pythonpath, source.name, code, done.stderr.strip().splitlines()[-1:])
    return {"wall": wall, "code": code, "peak": peak}


def _files(output: Path) -> list[tuple[str, int]]:
    """The output's files: the model and its data files, named after it."""
    return sorted((p.name, p.stat().st_size) for p in output.parent.iterdir() if p.name.startswith(output.name))


def _exact(source: Path, lowered: Path, one_tensor: bool) -> bool:
    """The lowered model on ORT against the original on ORT, or, for the one-tensor model (whose
    products ORT's u8s8 kernel saturates on x86 without VNNI), against the exact result."""
    ort = runtimes.get("onnxruntime")
    rng = np.random.default_rng(1)
    width = onnx.load(source, load_external_data=False).graph.input[0].type.tensor_type.shape.dim[1].dim_value
    feeds = {"h0": rng.standard_normal((1, width), dtype=np.float32)}
    expected = (_exact_output(source, feeds) if one_tensor
                else ort.load_exact(source, threads=1, optimize="basic").run(feeds))
    actual = ort.load(lowered, threads=1, optimize="basic").run(feeds)
    return harness.same_outputs(expected, actual)


def _exact_output(source: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The one-tensor model's output from :mod:`dql_pass.reference` (the MatMulInteger rule's), the product a block
    of columns at a time."""
    arrays = {t.name: numpy_helper.to_array(t) for t in onnx.load(source).graph.initializer}
    q, _, zp = reference.dynamic_quantize_linear(feeds["h0"])
    w, step = arrays["W0"], 1 << 14
    rule = RULES["MatMulInteger"]
    product = np.concatenate([rule.expected([q, w[:, i:i + step], zp, arrays["W_zp"]], {})
                              for i in range(0, w.shape[1], step)], axis=-1)
    return [product.astype(np.float32) * arrays["shrink"]]


def bench(cases: list[Case], rounds: int, before: Path | None) -> list[list[str]]:
    versions = {"after": harness.REPO} | ({"before": before} if before is not None else {})
    rows = []
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="lower_memory.") as tmp:
            folder = Path(tmp)
            source = int8_model(folder, case.megabytes, case.external, one_tensor=case.one_tensor)
            in_bytes = sum(p.stat().st_size for p in folder.iterdir())
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
            files: dict[str, list[tuple[str, int]]] = {}
            exact: dict[str, str] = {}
            for i in range(rounds):
                order = list(versions)[i % len(versions):] + list(versions)[:i % len(versions)]
                for name in order:
                    out = folder / f"lowered_{name}.onnx"
                    runs[name].append(_run(versions[name], source, out))
                    logger.info("%s, %s: %s", case.name, name, runs[name][-1])
                    if i == rounds - 1 or runs[name][-1]["code"] != 0:
                        files[name] = _files(out)
                        ok = runs[name][-1]["code"] == 0 and out.exists()
                        exact[name] = (("yes" if _exact(source, out, case.one_tensor) else "**no**") if ok
                                       else "no output")
                    for path in folder.iterdir():  # a fresh output each round, and room on the disk
                        if path.name.startswith(out.name):
                            path.unlink()
            for name in versions:
                done = runs[name]
                codes = sorted({str(r["code"]) for r in done})
                peaks = [r["peak"] for r in done]
                rows.append([
                    case.name, f"{in_bytes / 1e6:.0f} MB", name, ", ".join(codes),
                    harness.format_time(statistics.median(r["wall"] for r in done)),
                    "died" if any(math.isnan(p) for p in peaks) else f"{max(peaks):,.0f} MiB",
                    "; ".join(f"{n.replace(f'lowered_{name}.onnx', 'OUT')} {size / 1e6:,.0f} MB"
                              for n, size in files.get(name, [])) or "none",
                    exact.get(name, ""), str(len(done)),
                ])
    return rows


def render(rows: list[list[str]], mode: str, before: Path | None, label: str) -> str:
    return "\n".join([
        SECTION,
        "",
        f"Written by `python -m tools.lower_memory{' --quick' if mode == 'quick' else ''}"
        f"{' --before FOLDER --label LABEL' if before else ''}` ({harness.cpu_model()}, {harness.memory()}, "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs when it ended); "
        "regenerate it with the same command. "
        + ("**A `--quick` smoke run: the figures are not meaningful.** " if mode == "quick" else "")
        + f"`dql-pass lower IN -o OUT` on a chain of DQL → MatMulInteger → Cast → Mul whose int8 weights "
        f"({SIDE}×{SIDE}, random, so every product is cut into chunks) take the size given; *in one tensor*: one "
        f"DQL → MatMulInteger → Cast → Mul whose weights are one tensor of that size, {DEPTH} rows deep (one product, "
        "no cut). One fresh process per run; "
        "*peak RSS* is its `VmHWM` (the largest of the rounds), *wall* the median. "
        + (f"*before* is the dql_pass of `--before` ({label}), *after* this checkout's; the rounds alternate. "
           if before else "")
        + "*files written* are the "
        "output's (OUT: the model, OUT.<hex>.data: its external data). *exact*: the lowered model against the "
        "original on ORT ('basic'), one random input, bit for bit; in one tensor, against the exact result of "
        "dql_pass.reference (ORT's u8s8 kernel saturates on x86 without VNNI).",
        "",
        *harness.table(["model", "input on disk", "dql_pass", "exit", "wall", "peak RSS", "files written", "exact",
                        "rounds"], rows),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run on small models")
    parser.add_argument("--before", type=Path, help="a folder holding an older dql_pass to compare with")
    parser.add_argument("--label", default="an older dql_pass", help="what --before holds, for the report")
    parser.add_argument("--out", type=Path, default=harness.REPO / "docs" / "BENCHMARKS.md",
                        help="the report to update")
    parser.add_argument("--only", metavar="TEXT",
                        help="run only the models whose name contains TEXT (e.g. 'one tensor')")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    mode = "quick" if args.quick else "full"
    cases, rounds = CONFIGS[mode]
    cases = [case for case in cases if args.only is None or args.only in case.name]
    text = render(bench(cases, rounds, args.before), mode, args.before, args.label)
    harness.write_report(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
