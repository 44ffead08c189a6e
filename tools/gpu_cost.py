"""What a transformer quantized the way transformers.js does it costs on WebGPU, before and after
``lower``, against its float32 model: one run, every form side by side.

Run from the repository root, on a float32 ONNX model (any; ``tools/export_minilm.py`` exports
all-MiniLM-L6-v2 with the inputs of 20 sentences)::

    python -m tools.gpu_cost MODEL.onnx [--feeds INPUTS.npz] [--batch N] [--target webgpu] [--variant V]
                             [--repeats 3] [--runtime-timeout 600] [--out BENCHMARKS.md]

The forms:

- ``original``: MODEL through onnxruntime's ``quantize_dynamic`` as transformers.js makes its
  ``q8`` files (``scripts/quantize.py``): QInt8 weights, ``per_channel``, ``reduce_range``, every
  op type it quantizes, subgraphs too, MatMul only with a constant B;
- ``lowered``: that model through ``dql-pass lower --target TARGET`` (``--variant`` puts another
  exact DynamicQuantizeLinear variant in place of the target's own);
- ``fp32``: MODEL itself.

For each, on the ``webgpu`` runtime (onnxruntime-web in headless Chromium), the WebGPU calls of
one warm inference (compute dispatches, queue submits, GPU-to-CPU readbacks, counted at the page's
WebGPU API) and the nodes each execution provider runs; on ``webgpu`` and on ``wasm``, the
session's creation and a warm inference timed in the page (medians of ``--repeats`` sessions,
the forms interleaved round robin); the file's size; and whether the lowered form's outputs are
bit-identical to the original's on each runtime, and on wasm at optimize "basic" (where
onnxruntime does not fuse the original's integer ops into kernels that round otherwise). Without a
GPU, WebGPU runs on SwiftShader, a CPU emulation: its times say what SwiftShader pays, not a GPU;
the counts are what a GPU would be asked.

Inputs: ``--feeds`` (an ``.npz`` of the model's inputs, first ``--batch`` rows), else made up: token
ids uniform in [0, 1000), masks ones, token types zeros, floats standard normal; a symbolic
dimension is ``--batch`` when its name has "batch", else ``--sequence``.
"""

from __future__ import annotations

__all__ = ["FormCost", "main", "measure", "quantize_like_transformers_js", "render"]

import argparse
import collections
import dataclasses
import logging
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from dql_pass import runtimes
from dql_pass.cli.values import seconds
from dql_pass.lowering.quantization import LowerQuantizationPass
from dql_pass.runtimes import web
from dql_pass.runtimes.ort import import_onnxruntime
from tools import harness

logger = logging.getLogger("tools.gpu_cost")
FORMS = ("original", "lowered", "fp32")
RUNTIMES = ("webgpu", "wasm")
BASIC = "wasm, optimize basic"
# A transformer of thousands of nodes at a batch of 20 on SwiftShader, a CPU stand-in for a GPU,
# outlasts the adapters' own limits on a loaded machine: they are set to stop a hung run.
TIMEOUT = 600
_TYPES = {onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32, onnx.TensorProto.FLOAT: np.float32}


@dataclasses.dataclass
class FormCost:
    """One form of the model: its file, what one inference asks of the GPU, and its times."""

    path: Path
    size: int  # bytes, with external data
    cost: web.Cost | str | None = None  # on webgpu, or why it could not be measured
    load: dict[str, list[float]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    run: dict[str, list[float]] = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    outputs: dict[str, list[np.ndarray] | str] = dataclasses.field(default_factory=dict)  # runtime -> first outputs
    adapter: str | None = None  # the WebGPU adapter its webgpu sessions ran on


def quantize_like_transformers_js(source: Path, target: Path) -> None:
    """``source`` quantized as transformers.js's ``q8`` (scripts/quantize.py, mode q8), into ``target``."""
    import_onnxruntime()  # first: its telemetry off
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process, on the root logger
    try:
        quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                         extra_options={"EnableSubgraph": True, "MatMulConstBOnly": True})
    finally:
        root.setLevel(level)


def lower_model(source: Path, target_path: Path, target: str | None, variant: str | None) -> None:
    """``source`` through ``dql-pass lower --target target`` (None: no target), into ``target_path``."""
    rewrite = LowerQuantizationPass(target)
    if variant is not None:
        rewrite.variant = variant  # another exact variant in the target's place (a variant of dql_pass.op.VARIANTS)
    model = rewrite(ir.load(source)).model
    ir.save(model, target_path)


