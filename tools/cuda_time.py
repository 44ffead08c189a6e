"""What a transformer quantized the way transformers.js does it costs on a real GPU, through
onnxruntime-gpu's CUDA execution provider, before and after ``lower``, against its float32 model:
one run, every form side by side.

Run from the repository root, where onnxruntime-gpu is installed and a CUDA GPU is present, on a
float32 ONNX model (``tools/export_minilm.py`` exports all-MiniLM-L6-v2 with the inputs of 20
sentences)::

    python -m tools.cuda_time MODEL.onnx [--feeds INPUTS.npz] [--batch 1 32] [--budget 10]
                              [--provider CUDAExecutionProvider] [--out BENCHMARKS.md]

The forms, made as ``tools/gpu_cost.py`` makes them: ``original`` (``quantize_dynamic`` as
transformers.js's q8), ``lowered`` (``dql-pass lower``, no target), ``lowered onnxruntime-cuda``
(``lower --target onnxruntime-cuda``), ``lowered webgpu`` (``lower --target webgpu``, the
browser's form) and ``fp32`` (MODEL itself).

For each form and batch: the median time of a warm ``session.run`` (NumPy in, NumPy out, as a user
calls it; the forms interleaved round robin for ``--budget`` seconds); the nodes each execution
provider runs and the copies between them (onnxruntime's profiler, one warm run); and whether the
outputs equal the original's on the same provider, bit for bit (the float ops around the quantized
ones differ between providers, so only the same provider's outputs can be compared). Each row's
inputs are the first rows of ``--feeds``, repeated to the batch.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dql_pass.runtimes.ort import import_onnxruntime
from tools import harness
from tools.gpu_cost import lower_model, model_arguments, model_feeds, quantize_like_transformers_js, report

logger = logging.getLogger("cuda_time")

CPU = "CPUExecutionProvider"
TARGETS = (None, "onnxruntime-cuda", "webgpu")  # `lower --target`: none, the CUDA provider, the browser
COPIES = ("MemcpyFromHost", "MemcpyToHost")


def _session(path: Path, provider: str, profile: str | None = None):
    """A session on ``provider`` (the CPU taking what it has no kernel for), profiled into ``profile``."""
    ort = import_onnxruntime()

    options = ort.SessionOptions()
    options.log_severity_level = 3  # the provider's advice on fallbacks, on every load
    if profile is not None:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    providers = [provider] if provider == CPU else [provider, CPU]
    session = ort.InferenceSession(str(path), options, providers=providers)
    if session.get_providers()[0] != provider:  # onnxruntime falls back to the CPU when a provider fails to start
        raise SystemExit(f"error: {provider} did not start for {path.name}: {session.get_providers()}")
    return session


def placement(
    path: Path, provider: str, feeds: Mapping[str, np.ndarray], folder: Path
) -> dict[str, collections.Counter]:
    """Op types each provider ran in one warm run (the second), from onnxruntime's profiler."""
    session = _session(path, provider, str(folder / path.stem))
    session.run(None, dict(feeds))
    session.run(None, dict(feeds))
    events = json.loads(Path(session.end_profiling()).read_text())
    last = max(e["ts"] for e in events if e.get("name") == "model_run")
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] >= last:
            counts[event["args"]["provider"]][event["args"]["op_name"]] += 1
    return dict(counts)


