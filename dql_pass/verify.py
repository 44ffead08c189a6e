"""Check a rewritten model against the original, bit for bit, on ONNX Runtime.

:func:`verify` compares REWRITTEN with ORIGINAL at two levels and returns a :class:`VerifyReport`.

Site level, for every DynamicQuantizeLinear of ORIGINAL (main graph, If/Loop/Scan bodies at any
depth, model-local functions):

- every site is checked on its own, even when two share their names and graph path; the values
  that hold its three outputs are looked up by name in the graph of REWRITTEN at the same path
  (:func:`dql_pass.graphs.graph_scopes`), or in the one graph that has them all when a rewrite
  renamed a control-flow node (rewrites keep the names); a missing name is a mismatch ("lost output");
- the computation of those outputs is walked back to the value named like the DQL's input, taking
  in constants, initializers and Constant nodes of outer scopes, subgraphs of the nodes on the way,
  and the model-local functions it calls; a native DQL is fine too. A computation that needs any
  other value cannot run alone: the site is reported "not reachable", and the verdict is
  INCOMPLETE (exit code 1), never PASS;
- the extracted computation gets canonical names, so identical sites share one ORT session and one
  run of the catalogue (:func:`dql_pass.catalogue.cases`, the comparable cases), compared with
  :func:`dql_pass.reference.dynamic_quantize_linear` under the chosen zero-range policy.

Model level: both models run on ORT (graph optimisation "basic", which keeps every kernel as
written) on synthesized inputs, ``samples`` seeded random sets plus one with every float input at
zero. Every main-graph DQL input and output becomes a graph output of both models; each site's
outputs in REWRITTEN must equal the reference applied to the site's input in ORIGINAL. Values
inside subgraphs and functions cannot be graph outputs, the report says so. The final outputs of
both models must be bit-identical (NaN equals NaN); when not, the report gives the largest absolute
and relative differences.

Synthesized inputs: a symbolic dimension takes its ``dims`` size, else 1 when its name says batch,
else 8 (so does an unnamed one). Inputs named like a mask are ones; other booleans (If conditions,
say) are True in even-numbered sample sets and False in odd-numbered ones and in the all-zero set,
so that both branches run; other float inputs are standard normal (zero in the all-zero set);
integer inputs named like token types or segments are zeros, like positions ``0, 1, ...`` along the
last axis, other integers (token ids) uniform in ``[0, 16)``. ``inputs`` replaces any of them, with
the same array in every set.

Failures to read the models or the options raise :class:`~dql_pass.errors.InputError`; so does an
ORIGINAL that ORT cannot run. A REWRITTEN that ORT cannot run is a mismatch.
"""

from __future__ import annotations

__all__ = ["OUTPUTS", "BitDifference", "OutputResult", "SiteResult", "VerifyReport", "bit_difference", "same_bits", "verify"]

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from dql_pass.catalogue import Case, cases
from dql_pass.errors import InputError
from dql_pass.graphs import called_functions, find_sites, graph_scopes
from dql_pass.files import as_ir_model, atomic_path, external_base_dirs, one_line, read_external_attributes
from dql_pass.reference import ZERO_RANGE_POLICIES, dynamic_quantize_linear

logger = logging.getLogger(__name__)

# The outputs of DynamicQuantizeLinear, as the operator names them.
OUTPUTS: tuple[str, ...] = ("y", "y_scale", "y_zero_point")
_OUTPUT_TYPES = (ir.DataType.UINT8, ir.DataType.FLOAT, ir.DataType.UINT8)
_INT_HIGH = 16  # token ids stay below every realistic vocabulary size
_BATCH_SIZE, _OTHER_SIZE = 1, 8
_IN_MEMORY_BYTES = 1 << 20
_WORST = (9, 0)  # the severity of a site that cannot run at all


