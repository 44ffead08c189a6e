"""Check a rewritten model against the original, bit for bit, on ONNX Runtime.

:func:`verify` compares REWRITTEN with ORIGINAL at two levels and returns a :class:`VerifyReport`.

Site level, for every DynamicQuantizeLinear of ORIGINAL (main graph, If/Loop/Scan bodies at any
depth, model-local functions):

- every site is checked on its own, even when two share their names and graph path. What is
  checked is what the site's readers read: for every node of ORIGINAL that reads one of the site's
  outputs, the value that the same node of REWRITTEN (same graph path, type and output names) reads
  at that input, and for a graph output the value at that position; an output nothing reads is
  looked up by name. A copy of the DQL left dangling under the old names is therefore not what gets
  checked. Rewrites keep the names: a site output whose name is missing from the graph of REWRITTEN
  at the same path (:func:`dql_pass.walk.graph_scopes`, or the one graph that has them all when a
  rewrite renamed a control-flow node) is a mismatch ("lost output"); a reader that REWRITTEN lacks
  makes the site "not reachable";
- the computation of those values is walked back to the value named like the DQL's input, taking
  in constants, initializers and Constant nodes of outer scopes, subgraphs of the nodes on the way,
  and the model-local functions it calls; a native DQL is fine too. A computation that needs any
  other value cannot run alone: the site is reported "not reachable", and the verdict is
  INCOMPLETE (exit code 1), never PASS;
- the extracted computation gets canonical names, so identical sites share one ORT session and one
  run of the catalogue (:func:`dql_pass.catalogue.cases`, the comparable cases) and of two large
  cases (over 1,024 and over 65,536 elements, the catalogue's exact ties with the ends of the range
  last), compared with :func:`dql_pass.reference.dynamic_quantize_linear` under the chosen
  zero-range policy.

Model level: both models run on ORT (graph optimisation "basic", which keeps every kernel as
written) on synthesized inputs: ``samples`` seeded random sets, then, when a float input is
synthesized, sets with every float input zero, all negative, all positive and heavy-tailed
(Cauchy). Every main-graph DQL input of ORIGINAL and every value its readers read in REWRITTEN
becomes a graph output; those values must equal the reference applied to the site's input in
ORIGINAL. Values inside subgraphs and functions cannot be graph outputs, the report says so. The
graph outputs must have the same names in the same order, with no extra one, and be bit-identical
(NaN equals NaN); when not, the report gives the largest absolute and relative differences.

Synthesized inputs: a symbolic dimension takes its ``dims`` size, or the size of that dimension in
a given input, else 2 when its name says batch (so that a rewrite that fixed the batch to 1 fails;
when ORIGINAL does not run at batch 2 both models run at batch 1 and the report says so), else 128,
a realistic sequence length (so does an unnamed one). Inputs named like a mask are ones; other
booleans (If conditions, say) are True in even-numbered sets and False in odd-numbered ones and in
the all-zero set, so that both branches run; integer inputs named like token types or segments are
zeros, like positions ``0, 1, ...`` along the last axis, other integers (token ids) uniform below
the number of rows of the table they index (the data of the Gather they reach through casts and
reshapes) where the model tells, else below 16. ``inputs`` replaces any of them, with the same array
in every set. Inputs that would need more than 4 GiB in all are refused, and so is a run with no
input set (``samples=0`` when an input is synthesized, none of them float).

Testing finds what the inputs reach: a change that only shows behind a data-dependent trigger (one
token id out of thousands, a value no set comes near) can pass.

Failures to read the models or the options raise :class:`~dql_pass.errors.InputError`; so does an
ORIGINAL that ORT cannot run, and a ModelProto whose external data is not loaded (its weights would
be looked for in the current folder; pass a path). A REWRITTEN that ORT cannot run is a mismatch.
"""

from __future__ import annotations