def _size(path: Path) -> int:
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def feeds_for(
    model: onnx.ModelProto, given: Mapping[str, np.ndarray], batch: int, sequence: int
) -> dict[str, np.ndarray]:
    """The model's inputs: the first ``batch`` rows of ``given``, else made up (the module docstring)."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if value.name in given:
            feeds[value.name] = np.ascontiguousarray(given[value.name][:batch])
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else batch if "batch" in d.dim_param.lower() else sequence
                 for d in tensor.shape.dim]
        dtype = _TYPES.get(tensor.elem_type)
        if dtype is None:
            raise SystemExit(
                f"error: input {value.name} is {onnx.TensorProto.DataType.Name(tensor.elem_type)}: give it in --feeds")
        if dtype is np.float32:
            feeds[value.name] = rng.standard_normal(shape, dtype=np.float32)
        elif "mask" in value.name:
            feeds[value.name] = np.ones(shape, dtype)
        elif "type" in value.name:
            feeds[value.name] = np.zeros(shape, dtype)
        else:
            feeds[value.name] = rng.integers(0, 1000, shape).astype(dtype)
    return feeds


def measure(
    forms: Mapping[str, Path], feeds: Mapping[str, np.ndarray], repeats: int, timeout: float = TIMEOUT,
) -> dict[str, FormCost]:
    """Every figure of every form, the forms interleaved round robin (the start rotating each round);
    ``timeout``: the seconds a load or a run may take on each runtime."""
    results = {form: FormCost(path, _size(path)) for form, path in forms.items()}
    for name in RUNTIMES:
        runtimes.get(name).timeout = timeout
    webgpu = runtimes.get("webgpu")
    for form, result in results.items():
        logger.info("cost of %s on webgpu", form)
        try:
            result.cost = webgpu.cost(result.path, feeds)
        except runtimes.RuntimeFailure as error:
            result.cost = f"does not run: {error}"
    names = list(results)
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in RUNTIMES:
            runtime = runtimes.get(name)
            for form in names[shift:] + names[:shift]:
                result = results[form]
                logger.info("round %d: %s on %s", round_ + 1, form, name)
                try:
                    session = runtime.load(result.path)
                    result.adapter = result.adapter or session.adapter
                    try:
                        first = session.run(feeds)
                        session.run(feeds)  # the first run compiles the shaders; the second is what each pays
                        result.load[name].append(session.creation_seconds)
                        result.run[name].append(session.last_run_seconds)
                    finally:
                        session.close()
                except runtimes.RuntimeFailure as error:
                    first = f"does not run: {error}"
                result.outputs.setdefault(name, first)
    # At wasm's default level onnxruntime fuses the original's integer ops (MatMulIntegerToFloat,
    # DynamicQuantizeMatMul), which round otherwise; at "basic" it fuses nothing.
    for form in ("original", "lowered"):
        logger.info("%s on wasm at optimize basic", form)
        try:
            session = runtimes.get("wasm").load(results[form].path, optimize="basic")
            try:
                results[form].outputs[BASIC] = session.run(feeds)
            finally:
                session.close()
        except runtimes.RuntimeFailure as error:
            results[form].outputs[BASIC] = f"does not run: {error}"
    return results


def _median(values: Sequence[float]) -> str:
    return harness.format_time(statistics.median(values)) if values else "-"


def _same(results: Mapping[str, FormCost], runtime: str, form: str) -> str:
    """Whether the form's outputs on ``runtime`` are the original's there, every bit."""
    expected, actual = results["original"].outputs.get(runtime), results[form].outputs.get(runtime)
    if isinstance(expected, str) or isinstance(actual, str) or expected is None or actual is None:
        return "-"
    return "yes" if harness.same_outputs(expected, actual) else "**no**"


def _op_types(nodes: Sequence[str]) -> str:
    counts = collections.Counter(node.split(" ")[0] for node in nodes if node.split(" ")[0] not in web.COPIES)
    return ", ".join(f"{op_type} {count}" for op_type, count in counts.most_common())


def _launching(cost: web.Cost | str | None) -> str:
    """The nodes on WebGPU but copies and the ops that launch no kernel (WebGpu.no_dispatch): what
    the dispatches should number, one each; "-" where the placement log did not name them."""
    listed = cost.placement.get("WebGpuExecutionProvider", []) if isinstance(cost, web.Cost) else ["?"]
    if "?" in listed:
        return "-"
    return f"{sum(node.split(' ')[0] not in (*web.COPIES, *web.WebGpu.no_dispatch) for node in listed):,}"


def render(results: Mapping[str, FormCost], *, model: Path, feeds: Mapping[str, np.ndarray], target: str,
           variant: str, repeats: int) -> str:
    """The report: a ``## `` section for BENCHMARKS.md."""
    adapter = next((result.adapter for result in results.values() if result.adapter), None)
    shapes = ", ".join(f"{name} {list(array.shape)}" for name, array in feeds.items())
    rows, placed = [], []
    for form, result in results.items():
        cost = result.cost
        calls = [f"{getattr(cost.inference, key):,}" if isinstance(cost, web.Cost) else "-"
                 for key in ("dispatches", "submits", "readbacks")]
        nodes = (", ".join(f"{n:,} {p}" for p, n in cost.nodes.items()) + f", {cost.copies} copies"
                 if isinstance(cost, web.Cost) else str(cost))
        rows.append([form, *calls, _launching(cost), nodes, _median(result.load["webgpu"]),
                     _median(result.load["wasm"]), _median(result.run["webgpu"]), _median(result.run["wasm"]),
                     f"{result.size / 2**20:.2f} MiB",
                     *(["(another model)"] * 3 if form == "fp32"
                       else [_same(results, key, form) for key in (*RUNTIMES, BASIC)])])
        if isinstance(cost, web.Cost):
            for provider, listed in cost.placement.items():
                # every node on one provider, their number changed by the optimizer: the file's
                if set(listed) == {"?"}:
                    graph = onnx.load(result.path, load_external_data=False).graph.node
                    listed = [f"{node.op_type} ({node.name})" for node in graph if node.op_type != "Constant"]
                    provider += (f" (all {len(cost.placement[provider]):,} after onnxruntime's optimizer; "
                                 "of the file's nodes)")
                placed.append(f"- {form}, {provider}: {_op_types(listed)}")
    headers = ["form", "dispatches / inference", "submits / inference", "readbacks / inference",
               "WebGPU nodes that launch a kernel", "nodes per provider",
               "load, webgpu (SwiftShader)", "load, wasm", "inference, webgpu (SwiftShader)", "inference, wasm",
               "file", "outputs = original's, webgpu", "outputs = original's, wasm",
               "outputs = original's, wasm at optimize basic"]
    lines = [
        "## GPU cost of a transformer (webgpu)", "",
        f"`python -m tools.gpu_cost {model.name}` on {model.name}: original = quantize_dynamic as transformers.js's q8 "
        f"(QInt8, per_channel, reduce_range), lowered = `dql-pass lower --target {target}` (variant `{variant}`), "
        "fp32 = "
        f"the float model. Inputs: {shapes}. onnxruntime-web {web.ORT_WEB} in headless Chromium; WebGPU adapter: "
        f"{adapter or 'unknown'}. Counts are per warm inference (the second run of a session), counted at the page's "
        "WebGPU API; times are medians of "
        f"{repeats} sessions per form, interleaved, taken in the page (session creation; one warm inference). "
        "**No real GPU ran WebGPU here**: the webgpu times are SwiftShader's, a CPU emulation of a GPU (a real "
        "one ran the CUDA provider: \"Time on a real GPU\").", "",
        *harness.table(headers, rows), "",
        "Nodes per provider by op type (Memcpy copies apart):", "", *placed, "",
    ]
    return "\n".join(lines)