@dataclasses.dataclass
class SiteResult:
    """One DQL site of ORIGINAL: how many inputs it ran and what went wrong."""

    name: str
    graph: str
    cases: int = 0
    mismatches: int = 0
    worst_case: str | None = None
    worst_class: str | None = None
    detail: str | None = None
    classes: dict[str, int] = dataclasses.field(default_factory=dict)
    model_level: str = ""
    not_reachable: str | None = None

    @property
    def passed(self) -> bool:
        return self.mismatches == 0 and self.not_reachable is None


@dataclasses.dataclass
class OutputResult:
    """One final output of ORIGINAL compared with REWRITTEN over all input sets."""

    name: str
    identical: bool
    differing: int = 0
    max_abs: float | None = None
    max_rel: float | None = None
    detail: str | None = None


@dataclasses.dataclass
class VerifyReport:
    """Everything :func:`verify` found; :meth:`format` prints it, :meth:`to_dict` is the JSON form."""

    original: str
    rewritten: str
    zero_range: str
    sites: list[SiteResult]
    outputs: list[OutputResult]
    input_sets: list[str]
    model_error: str | None = None
    seconds: float = 0.0

    @property
    def mismatches(self) -> int:
        return sum(s.mismatches for s in self.sites) + sum(not o.identical for o in self.outputs) + bool(self.model_error)

    @property
    def passed(self) -> bool:
        """No mismatch and every site checked."""
        return all(s.passed for s in self.sites) and self.mismatches == 0

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL" if self.mismatches else "INCOMPLETE"

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def summary(self) -> str:
        checked = [s for s in self.sites if s.not_reachable is None]
        unreachable = len(self.sites) - len(checked)
        identical = sum(o.identical for o in self.outputs)
        text = (
            f"{self.verdict}: {len(self.sites)} sites, {sum(s.cases for s in self.sites)} cases, "
            f"{sum(s.mismatches for s in self.sites)} site mismatches; final outputs {identical} of "
            f"{len(self.outputs)} bit-identical over {len(self.input_sets)} input sets; "
            f"zero range {self.zero_range}; {self.seconds:.2f} s"
        )
        if unreachable:
            text += f"; {unreachable} sites not reachable, not checked"
        if self.model_error:
            text += f"; {self.model_error}"
        return text

    def format(self) -> str:
        rows = [("site", "graph", "cases", "mismatches", "worst case (input class)")]
        for s in self.sites:
            worst = "-" if s.worst_case is None else f"{s.worst_case} ({s.worst_class})"
            rows.append((s.name, s.graph, str(s.cases), "not reachable" if s.not_reachable else str(s.mismatches), worst))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        for s in self.sites:
            if s.not_reachable:
                lines.append(f"not reachable: {s.name} in {s.graph}: {s.not_reachable}")
            elif s.mismatches:
                classes = ", ".join(f"{name} {count}" for name, count in s.classes.items())
                lines.append(f"mismatch: {s.name} in {s.graph}: {s.detail}; failing input classes: {classes}")
        inside = [s.name for s in self.sites if s.graph != "main"]
        if inside:
            lines.append(
                f"model level: {len(inside)} sites inside subgraphs or functions ({', '.join(inside)}) were checked on "
                "the catalogue only; their values cannot be graph outputs"
            )
        for o in self.outputs:
            if not o.identical:
                lines.append(f"final output {o.name!r} differs: {o.detail}")
        lines.append(self.summary())
        return "\n".join(lines)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        for output in data["outputs"]:
            for key in ("max_abs", "max_rel"):
                if output[key] is not None and not math.isfinite(output[key]):
                    output[key] = str(output[key])  # JSON has no inf
        return {
            **data,
            "passed": self.passed,
            "verdict": self.verdict,
            "mismatches": self.mismatches,
            "summary": self.summary(),
        }

    def save_json(self, path: str | os.PathLike) -> None:
        """Write :meth:`to_dict` as JSON to ``path`` atomically."""
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        with atomic_path(path, "report") as temporary:
            Path(temporary).write_text(text)