__all__ = ["OutputResult", "SiteResult", "VerifyReport", "verify"]

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from dql_pass.catalogue import Case, cases
from dql_pass.errors import InputError
from dql_pass.walk import Root, called_functions, graph_scopes, sites_by_graph
from dql_pass import runtimes
from dql_pass.modelfiles import as_ir_model, atomic_path, external_tensors, one_line
from dql_pass.compare import SiteDifference, compare_site, same_bits
from dql_pass.op import OUTPUT_TYPES, OUTPUTS, check_choice
from dql_pass.reference import dynamic_quantize_linear

logger = logging.getLogger(__name__)

# The outputs of DynamicQuantizeLinear, as the operator names them.
_INT_HIGH = 16  # token ids where the model does not tell the size of the table they index
# Batch 2 catches a batch fixed to 1; 128 is a realistic sequence length, and gives DQL sites
# thousands of elements.
_BATCH_SIZE, _FALLBACK_BATCH, _OTHER_SIZE = 2, 1, 128
_MAX_INPUT_BYTES = 4 << 30  # all synthesized input sets together
_SPECIAL_SETS = ("zeros", "negative", "positive", "heavy tails")
# Ops that hand token ids on unchanged, on the way to the Gather that reads them.
_ID_PASS_THROUGH = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
_ORT = runtimes.get("onnxruntime")
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
    notes: list[str] = dataclasses.field(default_factory=list)

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
        lines += [f"note: {note}" for note in self.notes]
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


class _Tally:
    """Counts the mismatches of one site and keeps the worst.

    One per site: two sites may have the same names and path (say, in two unnamed If nodes), so a
    site is never looked up by its value.
    """

    def __init__(self, site: _Site):
        self.site = site
        self.result = SiteResult(site.name, site.graph)
        # The values that the site's readers read in REWRITTEN, as triples (see _Scopes.read).
        self.read: list[tuple[ir.Value, ...]] = []
        self.worst: SiteDifference | None = None
        self.classes: Counter[str] = Counter()

    def add(self, case: str, category: str, diff: SiteDifference | None, *, run: bool = True) -> None:
        self.result.cases += run
        if diff is None:
            return
        self.result.mismatches += 1
        self.classes[category] += 1
        self.result.classes = dict(self.classes.most_common())
        if self.worst is None or diff.severity > self.worst.severity:
            self.worst = diff
            self.result.worst_case, self.result.worst_class, self.result.detail = case, category, diff.detail


# -- site extraction -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Use:
    """Where ORIGINAL reads a site output: input ``index`` of the node ``op`` (domain, type) that
    makes ``node_outputs`` in graph ``graph``; output ``index`` of the site's graph when ``op`` is None."""

    graph: str
    index: int
    op: tuple[str, str] | None = None
    node_outputs: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Site:
    """A DQL of ORIGINAL: its report name, graph path, the names of its input and outputs, and
    where each output is read."""

    name: str
    graph: str
    input: str
    outputs: tuple[str, ...]
    uses: tuple[tuple[_Use, ...], ...]


class _NotReachable(Exception):
    """The site's computation needs more than its input and constants, or what reads it is unknown."""


class _LostOutput(Exception):
    """REWRITTEN has no value under one of the site's output names."""


def _values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {v.name: v for v in graph.inputs if v.name}
    values.update(graph.initializers)
    values.update((v.name, v) for node in graph for v in node.outputs if v.name)
    return values


