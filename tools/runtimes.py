"""The runtime matrix of issue 11: one command measures every figure of ``RUNTIMES.md``.

Run from the repository root::

    python -m tools.runtimes [--quick] [--out docs/RUNTIMES.md] [--runtime NAME ... [--merge]]

``--runtime`` measures only the runtimes named, and the report has only their rows; with ``--merge``
it keeps the other runtimes' rows and sections of the report ``--out`` holds, as they were written
(:mod:`tools.runtimes_kept`), and each section names the run (date, commit) it came from: a
runtime that is not installed here, or slow, is re-measured alone.

What it measures, for every runtime of :data:`dql_pass.runtimes.RUNTIMES`:

1. Its version, or that it is not installed, with what installs it and the import error.
2. Bit-exactness of the native DQL node, of each expansion variant and of ``--target`` (the
   runtime's :attr:`~dql_pass.runtimes.Runtime.variant` variant), against
   :func:`dql_pass.reference.dynamic_quantize_linear` (y, y_scale, y_zero_point, every bit), on
   the finite, the ±inf and the empty parts of :func:`dql_pass.inputs.cases` and on inputs
   built apart from the catalogue (:func:`dql_pass.inputs.independent_inputs`); at ai.onnx opset 21 and 13.
3. Per runtime and form, the inputs that still differ: grouped by the known difference
   (:meth:`~dql_pass.runtimes.Runtime.differences`) that explains them, or flagged UNKNOWN with
   their input classes and one example.
4. Whether the sample models in ``models/`` and a ``quantize_dynamic`` transformer load and run
   once expanded for the runtime's target, the op that blocks them where they do not, and whether
   their outputs equal ORT's on the original, bit for bit.
5. On the runtimes that tell where each node runs (the web runtimes' ``placement``), how many nodes
   of each form, at every opset, and of each expanded model go to each execution provider, and the
   op types that fall back to the CPU; for each expanded model, on the runtimes that count it (the
   web runtimes' ``cost``), the GPU work of one inference: dispatches, submits and readbacks.

It also lists the runtimes left out (:data:`LEFT_OUT`) with the reason, measured once by hand, not here.

Rules:

- Each runtime runs in its own process: a runtime that crashes or hangs costs its own rows only
  (reported with the reason), never the run. The processes run two at a time. A process that dies
  loading a form or running an input is started again, and that load or input is not tried again:
  it reads as a refusal, "the process died" (:class:`Watch`).
- A form that does not load or run is reported with the runtime's one-line reason, never raised.
- Every model runs through :mod:`dql_pass.runtimes`; the zero-range policy is ``onnxruntime``.
- Compilers build per input shape, so the independent inputs come in a few shapes only, and on the
  compilers (:data:`COMPILERS`, some 25 ms a run) only the target form gets all of them; the
  catalogue is whole on every runtime and form. A shape that was refused three times running is
  not tried again for that form (a refused compile costs as much as a good one).
- Exit status 1 when any difference is UNKNOWN (no known difference of the runtime explains it).
- ``--quick`` is a smoke run: opset 21 only, few independent inputs, a small transformer.
"""

from __future__ import annotations

__all__ = ["CONFIGS", "Config", "FormResult", "ModelResult", "Placement", "RuntimeResult", "main",
           "measure_runtime", "placement", "render", "run"]

import argparse
import collections
import copy
import dataclasses
import datetime
import functools
import importlib
import logging
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import onnx
import onnx_ir as ir

import dql_pass
from dql_pass import inputs, op, runtimes
from dql_pass.compare import bit_difference, compare_site
from dql_pass.graph.walk import ops_used
from dql_pass.reference import dynamic_quantize_linear
from dql_pass.runtimes import Runtime, RuntimeFailure
from dql_pass.runtimes.ort import OnnxRuntime
from dql_pass.runtimes.web import COPIES, GpuCalls
from dql_pass.runtimes.web.browser import chromium
from tools import family_runtimes, harness, models, runtimes_kept

logger = logging.getLogger("runtimes")
T = TypeVar("T")

POLICY = "onnxruntime"
NATIVE = "native"
TARGET = "--target"
PARTS = ("finite", "±inf", "empty", "independent")
COMPILERS = ("tinygrad", "tvm", "iree", "litert", "litert-xnnpack")  # build per input shape: fewer independent inputs
# Runtimes given more than the config's timeout, whose processes start first: the browsers load a
# model per rank of every form (the catalogue has six ranks) and run every input on SwiftShader;
# LiteRT converts each input shape in an onnx2tf process of its own (1 to 4 s each, some 200 shapes).
SLOWER = {"webgpu": 2, "wasm": 2, "litert": 4, "litert-xnnpack": 4}
SAMPLE_MODELS = ("mlp_dynamic.onnx", "conv_dynamic.onnx", "opset21_dynamic.onnx", "relu_dql.onnx", "control_flow.onnx")
# Runtimes without an adapter, and why: measured once by hand, not re-run here (runtime, version, reason).
LEFT_OUT = (
    ("ncnn", "pnnx 20261020", "nothing loads, not even the expansions: no Equal, Less, Where or uint8 Cast layers, "
     "division up to 2 ulp off, a float literal pnnx cannot parse back"),
)