# -- comparison ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Diff:
    """What differs between actual and expected outputs for one input; larger ``severity`` is worse."""

    severity: tuple[int, int]
    detail: str


@dataclasses.dataclass(frozen=True)
class BitDifference:
    """How an array differs from the expected one: ``elements`` that differ (None when the dtype or
    shape differs) and one sentence on the first difference."""

    elements: int | None
    text: str


def same_bits(actual: np.ndarray, expected: np.ndarray, *, any_nan: bool = False) -> np.ndarray:
    """Element-wise bit equality of two arrays of one dtype and shape, so -0.0 differs from 0.0.

    With ``any_nan``, NaN equals NaN whatever its payload.
    """
    if actual.dtype.kind != "f":
        return actual == expected
    same = actual.view(f"u{actual.itemsize}") == expected.view(f"u{expected.itemsize}")
    if any_nan:
        same |= np.isnan(actual) & np.isnan(expected)
    return same


def bit_difference(name: str, actual: np.ndarray, expected: np.ndarray, *, any_nan: bool = False) -> BitDifference | None:
    """None when ``actual`` (called ``name``) equals ``expected`` in dtype, shape and every bit (see :func:`same_bits`)."""
    actual = np.asarray(actual)
    if actual.dtype != expected.dtype:
        return BitDifference(None, f"{name} has dtype {actual.dtype}, expected {expected.dtype}")
    if actual.shape != expected.shape:
        return BitDifference(None, f"{name} has shape {list(actual.shape)}, expected {list(expected.shape)}")
    differs = ~same_bits(actual, expected, any_nan=any_nan)
    if not differs.any():
        return None
    count = int(differs.sum())
    if not differs.ndim:
        return BitDifference(count, f"{name} differs: got {actual[()]}, expected {expected[()]}")
    where = tuple(int(i) for i in np.argwhere(differs)[0])
    return BitDifference(count, (
        f"{name} differs in {count} of {differs.size} elements, first at {list(where)}: "
        f"got {actual[where]}, expected {expected[where]}"
    ))


def _compare(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> _Diff | None:
    """Compare a site's three outputs with the reference's; None when every bit agrees."""
    problems, scalars, elements = [], 0, 0
    for name, a, e in zip(OUTPUTS, actual, expected, strict=True):
        difference = bit_difference(name, a, e, any_nan=True)
        if difference is None:
            continue
        problems.append(difference.text)
        # Worse is a wrong scalar or type before more wrong elements of y.
        if name == "y" and difference.elements is not None:
            elements = difference.elements
        else:
            scalars += 1
    return _Diff((scalars, elements), "; ".join(problems)) if problems else None


class _Tally:
    """Counts the mismatches of one site and keeps the worst.

    One per site: two sites may have the same names and path (say, in two unnamed If nodes), so a
    site is never looked up by its value.
    """

    def __init__(self, site: _Site):
        self.site = site
        self.result = SiteResult(site.name, site.graph)
        self.worst: _Diff | None = None
        self.classes: Counter[str] = Counter()

    def add(self, case: str, category: str, diff: _Diff | None, *, run: bool = True) -> None:
        self.result.cases += run
        if diff is None:
            return
        self.result.mismatches += 1
        self.classes[category] += 1
        self.result.classes = dict(self.classes.most_common())
        if self.worst is None or diff.severity > self.worst.severity:
            self.worst = diff
            self.result.worst_case, self.result.worst_class, self.result.detail = case, category, diff.detail


# -- ORT -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _small_tensors_in_memory(model: ir.Model):
    """Temporarily read small external initializers: ORT's shape inference needs their values (axes, shapes)."""
    read_external_attributes(model)
    swapped = [
        (value, value.const_value) for graph in model.graphs() for value in graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor) and value.const_value.nbytes <= _IN_MEMORY_BYTES
    ]
    for value, tensor in swapped:
        value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name)
    try:
        yield
    finally:
        for value, tensor in swapped:
            value.const_value = tensor