def _op(node: ir.Node) -> tuple[str, str]:
    return ("" if node.domain == "ai.onnx" else node.domain, node.op_type)


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
    for value, name, dtype in zip(graph.outputs, OUTPUTS, OUTPUT_TYPES):
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

    def counterpart(self, path: str, names: Sequence[str]) -> ir.Graph | None:
        """The graph at ``path`` if it holds values called ``names``, else the one graph that does.

        A rewrite may rename or reorder control-flow nodes, and so change paths.
        """
        graph = self.by_path.get(path)
        if graph is not None and all(name in self.values[graph] for name in names):
            return graph
        holders = [g for g, values in self.values.items() if all(name in values for name in names)]
        return holders[0] if len(holders) == 1 else None

    def holder(self, site: _Site) -> ir.Graph:
        """The graph that holds the site's outputs; when no graph or several do, the one at the
        site's path is kept and reports them lost."""
        graph = self.counterpart(site.graph, site.outputs)
        if graph is None:
            graph = self.by_path.get(site.graph)
        if graph is None:
            raise _LostOutput(f"REWRITTEN has no graph {site.graph!r}, and no one other graph holds its outputs")
        values = self.values[graph]
        lost = [name for name in site.outputs if name not in values]
        if lost:
            raise _LostOutput(f"REWRITTEN has no value named {', '.join(map(repr, lost))} in {site.graph}")
        return graph

    def read(self, site: _Site) -> list[tuple[ir.Value, ...]]:
        """The values of REWRITTEN that the readers of the site's outputs read, as triples to check:
        the first readers' values, then each other value read, in place of the first.

        An output that nothing reads in ORIGINAL is the value of its name.
        """
        graph = self.holder(site)
        found = [
            list(dict.fromkeys(self._read(graph, use) for use in uses)) or [self.values[graph][name]]
            for name, uses in zip(site.outputs, site.uses, strict=True)
        ]
        first = tuple(values[0] for values in found)
        return [first] + [(*first[:k], value, *first[k + 1:]) for k, values in enumerate(found) for value in values[1:]]

    def _read(self, holder: ir.Graph, use: _Use) -> ir.Value:
        """The value that REWRITTEN reads where ORIGINAL reads a site output (``use``)."""
        if use.op is None:
            if use.index >= len(holder.outputs):
                raise _LostOutput(f"REWRITTEN's graph {use.graph} has no output {use.index}")
            return holder.outputs[use.index]
        names = [name for name in use.node_outputs if name]
        graph = self.counterpart(use.graph, names) if names else None
        node = self.values[graph][names[0]].producer() if graph is not None else None
        reader = f"{use.op[1]} node making {', '.join(map(repr, names))} in {use.graph}"
        if node is None or _op(node) != use.op or tuple(v.name for v in node.outputs) != use.node_outputs:
            raise _NotReachable(f"REWRITTEN has no {reader}, which reads it in ORIGINAL: what reads it is unknown")
        if use.index >= len(node.inputs) or node.inputs[use.index] is None:
            raise _LostOutput(f"the {reader} reads nothing at input {use.index} in REWRITTEN")
        return node.inputs[use.index]


def _extract(model: ir.Model, graph: ir.Graph, site: _Site, outputs: Sequence[ir.Value]) -> ir.Model:
    """A model with input ``x`` and outputs ``y, y_scale, y_zero_point`` computing ``outputs``, the
    values read for the site in ``graph`` of ``model``."""
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


def _dim_size(dim: int | ir.SymbolicDim, dims: Mapping[str, int], batch: int) -> int:
    if isinstance(dim, int):
        return dim if dim >= 0 else _OTHER_SIZE  # exporters write -1 for an unknown size
    name = dim.value
    if name is not None and name in dims:
        return dims[name]
    return batch if _is_batch(name) else _OTHER_SIZE


def _is_batch(name: str | None) -> bool:
    return name is not None and "batch" in name.lower()


def _is_mask(value: ir.Value) -> bool:
    return "mask" in value.name.lower()


def _shape(value: ir.Value, dims: Mapping[str, int], batch: int) -> tuple[int, ...]:
    """The shape of a synthesized input; an input of another kind must be given."""
    dtype = value.dtype
    if not isinstance(value.type, ir.TensorType) or value.shape is None or not (
        dtype.is_floating_point() or dtype.is_integer() or dtype == ir.DataType.BOOL
    ):
        raise InputError(f"cannot synthesize model input {value.name!r} of type {value.type}, shape {value.shape}; "
                         "give it with --input")
    return tuple(_dim_size(d, dims, batch) for d in value.shape)


def _first_dim(value: ir.Value) -> int | None:
    """The static size of the first dimension of ``value``, from its shape or its constant."""
    if value.shape is not None and value.shape.rank() and isinstance(value.shape[0], int):
        return value.shape[0]
    if value.const_value is not None and value.const_value.shape.rank():
        return value.const_value.shape[0]
    return None