@dataclasses.dataclass(frozen=True)
class Config:
    opsets: tuple[int, ...]
    independent: int  # inputs built apart from the catalogue, for the target and on fast runtimes every form
    independent_on_compilers: int  # for the other forms on compilers
    transformer: models.TransformerShape
    # seconds per runtime before its process is stopped (times SLOWER's factor for the runtimes it names)
    timeout: float


CONFIGS: dict[str, Config] = {
    "full": Config(opsets=(21, 13), independent=1200, independent_on_compilers=200, transformer=models.MINILM,
                   timeout=900.0),
    "quick": Config(opsets=(21,), independent=50, independent_on_compilers=20,
                    transformer=models.TransformerShape(layers=1, hidden=64, heads=4, intermediate=128, seq=16),
                    timeout=300.0),
}


# ---------------------------------------------------------------------------------------------
# Inputs


def _parts(independent: int) -> dict[str, list[tuple[str, np.ndarray]]]:
    """The inputs of each part of :data:`PARTS` (NaN inputs are outside the contract)."""
    parts: dict[str, list[tuple[str, np.ndarray]]] = {part: [] for part in PARTS}
    for case in inputs.cases():
        if not case.comparable:
            continue
        part = "empty" if not case.x.size else "±inf" if np.isinf(case.x).any() else "finite"
        parts[part].append((case.name, case.x))
    parts["independent"] = inputs.independent_inputs(independent)
    return parts


# ---------------------------------------------------------------------------------------------
# Measuring one runtime


@dataclasses.dataclass
class FormResult:
    """One form on one runtime at one opset: passed and total per part, and why the rest differ."""

    counts: dict[str, list[int]] = dataclasses.field(default_factory=lambda: {part: [0, 0] for part in PARTS})
    failure: str | None = None  # the first load or run refusal, one line
    known: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # reason -> inputs
    unknown: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # classes -> example input names + detail
    adapter: str | None = None  # the GPU adapter the sessions ran on, where the runtime names one

    @property
    def passed(self) -> int:
        return sum(p for p, _ in self.counts.values())

    @property
    def total(self) -> int:
        return sum(t for _, t in self.counts.values())


@dataclasses.dataclass
class Placement:
    """Where a model's nodes ran: the nodes each execution provider was given (the Memcpy nodes the
    runtime added apart), and the op types of those on the CPU; or why the model did not load."""

    providers: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # provider -> nodes
    memcpy: int = 0
    on_cpu: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # op type -> nodes
    failure: str | None = None
    inference: GpuCalls | None = None  # the GPU work of one inference, where the runtime counts it


@dataclasses.dataclass
class ModelResult:
    model: str
    runs: bool
    same_as_ort: str  # the model's outputs against ORT's on the original: "yes" or the first difference
    sites: str  # DQL sites of the main graph whose three outputs equal ORT's, "k/n"
    detail: str  # the blocking op and the reason, or empty
    placement: Placement | None = None  # on a runtime that tells where nodes run


@dataclasses.dataclass
class RuntimeResult:
    name: str
    version: str | None
    install: str  # what installs it (Runtime.install_hint)
    variant: str  # the runtime's exact expansion variant
    import_error: str | None = None
    forms: dict[tuple[str, int], FormResult] = dataclasses.field(default_factory=dict)  # (form, opset)
    placements: dict[tuple[str, int], Placement] = dataclasses.field(default_factory=dict)  # (form, opset)
    models: list[ModelResult] = dataclasses.field(default_factory=list)
    error: str | None = None  # the process failed: crashed, timed out or raised
    seconds: float = 0.0


def _line(error: BaseException | str) -> str:
    """An error in one line: its first line and, for a chain of causes, its last (the root cause)."""
    text = error if isinstance(error, str) or isinstance(error, RuntimeFailure) else f"{type(error).__name__}: {error}"
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()] or [str(text)]
    return (lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}")[:400]


@functools.lru_cache(maxsize=None)
def _form_model(form: str, rank: int, opset: int) -> onnx.ModelProto:
    """The one-node model of ``rank`` (symbolic dimensions) at ``opset``, or its expansion in ``form``."""
    model = op.one_node_model([f"d{i}" for i in range(rank)], opset)
    return model if form == NATIVE else dql_pass.expand(model, variant=form, runtime=None)[0]


class Watch:
    """A measuring process's steps told to its parent (the loads and runs that may crash the
    runtime), and the steps that killed a process before it: not taken again, they read as refusals."""

    def __init__(self, send=None, deaths: Mapping[tuple, str] | None = None) -> None:
        self.send = send
        self.deaths = dict(deaths or {})  # step -> how its process died

    def begin(self, step: tuple) -> str | None:
        """How ``step`` killed a process before, or None once the parent knows it begins."""
        if (death := self.deaths.get(step)) is not None:
            return death
        if self.send is not None:
            self.send.send(("begin", step))
        return None

    def end(self) -> None:
        if self.send is not None:
            self.send.send(("end", None))