def _session(model: ir.Model, *, threads: int = 0) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    # "basic" folds constants and drops no-ops but fuses nothing: each kernel runs as written.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    folders = external_base_dirs(model)
    if folders:
        # Large weights stay on disk; ORT reads them from their folder.
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(min(folders)))
    with _small_tensors_in_memory(model):
        proto = ir.serde.serialize_model(model)
    return ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])


# -- site extraction -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Site:
    """A DQL of ORIGINAL: its report name, graph path, and the names of its input and outputs."""

    name: str
    graph: str
    input: str
    outputs: tuple[str, ...]


class _NotReachable(Exception):
    """The site's computation needs more than its input and constants."""


class _LostOutput(Exception):
    """REWRITTEN has no value under one of the site's output names."""


def _values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {v.name: v for v in graph.inputs if v.name}
    values.update(graph.initializers)
    values.update((v.name, v) for node in graph for v in node.outputs if v.name)
    return values


def _refuse_references(node: ir.Node) -> bool:
    """Raise :class:`_NotReachable` if ``node`` takes an attribute from its function: it cannot run outside it."""
    ref = next((attr for attr in node.attributes.values() if attr.is_ref()), None)
    if ref is not None:
        raise _NotReachable(f"node {node.name or node.op_type!r} takes attribute {ref.name!r} from its function")
    return True


def _captured(node: ir.Node) -> list[ir.Value]:
    """Values of enclosing scopes that the subgraphs of ``node`` read."""
    inner: set[ir.Graph] = set()
    # The check runs on every node before its subgraphs are entered; node itself comes first.
    walk = ir.traversal.RecursiveGraphIterator(
        ir.GraphView([], [], nodes=[node]), recursive=_refuse_references, enter_graph=inner.add
    )
    nodes = list(walk)[1:]
    return [v for n in nodes for v in n.inputs if v is not None and v.graph not in inner]


def _walk(outputs: Sequence[ir.Value], input_name: str) -> tuple[ir.Value | None, list[ir.Node], list[ir.Value]]:
    """Nodes computing ``outputs`` from the value named ``input_name``, in topological order, and the constants they read."""
    found_input, order, constants, foreign = None, [], [], []
    seen_values: set[ir.Value] = set()
    seen_nodes: set[ir.Node] = set()
    stack: list[ir.Value | tuple[ir.Node]] = list(reversed(outputs))
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):  # every input of this node is placed: emit it
            order.append(item[0])
            continue
        if item in seen_values:
            continue
        seen_values.add(item)
        producer = item.producer()
        if item.name == input_name:
            found_input = item
        elif producer is None and item.const_value is not None:
            constants.append(item)
        elif producer is None:
            foreign.append(item.name)
        elif producer not in seen_nodes:
            seen_nodes.add(producer)
            stack.append((producer,))
            stack.extend(v for v in reversed([*producer.inputs, *_captured(producer)]) if v is not None)
    if foreign:
        raise _NotReachable(f"its outputs depend on {', '.join(map(repr, sorted(foreign)))}, not only on its input {input_name!r}")
    return found_input, order, constants


def _canonical(graph: ir.Graph) -> None:
    """Name everything by position, so that identical computations serialize to identical bytes."""
    values = [*graph.initializers.values()]
    values += [v for node in graph for v in node.outputs]
    for i, value in enumerate(values):
        value.name = f"\x00{i}"  # first out of the way, for initializer names may collide
    for i, value in enumerate(values):
        value.name = f"v{i}"
        value.shape = None  # the shapes of the original model do not hold for catalogue inputs
        value.doc_string = None
        value.metadata_props.clear()
    for i, node in enumerate(graph):
        node.name = f"n{i}"
        node.doc_string = None
        node.metadata_props.clear()
    graph.inputs[0].name = "x"
    graph.inputs[0].type, graph.inputs[0].shape = ir.TensorType(ir.DataType.FLOAT), None
    for value, name, dtype in zip(graph.outputs, OUTPUTS, _OUTPUT_TYPES):
        value.name = name
        if value.type is None:
            value.type = ir.TensorType(dtype)