def model_arguments(parser: argparse.ArgumentParser) -> None:
    """The float model and its inputs, as this tool and ``tools.cuda_time`` take them."""
    parser.add_argument("model", type=Path, help="a float32 ONNX model")
    parser.add_argument("--feeds", type=Path,
                        help="an .npz of the model's inputs (e.g. sentences.npz of tools/export_minilm.py)")
    parser.add_argument("--sequence", type=int, default=16, help="a made-up input's sequence length (default 16)")


def model_feeds(args: argparse.Namespace, batch: int) -> dict[str, np.ndarray]:
    """The inputs of ``args.model`` that :func:`model_arguments` asked for: ``batch`` rows."""
    given = dict(np.load(args.feeds)) if args.feeds else {}
    return feeds_for(onnx.load(args.model, load_external_data=False), given, batch, args.sequence)


def report(text: str, out: Path | None) -> int:
    """``text`` printed, and written into the report ``out`` when there is one; exit status 0."""
    print(text)
    if out:
        harness.write_report(out, text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(parser)
    parser.add_argument("--batch", type=int, default=20, help="rows of the inputs (default 20)")
    parser.add_argument("--target", default="webgpu", help="the runtime `lower` targets (default webgpu)")
    parser.add_argument("--variant", help="lower with this DynamicQuantizeLinear variant in place of the target's")
    parser.add_argument("--repeats", type=int, default=3,
                        help="sessions per form and runtime for the times (default 3)")
    parser.add_argument("--runtime-timeout", type=seconds, default=TIMEOUT, metavar="SECONDS",
                        help=f"how long a load or a run may take on each runtime (default {TIMEOUT})")
    parser.add_argument("--out", type=Path, help="write the section into this report (e.g. BENCHMARKS.md)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    if (missing := web.missing()) is not None:
        print(f"error: the web runtimes are not set up: {missing}", file=sys.stderr)
        return 2
    if not args.model.is_file():
        print(f"error: no model at {args.model}", file=sys.stderr)
        return 2
    target_variant = args.variant or runtimes.get(args.target).variant
    with tempfile.TemporaryDirectory(prefix="dql_pass.gpu_cost.") as folder:
        original, lowered = Path(folder, "model_quantized.onnx"), Path(folder, "model_lowered.onnx")
        logger.info("quantizing %s as transformers.js does", args.model)
        quantize_like_transformers_js(args.model, original)
        logger.info("lowering for %s (variant %s)", args.target, target_variant)
        lower_model(original, lowered, args.target, args.variant)
        feeds = model_feeds(args, args.batch)
        results = measure({"original": original, "lowered": lowered, "fp32": args.model}, feeds, args.repeats,
                          args.runtime_timeout)
        text = render(results, model=args.model, feeds=feeds, target=args.target, variant=target_variant,
                      repeats=args.repeats)
    return report(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