def _run_by_rank(
    runtime: Runtime, form: str, opset: int, arrays: Sequence[np.ndarray], watch: Watch | None = None
) -> tuple[list[list[np.ndarray] | str], str | None]:
    """The outputs of each array, or the refusal in one line, and the GPU adapter where the runtime
    names one. One session per rank, loaded when its first array comes and closed after its last,
    so that one is open at a time (a web runtime that recycles hands its page to the next); a
    refusal to load is given for every array of the rank. A shape refused three times running is
    not run again: the refusal is given for it (a refused compile costs as much as a good one).
    ``watch`` tells each load and run before it begins, and skips those that killed a process."""
    watch = watch or Watch()
    outcomes: list[list[np.ndarray] | str] = [""] * len(arrays)
    adapter = None
    for rank in sorted({x.ndim for x in arrays}):
        if (death := watch.begin((form, opset, "load", rank))) is not None:
            session, loading = None, f"does not load: {death}"
        else:
            try:
                session = runtime.load(_form_model(form, rank, opset))
                adapter = adapter or getattr(session, "adapter", None)
            except Exception as error:  # noqa: BLE001 - any refusal, an adapter's bug included, is a row
                session, loading = None, f"does not load: {_line(error)}"
            watch.end()
        refusals: dict[tuple[int, ...], tuple[str, int]] = {}  # shape -> last refusal, times in a row
        for i, x in enumerate(arrays):
            if x.ndim != rank:
                continue
            if session is None:
                outcomes[i] = loading
                continue
            refusal, times = refusals.get(x.shape, ("", 0))
            if times >= 3:
                outcomes[i] = refusal
                continue
            if (death := watch.begin((form, opset, "run", i))) is not None:
                outcomes[i] = f"does not run: {death}"
                continue
            try:
                with np.errstate(all="ignore"):
                    outcomes[i] = session.run({op.INPUT: x})
                refusals.pop(x.shape, None)
            except Exception as error:  # noqa: BLE001
                outcomes[i] = line = f"does not run: {_line(error)}"
                refusals[x.shape] = (line, times + 1 if line == refusal else 1)
            watch.end()
        if session is not None:
            session.close()
    return outcomes, adapter


def _measure_form(
    runtime: Runtime, form: str, opset: int, parts: dict[str, list[tuple[str, np.ndarray]]], watch: Watch | None = None
) -> FormResult:
    result = FormResult()
    cases = [(part, name, x) for part, arrays in parts.items() for name, x in arrays]
    outcomes, result.adapter = _run_by_rank(runtime, form, opset, [x for _, _, x in cases], watch)
    # A refusal of an op the runtime declares it lacks is a known difference, not a surprise.
    lacks = _lacks(runtime, _form_model(form, 1, opset))
    for (part, name, x), actual in zip(cases, outcomes):
        expected = dynamic_quantize_linear(x, POLICY)
        result.counts[part][1] += 1
        if isinstance(actual, str):
            result.failure = result.failure or actual
            detail = actual
        else:
            difference = compare_site(actual, expected)
            if difference is None:
                result.counts[part][0] += 1
                continue
            detail = difference.detail
        reasons = [lacks] if isinstance(actual, str) and lacks else runtime.differences(x, form, POLICY)
        for reason in reasons:
            result.known[reason] += 1
        if not reasons:
            # A refusal is one difference whatever the input; wrong bits are told apart by input class.
            key = actual if isinstance(actual, str) else inputs.describe(inputs.input_classes(x, POLICY))
            result.unknown.setdefault(key, []).append(f"{name}: {_line(detail)}")
    return result


CPU = "CPUExecutionProvider"


def placement(
    runtime: Runtime, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None = None
) -> Placement | None:
    """Where ``runtime`` runs the nodes of ``model``, and with ``feeds`` the GPU work of an
    inference on them where the runtime counts it; None for a runtime that does not tell."""
    if not hasattr(runtime, "placement"):
        return None
    inference = None
    try:
        if feeds is not None and hasattr(runtime, "cost"):
            cost = runtime.cost(model, feeds)
            placed, inference = cost.placement, cost.inference
        else:
            placed = runtime.placement(model)
    except Exception as error:  # noqa: BLE001 - a refusal is the row's content
        return Placement(failure=f"does not load: {_line(error)}")
    result = Placement(inference=inference)
    for provider, nodes in placed.items():
        op_types = [node.split(" ")[0] for node in nodes]
        result.memcpy += sum(op_type in COPIES for op_type in op_types)
        result.providers[provider] = sum(op_type not in COPIES for op_type in op_types)
        if provider == CPU:
            result.on_cpu.update(op_type for op_type in op_types if op_type not in COPIES)
    return result