class _Scopes:
    """The graphs of REWRITTEN by path, with their values by name."""

    def __init__(self, model: ir.Model):
        scopes = graph_scopes(model)
        self.values = {graph: _values_by_name(graph) for graph in scopes}
        # graph_scopes gives every graph its own path, so no graph is lost here.
        self.by_path = {label: graph for graph, (label, _) in scopes.items()}

    def holder(self, site: _Site) -> ir.Graph:
        """The graph at the site's path if it holds the site's outputs, else the one graph that does.

        A rewrite may rename or reorder control-flow nodes, and so change paths; when no graph or
        several hold the outputs, the one at the site's path is kept and reports them lost.
        """
        graph = self.by_path.get(site.graph)
        if graph is not None and all(name in self.values[graph] for name in site.outputs):
            return graph
        holders = [g for g, values in self.values.items() if all(name in values for name in site.outputs)]
        if len(holders) == 1:
            return holders[0]
        if graph is None:
            raise _LostOutput(f"REWRITTEN has no graph {site.graph!r}, and {len(holders)} others hold its outputs")
        return graph


def _extract(model: ir.Model, scopes: _Scopes, site: _Site) -> ir.Model:
    """A model with input ``x`` and outputs ``y, y_scale, y_zero_point`` computing the site in ``model``."""
    graph = scopes.holder(site)
    values = scopes.values[graph]
    lost = [name for name in site.outputs if name not in values]
    if lost:
        raise _LostOutput(f"REWRITTEN has no value named {', '.join(map(repr, lost))} in {site.graph}")
    outputs = [values[name] for name in site.outputs]
    x, nodes, constants = _walk(outputs, site.input)
    if len(set(outputs)) != len(outputs) or (x is not None and x in outputs):
        raise _NotReachable("two of its outputs, or an output and its input, are the same value")
    x = x if x is not None else ir.Value(name=site.input)  # outputs that ignore x still get compared
    view = ir.GraphView([x], outputs, nodes=nodes, initializers=constants)
    functions = [model.functions[key].clone() for key in sorted(called_functions(model, view))]
    opsets = {**graph.opset_imports, **model.opset_imports}
    for function in functions:
        opsets = {**function.opset_imports, **opsets}
    view.opset_imports = opsets
    body = view.clone()
    _canonical(body)
    return ir.Model(body, ir_version=model.ir_version, functions=functions)


# -- model level -----------------------------------------------------------------------------------


def _dim_size(dim: int | ir.SymbolicDim, dims: Mapping[str, int]) -> int:
    if isinstance(dim, int):
        return dim if dim >= 0 else _OTHER_SIZE  # exporters write -1 for an unknown size
    name = dim.value
    if name is not None and name in dims:
        return dims[name]
    return _BATCH_SIZE if name is not None and "batch" in name.lower() else _OTHER_SIZE


def _is_mask(value: ir.Value) -> bool:
    return "mask" in value.name.lower()


def _synthesize(value: ir.Value, dims: Mapping[str, int], rng: np.random.Generator, zeros: bool, truth: bool) -> np.ndarray:
    dtype = value.dtype
    if not isinstance(value.type, ir.TensorType) or value.shape is None or not (
        dtype.is_floating_point() or dtype.is_integer() or dtype == ir.DataType.BOOL
    ):
        raise InputError(f"cannot synthesize model input {value.name!r} of type {value.type}, shape {value.shape}; "
                         "give it with --input")
    shape = tuple(_dim_size(d, dims) for d in value.shape)
    name = value.name.lower()
    if _is_mask(value):
        data = np.ones(shape)
    elif dtype == ir.DataType.BOOL:
        data = np.full(shape, truth)  # flags (If conditions) take both values across the sets
    elif dtype.is_floating_point():
        data = np.zeros(shape) if zeros else rng.standard_normal(shape)
    elif "type" in name or "segment" in name:
        data = np.zeros(shape)
    elif "position" in name and shape:
        data = np.broadcast_to(np.arange(shape[-1]), shape)
    else:
        data = rng.integers(0, _INT_HIGH, shape)
    return np.ascontiguousarray(data).astype(dtype.numpy())