def _table_rows(value: ir.Value) -> int | None:
    """The rows of the smallest table that ``value`` indexes: Gather's data, reached through casts
    and reshapes, where its first dimension is static."""
    rows, todo = [], [value]
    while todo:
        for usage in todo.pop().uses():
            node = usage.node
            if _op(node) == ("", "Gather") and usage.idx == 1:
                rows.append(_first_dim(node.inputs[0]))
            elif _op(node)[0] == "" and node.op_type in _ID_PASS_THROUGH and usage.idx == 0:
                todo.extend(node.outputs)
    known = [size for size in rows if size]
    return min(known) if known else None


def _floats(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "heavy tails":
        return rng.standard_cauchy(shape)  # a tenth of the values beyond ±6, some far beyond
    normal = rng.standard_normal(shape)
    return {"negative": -np.abs(normal), "positive": np.abs(normal)}.get(kind, normal)


def _synthesize(
    value: ir.Value, shape: tuple[int, ...], kind: str, truth: bool, rng: np.random.Generator, high: int
) -> np.ndarray:
    dtype = value.dtype
    name = value.name.lower()
    if _is_mask(value):
        data = np.ones(shape)
    elif dtype == ir.DataType.BOOL:
        data = np.full(shape, truth)  # flags (If conditions) take both values across the sets
    elif dtype.is_floating_point():
        data = _floats(kind, shape, rng)
    elif "type" in name or "segment" in name:
        data = np.zeros(shape)
    elif "position" in name and shape:
        data = np.broadcast_to(np.arange(shape[-1]), shape)
    else:
        data = rng.integers(0, high, shape)
    return np.ascontiguousarray(data).astype(dtype.numpy())


def _model_inputs(model: ir.Model) -> list[ir.Value]:
    return [v for v in model.graph.inputs if not v.is_initializer()]


def _given_dims(model: ir.Model, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The sizes that the given arrays fix for the symbolic dimensions of their inputs, so that the
    synthesized inputs agree with them."""
    found: dict[str, int] = {}
    for value in _model_inputs(model):
        array = inputs.get(value.name)
        if array is None or value.shape is None or value.shape.rank() != np.ndim(array):
            continue
        for dim, size in zip(value.shape, np.shape(array)):
            if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
                found.setdefault(dim.value, size)
    return found


def _batch_is_default(model: ir.Model, inputs: Mapping[str, np.ndarray], dims: Mapping[str, int]) -> bool:
    """Whether a synthesized input has a batch dimension that takes the default size."""
    sizes = {**_given_dims(model, inputs), **dims}
    return any(
        isinstance(d, ir.SymbolicDim) and _is_batch(d.value) and d.value not in sizes
        for v in _model_inputs(model) if v.name not in inputs and v.shape is not None for d in v.shape
    )


def _input_sets(
    model: ir.Model, samples: int, seed: int, inputs: Mapping[str, np.ndarray], dims: Mapping[str, int],
    batch: int = _BATCH_SIZE,
) -> dict[str, dict[str, np.ndarray]]:
    graph_inputs = _model_inputs(model)
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
    sizes = {**_given_dims(model, inputs), **dims}
    synthesized = [v for v in graph_inputs if v.name not in inputs]
    shapes = {v.name: _shape(v, sizes, batch) for v in synthesized}
    labels = [f"sample {i}" for i in range(samples)]
    if any(v.dtype.is_floating_point() and not _is_mask(v) for v in synthesized):
        labels += _SPECIAL_SETS
    if not labels and synthesized:
        raise InputError("--samples 0 leaves no input set: ORIGINAL has no float input for the constructed sets; "
                         "give --samples 1 or more")
    labels = labels or ["given inputs"]  # every input is given: one run of them
    per_set = sum(math.prod(shapes[v.name]) * int(v.dtype.itemsize) for v in synthesized)
    if per_set * len(labels) > _MAX_INPUT_BYTES:
        raise InputError(
            f"the synthesized inputs would need {per_set * len(labels) / 2**30:.1f} GiB ({len(labels)} input sets of "
            f"{per_set / 2**30:.1f} GiB), more than the {_MAX_INPUT_BYTES >> 30} GiB verify allows; "
            "choose smaller --dim sizes or fewer --samples"
        )
    highs = {v.name: _table_rows(v) or _INT_HIGH for v in synthesized if v.dtype.is_integer()}
    rng = np.random.default_rng(seed)
    sets = {}
    for i, label in enumerate(labels):
        kind, truth = label if label in _SPECIAL_SETS else "sample", i % 2 == 0 and label != "zeros"
        sets[label] = {
            v.name: np.asarray(inputs[v.name]) if v.name in inputs
            else _synthesize(v, shapes[v.name], kind, truth, rng, highs.get(v.name, _INT_HIGH))
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
        session = _ORT.load(model, optimize="basic")
    fetched = session.output_names
    values = _values_by_name(model.graph)
    constants = {n: values[n].const_value.numpy() for n in names if n in values and values[n].const_value is not None}
    results = {}
    for label, feeds in sets.items():
        out = {**constants, **feeds}
        out.update(zip(fetched, session.run(feeds)))
        results[label] = out
    return results


def _compare_output(name: str, original: Sequence[np.ndarray], rewritten: Sequence[np.ndarray]) -> OutputResult:
    differing, max_abs, max_rel, problems = 0, 0.0, 0.0, []
    for a, b in zip(original, rewritten, strict=True):
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


def _compare_outputs(
    original: ir.Model,
    rewritten: ir.Model,
    expected_runs: Mapping[str, Mapping[str, np.ndarray]],
    actual_runs: Mapping[str, Mapping[str, np.ndarray]] | None,
) -> list[OutputResult]:
    """The graph outputs position by position: same names, no extra one, the same bits (``actual_runs``
    None: REWRITTEN did not run)."""
    final = [v.name for v in original.graph.outputs]
    got = [v.name for v in rewritten.graph.outputs]
    results = []
    for i, name in enumerate(final):
        if i >= len(got):
            results.append(OutputResult(name, False, detail=f"REWRITTEN has no output {i}"))
        elif got[i] != name:
            results.append(OutputResult(name, False, detail=f"REWRITTEN has {got[i]!r} as output {i}"))
        elif actual_runs is None:
            results.append(OutputResult(name, False, detail="REWRITTEN did not run"))
        else:
            results.append(_compare_output(name, [r[name] for r in expected_runs.values()], [r[name] for r in actual_runs.values()]))
    results += [
        OutputResult(name, False, detail=f"an output that ORIGINAL does not have (output {i})")
        for i, name in enumerate(got) if i >= len(final)
    ]
    return results


# -- the evaluator ---------------------------------------------------------------------------------


def _as_ir(model: onnx.ModelProto | ir.Model | str | os.PathLike, role: str) -> tuple[ir.Model, str]:
    """The model and how the report names it: its file, or its graph's name."""
    loaded = as_ir_model(model)
    if isinstance(model, onnx.ModelProto) and external_tensors(loaded):
        # Its tensors would be read relative to the current folder, whatever files are there.
        raise InputError(f"{role} is a ModelProto with external data that is not loaded; pass its path instead")
    if isinstance(model, (ir.Model, onnx.ModelProto)):
        return loaded, loaded.graph.name or f"<{type(model).__name__}>"
    return loaded, os.fspath(model)


def _uses(value: ir.Value, label: str, scopes: Mapping[ir.Graph, tuple[str, Root]]) -> tuple[_Use, ...]:
    """Where ORIGINAL reads ``value``, an output of a site in the graph at ``label``."""
    found = [_Use(label, i) for i, output in enumerate(value.graph.outputs) if output is value]
    found += [
        _Use(scopes[use.node.graph][0], use.idx, _op(use.node), tuple(v.name for v in use.node.outputs))
        for use in value.uses()
    ]
    return tuple(found)


def _original_sites(model: ir.Model) -> list[_Site]:
    scopes = graph_scopes(model)
    sites = []
    for label, nodes in sites_by_graph(scopes).items():
        for node in nodes:
            if not node.inputs or node.inputs[0] is None or len(node.outputs) != 3:
                raise InputError(f"DynamicQuantizeLinear {node.name!r} in {label} lacks its input or an output")
            outputs = tuple(v.name for v in node.outputs)
            uses = tuple(_uses(v, label, scopes) for v in node.outputs)
            sites.append(_Site(node.name or outputs[0], label, node.inputs[0].name, outputs, uses))
    return sites


def _large_cases(catalogue: Sequence[Case]) -> list[Case]:
    """Site cases beyond the catalogue's few hundred elements, where kernels change paths.

    The catalogue's exact ties, repeated, with the two ends of their range last: a reduction that
    reads a prefix, or a scale that changes with the size, gets them wrong.
    """
    ties = next(c.x for c in catalogue if c.name == "tie_exact_fractional_scale")
    ends, inner = ties[:2], ties[2:]  # the case starts with the ends of its range
    found = []
    for shape in ((4, 32, 33), (2, 200, 201)):
        x = np.resize(inner, math.prod(shape))
        x[-2:] = ends
        found.append(Case(f"large_ties_{x.size}", "large", x.reshape(shape), f"{x.size} exact ties, the range's ends last"))
    return found


class _SiteRunner:
    """Runs extracted site models over the catalogue, once per distinct computation."""

    def __init__(self, catalogue: Sequence[Case], zero_range: str):
        self.catalogue = catalogue
        self.expected = [dynamic_quantize_linear(c.x, zero_range) for c in catalogue]
        self._results: dict[bytes, list[SiteDifference | None]] = {}

    def run(self, model: ir.Model) -> list[SiteDifference | None]:
        key = ir.serde.serialize_model(model).SerializeToString(deterministic=True)
        if key not in self._results:
            self._results[key] = self._run(model)
        return self._results[key]

    def _run(self, model: ir.Model) -> list[SiteDifference | None]:
        try:
            session = _ORT.load(model, threads=1, optimize="basic")
        except Exception as error:  # noqa: BLE001 - whatever ORT refuses, the rewrite is at fault
            return [SiteDifference(_WORST, f"ORT cannot load the site: {one_line(error)}")] * len(self.catalogue)
        diffs = []
        for case, expected in zip(self.catalogue, self.expected):
            try:
                diffs.append(compare_site(session.run({"x": case.x}, OUTPUTS), expected))
            except Exception as error:  # noqa: BLE001 - an input the rewrite cannot run is a mismatch
                diffs.append(SiteDifference(_WORST, f"ORT failed: {one_line(error)}"))
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
    check_choice("zero-range policy", zero_range)
    if samples < 0:
        raise InputError(f"--samples must be 0 or more, not {samples}")
    if any(size < 0 for size in (dims or {}).values()):
        raise InputError("--dim sizes must be 0 or more")
    start = time.perf_counter()
    original_model, original_label = _as_ir(original, "ORIGINAL")
    rewritten_model, rewritten_label = _as_ir(rewritten, "REWRITTEN")
    inputs, dims = inputs or {}, dims or {}
    sets = _input_sets(original_model, samples, seed, inputs, dims)
    fallback = (
        functools.partial(_input_sets, original_model, samples, seed, inputs, dims, _FALLBACK_BATCH)
        if _batch_is_default(original_model, inputs, dims) else None
    )
    tallies = _check_sites(rewritten_model, _original_sites(original_model), seed, zero_range)
    check = _check_model(original_model, rewritten_model, tallies, sets, fallback, zero_range)
    report = VerifyReport(
        original_label, rewritten_label, zero_range, [t.result for t in tallies], check.outputs, list(check.sets),
        check.error, time.perf_counter() - start, check.notes,
    )
    logger.info("%s", report.summary())
    return report


def _check_sites(model: ir.Model, sites: Sequence[_Site], seed: int, zero_range: str) -> list[_Tally]:
    catalogue = [c for c in cases(seed=seed) if c.comparable]
    catalogue += _large_cases(catalogue)
    runner = _SiteRunner(catalogue, zero_range)
    scopes = _Scopes(model)
    tallies = [_Tally(site) for site in sites]
    for tally in tallies:
        try:
            graph = scopes.holder(tally.site)
            tally.read = scopes.read(tally.site)
            extracted = [_extract(model, graph, tally.site, values) for values in tally.read]
        except _LostOutput as lost:
            tally.add("-", "lost output", SiteDifference(_WORST, str(lost)), run=False)
            continue
        except _NotReachable as reason:
            tally.result.not_reachable = str(reason)
            continue
        for site_model in extracted:
            for case, diff in zip(catalogue, runner.run(site_model)):
                tally.add(case.name, case.category, diff)
    return tallies


@dataclasses.dataclass
class _ModelCheck:
    """What the model level found, on the input sets it ran."""

    outputs: list[OutputResult]
    sets: Mapping[str, Mapping[str, np.ndarray]]
    error: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


def _run_original(
    model: ir.Model,
    names: Mapping[str, ir.DataType],
    sets: Mapping[str, Mapping[str, np.ndarray]],
    fallback: Callable[[], dict[str, dict[str, np.ndarray]]] | None,
) -> tuple[Mapping[str, Mapping[str, np.ndarray]], dict[str, dict[str, np.ndarray]], list[str]]:
    """Run ORIGINAL on ``sets``, or on the ``fallback`` sets at batch 1 if it cannot run those; the sets
    it ran, its values, and notes for the report."""
    try:
        return sets, _run_all(model, names, sets), []
    except Exception as error:  # noqa: BLE001 - ORT's message is the clearest one-liner available
        failure = f"ORT cannot run ORIGINAL: {one_line(error)}"
    if fallback is None:
        raise InputError(failure)
    sets = fallback()
    try:
        runs = _run_all(model, names, sets)
    except Exception as error:  # noqa: BLE001 - as above
        raise InputError(f"ORT cannot run ORIGINAL: {one_line(error)}") from None
    note = f"ORIGINAL does not run at batch {_BATCH_SIZE} ({failure}); both models ran at batch {_FALLBACK_BATCH}"
    return sets, runs, [note]


def _check_model(
    original: ir.Model,
    rewritten: ir.Model,
    tallies: Sequence[_Tally],
    sets: Mapping[str, Mapping[str, np.ndarray]],
    fallback: Callable[[], dict[str, dict[str, np.ndarray]]] | None,
    zero_range: str,
) -> _ModelCheck:
    """Run both models; check what main-graph sites' readers read on the sites' actual inputs, and
    compare the graph outputs."""
    exposed = [
        t for t in tallies
        if t.site.graph == "main" and t.read and all(v.graph is rewritten.graph for values in t.read for v in values)
    ]
    for tally in tallies:
        if tally not in exposed:
            tally.result.model_level = (
                "not checked in the models: its values live in a subgraph or function, they cannot be graph outputs"
                if tally.site.graph != "main" or tally.read
                else "not checked in the models: lost output" if "lost output" in tally.result.classes
                else "not checked in the models: what reads it in REWRITTEN is unknown"
            )
    original_names = {t.site.input: ir.DataType.FLOAT for t in exposed}
    rewritten_names = {v.name: dtype for t in exposed for values in t.read for v, dtype in zip(values, OUTPUT_TYPES)}
    sets, expected_runs, notes = _run_original(original, original_names, sets, fallback)
    try:
        actual_runs = _run_all(rewritten, rewritten_names, sets)
    except Exception as error:  # noqa: BLE001 - a rewrite that ORT refuses is a failed rewrite
        for tally in exposed:
            tally.result.model_level = "not checked in the models: REWRITTEN did not run"
        outputs = _compare_outputs(original, rewritten, expected_runs, None)
        return _ModelCheck(outputs, sets, f"ORT cannot run REWRITTEN: {one_line(error)}", notes)
    for tally in exposed:
        tally.result.model_level = f"checked on {len(sets)} input sets"
        for label in sets:
            expected = dynamic_quantize_linear(expected_runs[label][tally.site.input], zero_range)
            for values in tally.read:
                tally.add(label, "model input", compare_site([actual_runs[label][v.name] for v in values], expected))
    return _ModelCheck(_compare_outputs(original, rewritten, expected_runs, actual_runs), sets, notes=notes)