def _op_types(model: onnx.ModelProto) -> set[tuple[str, str]]:
    return ops_used(ir.serde.deserialize_model(model))


def _lacks(runtime: Runtime, model: onnx.ModelProto) -> str:
    """What of ``model`` the runtime declares it lacks, in one line; empty when nothing."""
    opset = op.ai_onnx_opset({o.domain: o.version for o in model.opset_import}) or op.MAX_OPSET
    lacks = runtimes.lacking(runtime.name, _op_types(model), opset)
    if not lacks:
        return ""
    return (f"lacks {', '.join(f'{lack.op_type}-{lack.since_version}' for lack in lacks)} "
            f"(measured on {lacks[0].measured}: {lacks[0].reason})")


def _blocking(runtime: Runtime, model: onnx.ModelProto, error: str) -> str:
    """The ops of ``model`` that ``runtime`` is known to lack, else those its ``error`` names."""
    lacks = _lacks(runtime, model)
    if lacks:
        return lacks
    named = sorted({op_type for _, op_type in _op_types(model) if re.search(rf"\b{op_type}\b", error)})
    return (f"blocked by {', '.join(named)}: " if named else "") + error


def _with_site_outputs(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with the outputs of its main graph's DQL sites as graph outputs too, and their count."""
    model = copy.deepcopy(model)
    outputs = {o.name for o in model.graph.output}
    sites = [n for n in model.graph.node if n.op_type == op.NAME and n.domain in op.DOMAINS]
    for node in sites:
        for name, data_type in zip(node.output, op.OUTPUT_TYPES):
            if name and name not in outputs:
                model.graph.output.append(onnx.helper.make_tensor_value_info(name, int(data_type), None))
                outputs.add(name)
    return model, len(sites)


def _check_model(runtime: Runtime, name: str, original: onnx.ModelProto) -> ModelResult:
    """Expanded for ``runtime``'s target, does ``original`` load and run there, with ORT's bits?

    The DQL sites' outputs are graph outputs on both sides, so a difference is placed: at the
    sites, or only in the float ops after them.
    """
    original, site_count = _with_site_outputs(original)
    feeds = models.random_feeds(original, np.random.default_rng(0), size=2)
    # ORT's own provider where the runtime is one: another provider's float kernels round otherwise.
    reference = runtime if isinstance(runtime, OnnxRuntime) else runtimes.get("onnxruntime")
    expected = reference.load(original).run(feeds)
    expanded = dql_pass.expand(original, variant=runtime.variant, runtime=None)[0]
    try:
        actual = runtime.load(expanded).run(feeds)
    except Exception as error:  # noqa: BLE001 - a refusal is the row's content
        return ModelResult(name, False, "-", "-", _blocking(runtime, expanded, _line(error)))
    names = [o.name for o in original.graph.output]
    differences = [bit_difference(n, a, e, any_nan=True) for n, a, e in zip(names, actual, expected)]
    first = len(differences) - 3 * site_count
    model_difference = next((d.text for d in differences[:first] if d is not None), None)
    sites = sum(all(d is None for d in differences[first + 3 * i:first + 3 * i + 3]) for i in range(site_count))
    return ModelResult(name, True, model_difference or "yes", f"{sites}/{site_count}", "",
                       placement(runtime, expanded, feeds))


def _sample_models(transformer: Path) -> dict[str, onnx.ModelProto]:
    found = {name: harness.REPO / "models" / name for name in SAMPLE_MODELS}
    found = {name: path for name, path in found.items() if path.is_file()}
    return {**{name: onnx.load(path) for name, path in found.items()}, "quantized transformer": onnx.load(transformer)}


def measure_runtime(name: str, config: Config, transformer: Path, watch: Watch | None = None) -> RuntimeResult:
    """Everything RUNTIMES.md says of runtime ``name``."""
    began = time.perf_counter()
    runtime = runtimes.get(name)
    result = RuntimeResult(name, runtime.version(), runtime.install_hint(), runtime.variant)
    # Imported even when installed: a package that is found may still fail to import (onnx2torch
    # without torchvision), and is then not installable here, not a runtime that fails every input.
    try:
        importlib.import_module(runtime.module)
    except Exception as error:  # noqa: BLE001 - the import error is what the report gives
        result.import_error = _line(error)
    if result.import_error or not runtime.installed():
        return result
    # A browser runtime starts Chromium, onnxruntime-web and the WebGPU device once, not per model.
    with runtime.recycling():
        _measure_installed(runtime, config, transformer, result, watch)
    result.seconds = time.perf_counter() - began
    return result


def _measure_installed(
    runtime: Runtime, config: Config, transformer: Path, result: RuntimeResult, watch: Watch | None = None
) -> None:
    name = runtime.name
    parts = _parts(config.independent)
    # Older opsets only where a form compiles fast: on compilers each shape of the catalogue costs a build.
    for opset in config.opsets if name not in COMPILERS else config.opsets[:1]:
        for form in (NATIVE, *op.VARIANTS):
            # The independent inputs at the newest opset only: the older one checks the catalogue.
            count = 0 if opset != config.opsets[0] else (
                config.independent if form == runtime.variant or name not in COMPILERS
                else config.independent_on_compilers)
            logger.info("%s: %s at opset %d", name, form, opset)
            result.forms[(form, opset)] = _measure_form(runtime, form, opset,
                                                        {**parts, "independent": parts["independent"][:count]}, watch)
            if (placed := placement(runtime, _form_model(form, 1, opset))) is not None:
                result.placements[(form, opset)] = placed
    for model_name, model in _sample_models(transformer).items():
        logger.info("%s: %s", name, model_name)
        result.models.append(_check_model(runtime, model_name, model))


def _child(name: str, config: Config, transformer: Path, send, deaths: Mapping[tuple, str]) -> None:
    logging.basicConfig(format="%(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    try:
        send.send(measure_runtime(name, config, transformer, Watch(send, deaths)))
    except Exception as error:  # noqa: BLE001 - reported in the runtime's row
        send.send(_line(error))


def _in_processes(
    names: Sequence[str], config: Config, transformer: Path, parallel: int, child: Callable = _child
) -> dict[str, RuntimeResult]:
    """Each runtime measured in its own process (``child`` its measurement), ``parallel`` at a time;
    a process that dies in a step its :class:`Watch` told is started again, without that step (its
    time limit runs on)."""
    context = multiprocessing.get_context("spawn")
    # The compilers and the browsers take longest: they start first, the others share the remaining processes.
    waiting, running, results = sorted(names, key=lambda n: n not in COMPILERS and n not in SLOWER), {}, {}
    deaths: dict[str, dict[tuple, str]] = collections.defaultdict(dict)  # runtime -> step -> how it died
    steps: dict[str, tuple | None] = {}  # runtime -> the step its process is in, if any

    def start(name: str, began: float) -> None:
        receive, send = context.Pipe(duplex=False)
        process = context.Process(target=child, args=(name, config, transformer, send, deaths[name]), daemon=True)
        process.start()
        running[name], steps[name] = (process, receive, began), None

    while waiting or running:
        while waiting and len(running) < parallel:
            start(waiting.pop(0), time.perf_counter())
        told = False  # a step was told: read again at once, lest a fast runtime wait on a full pipe
        for name, (process, receive, began) in list(running.items()):
            error, answer = None, None
            alive = process.is_alive()  # asked first: a process dead by now has sent all it will
            while answer is None and receive.poll():
                try:
                    message = receive.recv()
                except EOFError:  # the process has closed its end: it is gone, or going
                    break
                told = True
                if isinstance(message, tuple):
                    steps[name] = message[1] if message[0] == "begin" else None
                else:
                    answer = message
            if answer is not None:
                process.join()
                if isinstance(answer, RuntimeResult):
                    if deaths[name]:  # its processes' time together
                        answer.seconds = time.perf_counter() - began
                    results[name] = answer
                    del running[name]
                    continue
                error = f"the measurement raised {answer}"
            elif not alive:
                process.join()
                error = f"the process died (exit code {process.exitcode})"
                if (step := steps[name]) is not None and step not in deaths[name]:
                    logger.warning("%s: %s in %s; started again without it", name, error, step)
                    deaths[name][step] = error
                    start(name, began)
                    continue
            elif time.perf_counter() - began > (timeout := config.timeout * SLOWER.get(name, 1)):
                process.kill()
                process.join()
                error = f"stopped after {timeout:.0f} s"
            if error is not None:
                runtime = runtimes.get(name)
                results[name] = RuntimeResult(name, runtime.version(), runtime.install_hint(), runtime.variant,
                                              error=error)
                del running[name]
        time.sleep(0 if told else 0.2)
    return {name: results[name] for name in names}


# ---------------------------------------------------------------------------------------------
# The report


def _cell(passed: int, total: int) -> str:
    if not total:
        return "-"
    return f"{passed}/{total}" if passed == total else f"**{passed}/{total}**"


def _forms(result: RuntimeResult) -> list[tuple[str, str]]:
    """(label, form) of each column: native, each variant, and --target (its variant)."""
    return [(NATIVE, NATIVE), *[(v, v) for v in op.VARIANTS], (f"{TARGET} ({result.variant})", result.variant)]


def _each_form(
    result: RuntimeResult, opsets: Sequence[int], found: Mapping[tuple[str, int], T]
) -> Iterator[tuple[int, str, T]]:
    """(opset, column label, what ``found`` holds for the form at that opset), in the report's order."""
    for opset in opsets:
        for label, form in _forms(result):
            if (value := found.get((form, opset))) is not None:
                yield opset, label, value


def _version(result: RuntimeResult) -> str:
    if result.version is None or result.import_error:
        why = f" ({result.import_error})" if result.import_error else ""
        return f"not installed{why}; {result.install}"
    return result.version


def _summary(results: Sequence[RuntimeResult], opset: int, kept: runtimes_kept.Kept | None = None) -> list[str]:
    headers = ["runtime", "version", NATIVE, *op.VARIANTS, f"{TARGET} (its variant)"]
    measured = {result.name: result for result in results}
    rows = []
    for name in _in_order(measured, kept):
        if name not in measured:
            if (row := kept.row(opset, name, headers)) is not None:
                rows.append(row)
            continue
        result = measured[name]
        # A runtime not measured at this opset (a compiler at an older one) has no row; one not measured at all has.
        if result.forms and (NATIVE, opset) not in result.forms:
            continue
        cells = []
        for label, form in _forms(result):
            form_result = result.forms.get((form, opset))
            cell = _cell(form_result.passed, form_result.total) if form_result else "-"
            cells.append(f"{cell} ({form})" if label.startswith(TARGET) else cell)
        rows.append([f"`{result.name}`",
                     _version(result) if not result.error else f"{_version(result)}: {result.error}", *cells])
    return harness.table(headers, rows)


def _in_order(measured: Mapping[str, RuntimeResult], kept: runtimes_kept.Kept | None) -> list[str]:
    """The runtimes of the report: those measured and, merging, those kept; in the registry's order."""
    names = [*measured, *(kept.sections if kept else ())]
    order = list(runtimes.RUNTIMES)
    return sorted(dict.fromkeys(names), key=lambda n: (order.index(n) if n in order else len(order), n))


def _details(result: RuntimeResult, opsets: Sequence[int], run: str = "") -> list[str]:
    lines = [f"### {result.name}", ""]
    if result.error or not result.forms:
        lines += [f"Not measured: {result.error or _version(result)}.", ""]
        return lines
    adapters = sorted({f.adapter for f in result.forms.values() if f.adapter})
    lines += [f"Version {result.version}; target variant `{result.variant}`; measured in {result.seconds:.0f} s{run}"
              + (f"; WebGPU adapter {', '.join(adapters)} (vendor, architecture)" if adapters else "") + ".", ""]
    rows = [[str(opset), label, *[_cell(*form_result.counts[p]) for p in PARTS],
             _cell(form_result.passed, form_result.total), form_result.failure or ""]
            for opset, label, form_result in _each_form(result, opsets, result.forms)]
    lines += harness.table(["opset", "form", *PARTS, "all", "first refusal"], rows) + [""]
    differing = []
    for opset in opsets:
        for form in (NATIVE, *op.VARIANTS):
            form_result = result.forms.get((form, opset))
            if form_result is None:
                continue
            for reason, count in form_result.known.most_common():
                differing.append(f"- opset {opset}, {form}: {count} inputs, known: {reason}")
            for classes, examples in form_result.unknown.items():
                what = classes if classes.startswith("does not") else f"classes: {classes}"
                differing.append(f"- opset {opset}, {form}: **UNKNOWN difference** on {len(examples)} inputs "
                                 f"({what}), e.g. {examples[0]}")
    lines += (["Inputs that still differ, and why:", "", *differing, ""] if differing
              else ["Every input is bit-exact in every form.", ""])
    lines += _placement_table(result, opsets)
    placed = any(m.placement for m in result.models)
    counted = any(m.placement and m.placement.inference and m.placement.inference.submits for m in result.models)
    rows = [[m.model, "yes" if m.runs else "**no**", m.sites, m.same_as_ort if m.same_as_ort in ("yes", "-")
             else f"**no**: {m.same_as_ort}", *([_on_cpu(m.placement)] if placed else []),
             *([_gpu_calls(m.placement)] if counted else []), m.detail]
            for m in result.models]
    lines += [f"Models expanded with `--target {result.name}` (variant `{result.variant}`):", "",
              *harness.table(["model", "loads and runs", "DQL sites with ORT's bits", "outputs with ORT's bits",
                              *(["nodes on the CPU"] if placed else []),
                              *(["GPU calls per inference"] if counted else []), "what blocks"], rows), ""]
    return lines


def _op_counts(counts: collections.Counter) -> str:
    return ", ".join(f"{count} {op_type}" for op_type, count in sorted(counts.items(), key=lambda c: (-c[1], c[0])))


def _on_cpu(placed: Placement | None) -> str:
    """The nodes on the CPU of all the runtime placed, and their op types: "0 of 95", "2 of 20: 2 Round"."""
    if placed is None:
        return "-"
    if placed.failure:
        return placed.failure
    cpu, total = placed.providers[CPU], sum(placed.providers.values())
    if cpu == total:
        return f"all {total}"
    return f"{cpu} of {total}" + (f": {_op_counts(placed.on_cpu)}" if cpu else "")


def _gpu_calls(placed: Placement | None) -> str:
    """One inference's WebGPU calls: "297 dispatches, 26 submits, 7 readbacks"; "-" where not counted."""
    calls = placed.inference if placed else None
    if calls is None:
        return "-"
    return f"{calls.dispatches:,} dispatches, {calls.submits:,} submits, {calls.readbacks:,} readbacks"


def _placement_table(result: RuntimeResult, opsets: Sequence[int]) -> list[str]:
    """Per form and opset, the nodes each execution provider ran and the op types that fell back to the CPU."""
    if not result.placements:
        return []
    providers = sorted({p for placed in result.placements.values() for p in placed.providers},
                       key=lambda p: (p == CPU, p))
    fallback = providers != [CPU]  # on a CPU-only runtime nothing falls back
    rows = []
    for opset, label, placed in _each_form(result, opsets, result.placements):
        if placed.failure:
            rows.append([str(opset), label, *["-"] * (len(providers) + 1 + fallback), placed.failure])
            continue
        rows.append([str(opset), label, *[str(placed.providers[p]) for p in providers], str(placed.memcpy),
                     *([_op_counts(placed.on_cpu) or "none"] if fallback else []), ""])
    headers = ["opset", "form", *[f"nodes on {p}" for p in providers], "Memcpy nodes added",
               *(["op types on the CPU"] if fallback else []), "refusal"]
    return ["Where the nodes run (the rank-1 model of each form, after the runtime's own optimizations, as "
            "onnxruntime's verbose placement log gives them):", "", *harness.table(headers, rows), ""]


def _chromium_version() -> str:
    path = chromium()
    if path is None:
        return "not installed"
    try:
        return subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"{path}: --version failed ({_line(error)})"


def unknown_count(results: Sequence[RuntimeResult]) -> int:
    return sum(len(examples) for r in results for f in r.forms.values() for examples in f.unknown.values())


def render(
    results: Sequence[RuntimeResult], mode: str, config: Config, seconds: float, kept: runtimes_kept.Kept | None = None
) -> str:
    """The report of ``results``; merging, with the rows and sections of ``kept`` of the runtimes not measured."""
    measured = {result.name: result for result in results}
    others = [name for name in _in_order(measured, kept) if name not in measured]
    missing = [r.name for r in results if r.version is None or r.import_error]
    missing += [name for name in (kept.not_installable if kept else ()) if name in others]
    failed = [r.name for r in results if r.error]
    unknown = unknown_count(results) + sum(kept.unknown(name) for name in others if kept)
    now = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}"
    run = f" in the run of {now} at commit {harness.git_commit()} on {harness.machine()}"
    command = " ".join(["python -m tools.runtimes", *(["--quick"] if mode == "quick" else []),
                        *([f"--runtime {name}" for name in measured] + ["--merge"] if kept else [])])
    lines = [
        "# Runtimes",
        "",
        f"Written by `{command}` on {now} in {seconds:.0f} s"
        + (f", which measured {', '.join(measured)}; the rows and sections of {', '.join(others)} were kept from "
           "the file as it was, each section naming the run it came from (a column that run did not have reads -). "
           "Regenerate it whole with `python -m tools.runtimes`" if kept and others
           else "; regenerate it with the same command")
        + ", do not edit it by hand."
        + (" **This is a `--quick` smoke run: few inputs, one opset, a small transformer.**"
           if mode == "quick" else ""),
        "",
        "Each cell is inputs passed / inputs run, bit for bit on all three outputs (y, y_scale, y_zero_point) "
        "against the NumPy reference, zero-range policy `onnxruntime`. *native* is the DynamicQuantizeLinear node "
        "itself; the variants are `dql_pass.expand(model, variant=...)` of it; *--target* is the variant "
        "`dql-pass expand --target NAME` picks for the runtime. The inputs: the finite, ±inf and empty parts of "
        "`dql_pass.inputs.cases()`, and inputs built by `dql_pass.inputs.independent_inputs` apart from the "
        f"catalogue (seeded: random values at scales 1e-30 to 1e30, exact ties of x/scale and their neighbours, "
        "symmetric [-t, t] ranges, subnormal and underflowing scales, scales at the bottom of the normal range; "
        f"shapes {', '.join(map(str, inputs.INDEPENDENT_SHAPES))}; "
        f"{config.independent} of them, the first {config.independent_on_compilers} for the forms other than the "
        f"target on the compilers {', '.join(COMPILERS)}), "
        f"at opset {config.opsets[0]}" + (f"; opset {', '.join(map(str, config.opsets[1:]))} runs the catalogue only, "
                                          "and not on the compilers" if len(config.opsets) > 1 else "") + ".",
        "",
        f"Models: the samples in `models/` and a `quantize_dynamic` transformer ({config.transformer.layers} "
        f"layers, hidden {config.transformer.hidden}, sequence {config.transformer.seq}; `tools.models`), "
        "expanded with the runtime's target variant and run on it with seeded random inputs; ORT runs the "
        "original (on its CPU provider; on the CUDA provider for `onnxruntime-cuda`, whose float kernels are not "
        "the CPU's, with the DQL falling back to the CPU). The outputs of every DQL site of the main graph are "
        "made graph outputs on both sides, so a difference shows where it starts: at the sites, or only in the "
        "float ops after them (MatMul, LayerNormalization, Erf, which runtimes round differently).",
        "",
        "The web runtimes `webgpu` and `wasm` are onnxruntime-web in headless Chromium (set up by `python -m "
        "dql_pass.runtimes.web setup`), each model loaded in turn in a page that the one before handed on "
        "(`WebRuntime.recycling`; a failure starts a fresh browser); their tables of where the nodes run come from "
        "onnxruntime's verbose placement log. Without a GPU, Chromium's WebGPU adapter is SwiftShader, which runs "
        "on the CPU: `webgpu`'s rows are what the WebGPU provider computes there. SwiftShader divides exactly, "
        "where a GPU may be 2.5 ulp off; `tools/gpu_divider.py` checks the variants against such a divider on ORT.",
        "",
        "## Machine and versions",
        "",
        "Of this run" + (f" (it measured {', '.join(measured)}); each kept section names the run it came from, and "
                         "its machine if written since 2026-12-04" if kept and others else "") + ":",
        "",
        *harness.table(["item", "value"], [
            ["CPU model", harness.cpu_model()],
            ["GPU", ", ".join(harness.gpu_models()) or "none (nvidia-smi lists none)"],
            ["OS", platform.platform()],
            ["python", platform.python_version()],
            *[[d, harness.version(d)] for d in ("onnx", "onnxruntime", "numpy")],
            ["Chromium (webgpu, wasm)", _chromium_version()],
            ["dql_pass commit", harness.git_commit()],
        ]),
        "",
        "## Summary",
        "",
        f"Runtimes not installable here: {', '.join(missing) or 'none'}."
        + (f" Runtimes whose measurement failed: {', '.join(failed)}." if failed else ""),
        "",
        f"**{unknown} inputs differ for no known reason (UNKNOWN below).**" if unknown
        else "Every input that differs is explained by a known difference of its runtime.",
        "",
    ]
    for opset in config.opsets:
        lines += [f"All inputs, opset {opset}:", "", *_summary(results, opset, kept), ""]
    lines += ["## Left out", "",
              "Runtimes with no adapter, for the reason given; measured by a previous session, "
              "not re-run by this tool.",
              "", *harness.table(["runtime", "version", "reason"], [[f"`{n}`", v, r] for n, v, r in LEFT_OUT]), "",
              "## Per runtime", ""]
    for name in _in_order(measured, kept):
        lines += _details(measured[name], config.opsets, run) if name in measured else kept.sections[name]
    if kept and kept.tail:
        lines += [""] * (lines[-1] != "") + kept.tail
    return "\n".join(lines).rstrip() + "\n"


def run(
    mode: str, out: Path, names: Sequence[str] | None = None, parallel: int = 2, family: bool = False,
    kept: runtimes_kept.Kept | None = None,
) -> list[RuntimeResult]:
    """Measure ``names`` (default: every runtime) and write the report to ``out``, with the rows
    and sections of ``kept`` of the runtimes not measured."""
    config = CONFIGS[mode]
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="runtimes.") as scratch:
        logger.info("quantizing the transformer")
        transformer = models.quantize(models.minilm_model(config.transformer), Path(scratch), "transformer.onnx")
        results = list(_in_processes(list(names or runtimes.RUNTIMES), config, transformer, parallel).values())
    text = render(results, mode, config, time.perf_counter() - began, kept)
    if family:  # the family's sections, one per op, from the conformance suites
        text += "\n" + family_runtimes.sections(list(names or runtimes.RUNTIMES))
    out.write_text(text)
    logger.info("wrote %s", out)
    if unknown_count(results):
        logger.warning("%d inputs differ for no known reason: see UNKNOWN in %s", unknown_count(results), out)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few inputs, one opset, a small transformer")
    parser.add_argument("--out", type=Path, default=harness.REPO / "docs" / "RUNTIMES.md", help="the report to write")
    parser.add_argument("--runtime", action="append", choices=list(runtimes.RUNTIMES),
                        help="measure only this runtime (repeatable; default: all)")
    parser.add_argument("--family", action="store_true",
                        help="append a section per op of the quantization family (tools.family_runtimes)")
    parser.add_argument("--merge", action="store_true",
                        help="with --runtime: keep the other runtimes' rows and sections of --out as they are")
    args = parser.parse_args(argv)
    if args.merge and not args.runtime:
        parser.error("--merge needs --runtime: a run of every runtime rewrites the report whole")
    logging.basicConfig(format="%(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    if args.merge and args.family:
        parser.error("--merge keeps the family's sections as they are: run --family without --merge")
    kept = None
    if args.merge and args.out.exists():
        try:
            kept = runtimes_kept.read(args.out.read_text(), args.quick)
        except ValueError as error:
            parser.exit(2, f"tools.runtimes: cannot merge into {args.out}: {error}\n")
    results = run("quick" if args.quick else "full", args.out, args.runtime, parallel=min(2, os.cpu_count() or 1),
                  family=args.family, kept=kept)
    return 1 if unknown_count(results) else 0


if __name__ == "__main__":
    sys.exit(main())