def _input_sets(
    model: ir.Model, samples: int, seed: int, inputs: Mapping[str, np.ndarray], dims: Mapping[str, int]
) -> dict[str, dict[str, np.ndarray]]:
    graph_inputs = [v for v in model.graph.inputs if not v.is_initializer()]
    by_name = {v.name: v for v in graph_inputs}
    for name, array in inputs.items():
        if name not in by_name:
            raise InputError(f"--input {name}: ORIGINAL has no input {name!r}; its inputs: {', '.join(by_name)}")
        expected = by_name[name].dtype
        if expected is not None and np.asarray(array).dtype != expected.numpy():
            raise InputError(f"--input {name}: the array is {np.asarray(array).dtype}, the input takes {expected.numpy()}")
    symbols = {d.value for v in graph_inputs if v.shape is not None for d in v.shape if isinstance(d, ir.SymbolicDim)}
    for name in dims:
        if name not in symbols:
            raise InputError(f"--dim {name}: no input of ORIGINAL has a dimension named {name!r}")
    rng = np.random.default_rng(seed)
    sets = {}
    labels = [f"sample {i}" for i in range(samples)]
    if any(v.dtype is not None and v.dtype.is_floating_point() and not _is_mask(v) for v in graph_inputs if v.name not in inputs):
        labels.append("zeros")
    for i, label in enumerate(labels):
        zeros = label == "zeros"
        sets[label] = {
            v.name: np.asarray(inputs[v.name]) if v.name in inputs else _synthesize(v, dims, rng, zeros, i % 2 == 0 and not zeros)
            for v in graph_inputs
        }
    return sets


@contextlib.contextmanager
def _exposed(model: ir.Model, names: Mapping[str, ir.DataType]):
    """Temporarily make the main-graph values called ``names`` graph outputs, with a type if they lack one."""
    graph = model.graph
    values = _values_by_name(graph)
    added = [
        values[name] for name in names
        if name in values and not (values[name].is_graph_output() or values[name].is_graph_input() or values[name].is_initializer())
    ]
    untyped = [value for value in added if value.type is None]
    for value in untyped:
        value.type = ir.TensorType(names[value.name])
    graph.outputs.extend(added)
    try:
        yield
    finally:
        for value in added:
            graph.outputs.remove(value)
        for value in untyped:
            value.type = None


def _run_all(
    model: ir.Model, names: Mapping[str, ir.DataType], sets: Mapping[str, Mapping[str, np.ndarray]]
) -> dict[str, dict[str, np.ndarray]]:
    """Run ``model`` on every input set; the values of ``names`` that are inputs or initializers come from there."""
    with _exposed(model, names):
        session = _session(model)
    fetched = [o.name for o in session.get_outputs()]
    fed = {i.name for i in session.get_inputs()}
    values = _values_by_name(model.graph)
    constants = {n: values[n].const_value.numpy() for n in names if n in values and values[n].const_value is not None}
    results = {}
    for label, feeds in sets.items():
        out = {**constants, **feeds}
        out.update(zip(fetched, session.run(fetched, {n: a for n, a in feeds.items() if n in fed})))
        results[label] = out
    return results


