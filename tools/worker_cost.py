"""What running a runtime in its worker process costs: the native one-node DQL model run in this process (the
worker module's own functions called here) and through a session of the adapter (its worker), interleaved,
medians of many runs.

    python -m tools.worker_cost [--runtime tract --runtime openvino]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import numpy as np
import onnx

from dql_pass import runtimes
from dql_pass.op import one_node_model
from dql_pass.runtimes import sessions

_SIZES = {"1K": (1 << 10, 301), "1M": (1 << 20, 31)}  # floats, runs


def _seconds(run, x: np.ndarray) -> float:
    start = time.perf_counter()
    run(x)
    return time.perf_counter() - start


def measure(name: str) -> list[str]:
    """One row a size: the run in process, through the worker, and their ratio. Both read the same file, as the
    adapter prepares it."""
    runtime = runtimes.get(name)
    model = one_node_model(["n"], 13)
    module = importlib.import_module(f"dql_pass.runtimes.{name}_worker")
    session = runtime.load(model)
    rows = []
    with sessions.as_file(model) as path:
        proto = onnx.load(path, load_external_data=False)
        runtime.prepare(proto)
        onnx.save(proto, path)
        module.load(0, str(path), *runtime.load_arguments(threads=0))
        for label, (size, repeats) in _SIZES.items():
            x = np.random.default_rng(0).standard_normal(size).astype(np.float32)
            in_process, through = (lambda a: module.run(0, [a])), (lambda a: session.run({"x": a}))
            in_process(x), through(x)  # compiled for this shape
            pairs = [(_seconds(in_process, x), _seconds(through, x)) for _ in range(repeats)]
            a = statistics.median(p[0] for p in pairs)
            b = statistics.median(p[1] for p in pairs)
            rows.append(f"| {name} | {label} | {a * 1e6:,.1f} µs | {b * 1e6:,.1f} µs | {b / a:.2f}x |")
        module.drop(0)
    session.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", action="append", choices=["tract", "openvino"])
    args = parser.parse_args()
    print("| runtime | floats | in process | through the worker | ratio |\n|---|---|---|---|---|")
    for name in args.runtime or ["tract", "openvino"]:
        print("\n".join(measure(name)))


if __name__ == "__main__":
    main()