def batch_of(feeds: Mapping[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """The first ``batch`` rows of every input, repeated where it has fewer."""
    return {name: np.ascontiguousarray(np.resize(array, (batch, *array.shape[1:]))) for name, array in feeds.items()}


def measure(forms: Mapping[str, Path], feeds: Mapping[str, np.ndarray], batches: Sequence[int], provider: str,
            budget: float, folder: Path) -> dict:
    """Per form: "time" (batch -> median seconds and samples), "same" (batch -> the original's bits, or a
    note) and "nodes" (provider -> op type counts); profiles go to ``folder``."""
    results: dict = {form: {"time": {}, "same": {}} for form in forms}
    sessions = {form: _session(path, provider) for form, path in forms.items()}
    for batch in batches:
        inputs = batch_of(feeds, batch)
        expected = sessions["original"].run(None, inputs)
        for form, session in sessions.items():
            results[form]["same"][batch] = ("(another model)" if form == "fp32"
                                            else harness.same_outputs(expected, session.run(None, inputs)))
        calls = {form: (lambda s=session: s.run(None, inputs)) for form, session in sessions.items()}
        logger.info("timing batch %d for %.0f s", batch, budget)
        samples = harness.interleaved(calls, budget=budget, min_rounds=20)
        for form, values in samples.items():
            results[form]["time"][batch] = {"median": statistics.median(values), "samples": len(values)}
    for form, path in forms.items():
        results[form]["nodes"] = placement(path, provider, batch_of(feeds, batches[0]), folder)
    return results


def render(results: Mapping[str, dict], *, model: Path, feeds: Mapping[str, np.ndarray], batches: Sequence[int],
           provider: str, budget: float) -> str:
    """The report: a ``## `` section for BENCHMARKS.md."""
    ort = import_onnxruntime()

    original = results["original"]["time"]
    rows, placed = [], []
    for form, result in results.items():
        nodes = result["nodes"]
        on = {p: sum(c for op, c in counts.items() if op not in COPIES) for p, counts in nodes.items()}
        copies = sum(counts[op] for counts in nodes.values() for op in COPIES)
        times = [f"{harness.format_time(result['time'][b]['median'])} "
                 f"({result['time'][b]['median'] / original[b]['median']:.2f}x)" for b in batches]
        same = ["yes" if result["same"][b] is True else "**no**" if result["same"][b] is False else result["same"][b]
                for b in batches]
        placed_on = [f"{on.get(p, 0):,}" for p in dict.fromkeys((provider, CPU))]
        rows.append([form, *placed_on, f"{copies:,}", *times, *same])
        for p, counts in nodes.items():
            listed = ", ".join(f"{op} {n}" for op, n in counts.most_common())
            placed.append(f"- {form}, {p}: {listed}")
    shapes = ", ".join(f"{name} [{', '.join(['batch', *map(str, a.shape[1:])])}]" for name, a in feeds.items())
    headers = ["form", *(f"nodes on {p}" for p in dict.fromkeys((provider, CPU))), "copies between them",
               *(f"inference, batch {b} (to original)" for b in batches),
               *(f"outputs = original's, batch {b}" for b in batches)]
    rounds = min(r["time"][b]["samples"] for r in results.values() for b in batches)
    gpu = "; ".join(harness.gpu_models("name,driver_version,memory.total")) or "unknown (no nvidia-smi)"
    lines = [
        f"## Time on a real GPU ({provider})", "",
        f"`python -m tools.cuda_time {model.name}` on {model.name}, on **{gpu}**, onnxruntime "
        f"{ort.__version__} ({provider}, its defaults, the optimizer at its default level). Forms as in "
        "the WebGPU section: original = quantize_dynamic as transformers.js's q8, lowered = `dql-pass lower` "
        "(no target), lowered TARGET = `dql-pass lower --target TARGET`, fp32 = the float model. Inputs: "
        f"{shapes}. Times are medians of a warm `session.run` (NumPy in and out), the forms interleaved "
        f"round robin for {budget:g} s a batch (at least {rounds} samples each). Nodes are one warm run's, "
        "from onnxruntime's profiler.", "",
        *harness.table(headers, rows), "",
        "Nodes per provider by op type:", "", *placed, "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(parser)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="batch sizes (default 1 32)")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timing per batch (default 10)")
    parser.add_argument("--provider", default="CUDAExecutionProvider",
                        help="onnxruntime's execution provider (default CUDAExecutionProvider)")
    parser.add_argument("--out", type=Path, help="write the section into this report (e.g. BENCHMARKS.md)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    ort = import_onnxruntime()

    if args.provider not in ort.get_available_providers():
        print(f"error: onnxruntime {ort.__version__} has no {args.provider} here (pip install onnxruntime-gpu, "
              "on a machine with a CUDA GPU)", file=sys.stderr)
        return 2
    if not args.model.is_file():
        print(f"error: no model at {args.model}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dql_pass.cuda_time.") as name:
        folder = Path(name)
        forms = {"original": folder / "model_quantized.onnx"}
        logger.info("quantizing %s as transformers.js does", args.model)
        quantize_like_transformers_js(args.model, forms["original"])
        for target in TARGETS:
            form = f"lowered {target}" if target else "lowered"
            forms[form] = folder / f"model_{target or 'float'}.onnx"
            logger.info("lowering for %s", target or "no target")
            lower_model(forms["original"], forms[form], target, None)
        forms["fp32"] = args.model
        feeds = model_feeds(args, max(args.batch))
        results = measure(forms, feeds, args.batch, args.provider, args.budget, folder)
        text = render(results, model=args.model, feeds=feeds, batches=args.batch, provider=args.provider,
                      budget=args.budget)
    return report(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