def _compare_output(name: str, original: Sequence[np.ndarray], rewritten: Sequence[np.ndarray | None]) -> OutputResult:
    differing, max_abs, max_rel, problems = 0, 0.0, 0.0, []
    for a, b in zip(original, rewritten):
        if b is None:
            problems.append("REWRITTEN has no such output")
            break
        if a.dtype != b.dtype or a.shape != b.shape:
            problems.append(f"{b.dtype}{list(b.shape)} instead of {a.dtype}{list(a.shape)}")
            break
        bad = ~same_bits(a, b, any_nan=True)
        differing += int(bad.sum())
        if bad.any() and a.dtype.kind in "fiub":
            with np.errstate(all="ignore"):
                x, y = a[bad].astype(np.float64), b[bad].astype(np.float64)
                delta = np.nan_to_num(np.abs(x - y), nan=np.inf)  # NaN against a number: infinitely far
                max_abs = max(max_abs, float(delta.max()))
                relative = np.nan_to_num(delta / np.maximum(np.abs(x), np.finfo(np.float64).tiny), nan=np.inf)
                max_rel = max(max_rel, float(relative.max()))
    if problems:
        return OutputResult(name, False, detail=problems[0])
    if differing:
        total = sum(a.size for a in original)
        detail = f"{differing} of {total} elements differ; max abs {max_abs:.6g}, max rel {max_rel:.6g}"
        return OutputResult(name, False, differing, max_abs, max_rel, detail)
    return OutputResult(name, True)


# -- the evaluator ---------------------------------------------------------------------------------


def _as_ir(model: onnx.ModelProto | ir.Model | str | os.PathLike) -> tuple[ir.Model, str]:
    """The model and how the report names it: its file, or its graph's name."""
    loaded = as_ir_model(model)
    if isinstance(model, (ir.Model, onnx.ModelProto)):
        return loaded, loaded.graph.name or f"<{type(model).__name__}>"
    return loaded, os.fspath(model)


def _original_sites(model: ir.Model) -> list[_Site]:
    sites = []
    for label, nodes in find_sites(model).items():
        for node in nodes:
            if not node.inputs or node.inputs[0] is None or len(node.outputs) != 3:
                raise InputError(f"DynamicQuantizeLinear {node.name!r} in {label} lacks its input or an output")
            outputs = tuple(v.name for v in node.outputs)
            sites.append(_Site(node.name or outputs[0], label, node.inputs[0].name, outputs))
    return sites


class _SiteRunner:
    """Runs extracted site models over the catalogue, once per distinct computation."""

    def __init__(self, catalogue: Sequence[Case], zero_range: str):
        self.catalogue = catalogue
        self.expected = [dynamic_quantize_linear(c.x, zero_range) for c in catalogue]
        self._results: dict[bytes, list[_Diff | None]] = {}

    def run(self, model: ir.Model) -> list[_Diff | None]:
        key = ir.serde.serialize_model(model).SerializeToString(deterministic=True)
        if key not in self._results:
            self._results[key] = self._run(model)
        return self._results[key]

    def _run(self, model: ir.Model) -> list[_Diff | None]:
        try:
            session = _session(model, threads=1)
        except Exception as error:  # noqa: BLE001 - whatever ORT refuses, the rewrite is at fault
            return [_Diff(_WORST, f"ORT cannot load the site: {one_line(error)}")] * len(self.catalogue)
        diffs = []
        for case, expected in zip(self.catalogue, self.expected):
            try:
                diffs.append(_compare(session.run(list(OUTPUTS), {"x": case.x}), expected))
            except Exception as error:  # noqa: BLE001 - an input the rewrite cannot run is a mismatch
                diffs.append(_Diff(_WORST, f"ORT failed: {one_line(error)}"))
        return diffs


def verify(
    original: onnx.ModelProto | ir.Model | str | os.PathLike,
    rewritten: onnx.ModelProto | ir.Model | str | os.PathLike,
    *,
    samples: int = 2,
    seed: int = 0,
    inputs: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, int] | None = None,
    zero_range: str = "onnxruntime",
) -> VerifyReport:
    """Check ``rewritten`` against ``original`` at site and model level (see the module docstring).

    Models are paths (checked and loaded with :func:`dql_pass.load_model`), ModelProtos or
    ``ir.Model`` objects, which are read and left as they were.
    """
    if zero_range not in ZERO_RANGE_POLICIES:
        raise InputError(f"unknown zero-range policy {zero_range!r}; choose from {', '.join(ZERO_RANGE_POLICIES)}")
    if samples < 0:
        raise InputError(f"--samples must be 0 or more, not {samples}")
    if any(size < 0 for size in (dims or {}).values()):
        raise InputError("--dim sizes must be 0 or more")
    start = time.perf_counter()
    original_model, original_label = _as_ir(original)
    rewritten_model, rewritten_label = _as_ir(rewritten)
    sets = _input_sets(original_model, samples, seed, inputs or {}, dims or {})
    tallies = _check_sites(rewritten_model, _original_sites(original_model), seed, zero_range)
    outputs, model_error = _check_model(original_model, rewritten_model, tallies, sets, zero_range)
    report = VerifyReport(
        original_label, rewritten_label, zero_range, [t.result for t in tallies], outputs, list(sets), model_error,
        time.perf_counter() - start,
    )
    logger.info("%s", report.summary())
    return report


def _check_sites(model: ir.Model, sites: Sequence[_Site], seed: int, zero_range: str) -> list[_Tally]:
    catalogue = [c for c in cases(seed=seed) if c.comparable]
    runner = _SiteRunner(catalogue, zero_range)
    scopes = _Scopes(model)
    tallies = [_Tally(site) for site in sites]
    for tally in tallies:
        try:
            extracted = _extract(model, scopes, tally.site)
        except _LostOutput as lost:
            tally.add("-", "lost output", _Diff(_WORST, str(lost)), run=False)
            continue
        except _NotReachable as reason:
            tally.result.not_reachable = str(reason)
            continue
        for case, diff in zip(catalogue, runner.run(extracted)):
            tally.add(case.name, case.category, diff)
    return tallies


def _check_model(
    original: ir.Model,
    rewritten: ir.Model,
    tallies: Sequence[_Tally],
    sets: Mapping[str, Mapping[str, np.ndarray]],
    zero_range: str,
) -> tuple[list[OutputResult], str | None]:
    """Run both models; check main-graph sites on their actual inputs and compare the final outputs."""
    exposed = [t for t in tallies if t.site.graph == "main" and "lost output" not in t.result.classes]
    for tally in tallies:
        tally.result.model_level = (
            f"checked on {len(sets)} input sets" if tally in exposed
            else "not checked in the models: lost output" if tally.site.graph == "main"
            else "not checked in the models: its values live in a subgraph or function, they cannot be graph outputs"
        )
    names = {
        name: dtype for t in exposed for name, dtype in zip((t.site.input, *t.site.outputs), (ir.DataType.FLOAT, *_OUTPUT_TYPES))
    }
    final = [v.name for v in original.graph.outputs]
    try:
        expected_runs = _run_all(original, names, sets)
    except Exception as error:  # noqa: BLE001 - ORT's message is the clearest one-liner available
        raise InputError(f"ORT cannot run ORIGINAL: {one_line(error)}") from None
    try:
        actual_runs = _run_all(rewritten, names, sets)
    except Exception as error:  # noqa: BLE001 - a rewrite that ORT refuses is a failed rewrite
        error_text = f"ORT cannot run REWRITTEN: {one_line(error)}"
        for tally in exposed:
            tally.result.model_level = "not checked in the models: REWRITTEN did not run"
        return [OutputResult(name, False, detail="REWRITTEN did not run") for name in final], error_text
    for tally in exposed:
        for label in sets:
            expected = dynamic_quantize_linear(expected_runs[label][tally.site.input], zero_range)
            actual = [actual_runs[label].get(name) for name in tally.site.outputs]
            diff = _compare(actual, expected) if all(a is not None for a in actual) else _Diff(_WORST, "REWRITTEN lacks the outputs")
            tally.add(label, "model input", diff)
    outputs = [
        _compare_output(name, [expected_runs[label][name] for label in sets], [actual_runs[label].get(name) for label in sets])
        for name in final
    ]
    return outputs, None
