"""Running what verify checks, through the runtime layer, and tallying what differs.

Jobs:

- site level: every extracted site model runs once per distinct computation (identical models
  share one ORT session) on the catalogue's comparable cases and two large cases, against the
  reference under the chosen zero-range policy; a site lower kept in float32 (a block) against the
  reference's y - y_zero_point in float32 and y_scale;
- model level: both models run on ORT (optimisation "basic" without the QDQ transformers, which
  keeps every kernel as written: for a QDQ model, the ops as ONNX defines them, not the integer
  kernels ORT fuses QDQ groups into at its default level; the report's note says so, with how
  many output elements ORIGINAL itself gives otherwise at that level) on the input sets, with every main-graph DQL input of ORIGINAL and every value its readers read
  in REWRITTEN exposed as graph outputs in one session per model; those values must equal the
  reference applied to the site's input in ORIGINAL; the graph outputs must have the same names in
  the same order and the same bits (NaN equals NaN), sequences element by element;
- ORIGINAL's integer products without terms (a reduction axis of size 0) run multiplied by 0:
  ORT leaves their outputs unwritten, ONNX defines them 0;
- a model level that compared no element (every output and site value empty) is reported as not
  checked, never as a pass.
"""

from __future__ import annotations

__all__ = ["ModelCheck", "SiteTally", "check_model", "check_sites", "not_checked"]

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from dql_pass import runtimes
from dql_pass.inputs import Case, cases, describe, large_cases
from dql_pass.compare import WORST, SiteDifference, compare_site, same_bits
from dql_pass.errors import InputError, one_line
from dql_pass.expansion import ExpandDynamicQuantizeLinearPass
from dql_pass.graph.slice import NotReachable
from dql_pass.graph.walk import graph_scopes
from dql_pass.lowering.rules import RULES
from dql_pass.files import external_tensors
from dql_pass.op import CENTRED_OUTPUT_TYPES, CENTRED_OUTPUTS, DOMAINS, OUTPUT_TYPES, OUTPUTS
from dql_pass.reference import centred, dynamic_quantize_linear
from dql_pass.runtimes.unsaturated import saturating_nodes
from dql_pass.verification.extract import LostOutput, Scopes, Site, extract, values_by_name
from dql_pass.verification.inputs import BATCH_SIZE, FALLBACK_BATCH
from dql_pass.verification.progress import advance
from dql_pass.verification.report import OutputResult, SiteResult, Tally

_ORT = runtimes.get("onnxruntime")
_QDQ = ("QuantizeLinear", "DequantizeLinear")
Sets = Mapping[str, Mapping[str, np.ndarray]]


class SiteTally(Tally):
    """The tally of one DQL site, with the values its readers read in REWRITTEN.

    One per site: two sites may have the same names and path (say, in two unnamed If nodes), so a
    site is never looked up by its value.
    """

    def __init__(self, site: Site):
        super().__init__(SiteResult(site.name, site.graph))
        self.site = site
        # The values that the site's readers read in REWRITTEN, as triples (see Scopes.read).
        self.read: list[tuple[ir.Value, ...]] = []
        self.block = False  # REWRITTEN keeps it in float32: read holds pairs (y - y_zero_point, y_scale)

    @property
    def outputs(self) -> tuple[tuple[str, ...], tuple[ir.DataType, ...]]:
        """The names and types of what is checked of the site."""
        return (CENTRED_OUTPUTS, CENTRED_OUTPUT_TYPES) if self.block else (OUTPUTS, OUTPUT_TYPES)

    def expected(self, outputs: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
        """What the site is held to, from the reference's ``outputs``."""
        return centred(outputs) if self.block else outputs


# -- site level ------------------------------------------------------------------------------------


class _SiteRunner:
    """Runs extracted site models over the catalogue, once per distinct computation: on ORT, which
    runs the ops as ONNX defines them, and on ``runtime`` too when it is another one."""

    def __init__(self, catalogue: Sequence[Case], zero_range: str, runtime: runtimes.Runtime):
        self.catalogue = catalogue
        self.zero_range = zero_range
        self.runtime = runtime
        self.expected = [dynamic_quantize_linear(c.x, zero_range) for c in catalogue]
        self._results: dict[bytes, tuple[list[tuple[SiteDifference | None, str | None]], str | None]] = {}

    def run(self, model: ir.Model, tally: SiteTally) -> tuple[list[tuple[SiteDifference | None, str | None]], str | None]:
        """Per case, the difference found (None: same bits) and the runtime's known reason for it, if
        any; and why the site was not checked on the runtime, if it was not. ``tally``'s site says
        what is checked (its outputs, or a block's), which the model's output names tell apart."""
        proto = ir.serde.serialize_model(model)  # once: for the cache key and for the session
        key = proto.SerializeToString(deterministic=True)
        if key not in self._results:
            # Constants kept on disk go through the runtime's own loading, which reads them.
            loaded = model if external_tensors(model) else proto
            results, unchecked = [(diff, None) for diff in self._run(loaded, _ORT, tally)[0]], None
            if self.runtime is not _ORT:
                diffs, unchecked = self._run(loaded, self.runtime, tally)
                for i, diff in enumerate(diffs):
                    if results[i][0] is None and diff is not None:
                        known = self.runtime.differences(self.catalogue[i].x, self.runtime.variant, self.zero_range,
                                                         diff.outputs)
                        results[i] = (diff, known[0] if known else None)
            self._results[key] = results, unchecked
        return self._results[key]

    def _run(
        self, model: ir.Model | onnx.ModelProto, runtime: runtimes.Runtime, tally: SiteTally
    ) -> tuple[list[SiteDifference | None], str | None]:
        """The difference of every case on ``runtime``, and why some were not checked there.

        What ORT, which runs the ops as ONNX defines them, refuses is the rewrite's fault: a
        mismatch. What another runtime refuses of a site model (a piece of a model it may run
        whole, on inputs the model may never see) is not checked there, with the reason.
        """
        try:
            session = runtime.load(model, threads=1, optimize="basic")
        except runtimes.RuntimeFailure as error:
            reason = f"{runtime.name} {runtimes.refused(error, 'load the site model')}: {one_line(error)}"
            if runtime is not _ORT:
                return [None] * len(self.catalogue), reason
            return [SiteDifference(WORST, reason)] * len(self.catalogue), None
        diffs, unchecked = [], None
        names = tally.outputs[0]
        for case, expected in zip(self.catalogue, self.expected):
            try:
                diff = compare_site(session.run({"x": case.x}, names), tally.expected(expected), names)
            except runtimes.RuntimeFailure as error:
                if runtime is not _ORT:
                    refusal = f"{runtime.name} {runtimes.refused(error, f'run case {case.name}')}: {one_line(error)}"
                    unchecked = unchecked or refusal
                    diff = None
                else:
                    diff = SiteDifference(WORST, f"failed: {one_line(error)}")
            diffs.append(diff if diff is None else dataclasses.replace(diff, detail=f"on {runtime.name}: {diff.detail}"))
        return diffs, unchecked


def check_sites(
    model: ir.Model, sites: Sequence[Site], seed: int, zero_range: str, runtime: runtimes.Runtime = _ORT,
    scopes: Scopes | None = None,
) -> list[SiteTally]:
    """Each site of ORIGINAL, as REWRITTEN (``model``, whose ``scopes`` these are when given)
    computes what its readers read, on the catalogue."""
    catalogue = [c for c in cases(seed=seed) if c.comparable]
    catalogue += large_cases()
    runner = _SiteRunner(catalogue, zero_range, runtime)
    classes = [case.classes(zero_range) for case in catalogue]
    scopes = scopes or Scopes(model)
    tallies = [SiteTally(site) for site in sites]
    for done, tally in enumerate(tallies):
        advance("sites", done, len(tallies))
        try:
            tally.block = scopes.block(tally.site)
            graph, tally.read = scopes.read(tally.site)
            # A computation that cannot be extracted may still be checked in the models: read stays.
            extracted = [extract(model, graph, tally.site, values, tally.block) for values in tally.read]
        except LostOutput as lost:
            tally.add("-", ["lost output"], SiteDifference(WORST, str(lost)), run=False)
            continue
        except NotReachable as reason:
            tally.result.not_reachable = str(reason)
            continue
        if tally.block:
            tally.result.block = ("lower kept it in float32: y - y_zero_point (float32) and y_scale checked against the "
                                  "reference, the lowered ops that read it checked from y - y_zero_point")
        for site_model in extracted:
            results, unchecked = runner.run(site_model, tally)
            tally.result.not_checked = tally.result.not_checked or unchecked
            for case, case_classes, (diff, known) in zip(catalogue, classes, results):
                tally.add(case.name, case_classes, diff, known=known)
    return tallies


# -- model level -----------------------------------------------------------------------------------


@dataclasses.dataclass
class ModelCheck:
    """What the model level found, on the input sets it ran; ``not_checked`` says why it compared nothing."""

    outputs: list[OutputResult]
    sets: Sets
    error: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    not_checked: str | None = None
    cannot_run: str | None = None  # the runtime runs neither REWRITTEN nor ORIGINAL: not the rewrite's fault
    from_ort: list[OutputResult] = dataclasses.field(default_factory=list)  # on another runtime, apart from the verdict


@contextlib.contextmanager
def _exposed(model: ir.Model, names: Mapping[str, ir.DataType]) -> Iterator[None]:
    """Temporarily make the main-graph values called ``names`` graph outputs, with a type if they lack one."""
    graph = model.graph
    values = values_by_name(graph)
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
        for _ in added:  # from the end: removing by value would search the list each time
            graph.outputs.pop()
        for value in untyped:
            value.type = None


def _run_all(
    model: ir.Model, names: Mapping[str, ir.DataType], sets: Sets, runtime: runtimes.Runtime = _ORT, optimize: str = "basic"
) -> dict[str, dict[str, object]]:
    """Run ``model`` on every input set; the values of ``names`` that are inputs or initializers come from there."""
    with _exposed(model, names):
        # On ORT, the integer products as ONNX defines them, not a kernel that saturates on this CPU.
        session = _ORT.load_exact(model, optimize=optimize) if runtime is _ORT else runtime.load(model, optimize=optimize)
    fetched = session.output_names
    values = values_by_name(model.graph)
    constants = {n: values[n].const_value.numpy() for n in names if n in values and values[n].const_value is not None}
    results = {}
    for done, (label, feeds) in enumerate(sets.items()):
        advance("input sets", done, len(sets))
        out = {**constants, **feeds}
        out.update(zip(fetched, session.run(feeds)))
        results[label] = out
    return results


def _leaves(value: object, where: str = "") -> list[tuple[str, np.ndarray | None]]:
    """The arrays of an output value with where they sit: a tensor is one, a sequence or map has one
    per element (``[i]``), an absent optional is None."""
    if isinstance(value, (list, tuple)):
        return [leaf for i, item in enumerate(value) for leaf in _leaves(item, f"{where}[{i}]")] or [(f"{where}[]", None)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key], f"{where}[{key!r}]")] or [(f"{where}{{}}", None)]
    return [(where, None if value is None else np.asarray(value))]


def _describe(leaves: Sequence[tuple[str, np.ndarray | None]]) -> str:
    return ", ".join(f"{where}{'none' if a is None else f'{a.dtype}{list(a.shape)}'}".strip() for where, a in leaves[:4]) + (
        ", ..." if len(leaves) > 4 else "")


def _size(value: object) -> int:
    return sum(0 if a is None else a.size for _, a in _leaves(value))


def _compare_output(name: str, original: Sequence[object], rewritten: Sequence[object]) -> OutputResult:
    """One graph output over every input set: structure, dtypes and shapes, then bits."""
    differing, max_abs, max_rel, total = 0, 0.0, 0.0, 0
    for a_value, b_value in zip(original, rewritten, strict=True):
        a_leaves, b_leaves = _leaves(a_value), _leaves(b_value)
        same_kind = len(a_leaves) == len(b_leaves) and all(
            wa == wb and (a is None) == (b is None) and (a is None or (a.dtype == b.dtype and a.shape == b.shape))
            for (wa, a), (wb, b) in zip(a_leaves, b_leaves)
        )
        if not same_kind:
            return OutputResult(name, False, detail=f"{_describe(b_leaves)} instead of {_describe(a_leaves)}")
        for (_, a), (_, b) in zip(a_leaves, b_leaves):
            if a is None:
                continue
            total += a.size
            bad = ~same_bits(a, b, any_nan=True)
            differing += int(bad.sum())
            if bad.any() and a.dtype.kind in "fiub":
                with np.errstate(all="ignore"):
                    x, y = a[bad].astype(np.float64), b[bad].astype(np.float64)
                    delta = np.nan_to_num(np.abs(x - y), nan=np.inf)  # NaN against a number: infinitely far
                    max_abs = max(max_abs, float(delta.max()))
                    relative = np.nan_to_num(delta / np.maximum(np.abs(x), np.finfo(np.float64).tiny), nan=np.inf)
                    max_rel = max(max_rel, float(relative.max()))
    if differing:
        detail = f"{differing} of {total} elements differ; max abs {max_abs:.6g}, max rel {max_rel:.6g}"
        return OutputResult(name, False, differing, max_abs, max_rel, detail)
    return OutputResult(name, True)


def _compare_outputs(original: ir.Model, rewritten: ir.Model, expected_runs: Sets, actual_runs: Sets | None) -> list[OutputResult]:
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


def _empty_sums(model: ir.Model) -> list[ir.Value]:
    """The outputs of the main graph's nodes that are sums without terms (a lowering rule says which)."""
    return [node.outputs[0] for node in model.graph if node.domain in DOMAINS and node.op_type in RULES
            and RULES[node.op_type].without_terms(node)]


def _zeroed(model: ir.Model) -> ir.Model:
    """``model``, or where it has products without terms, a copy in which each is multiplied by 0
    (the value ONNX defines for them, of the same shape and type), for ORT to run."""
    if not _empty_sums(model):
        return model
    model = model.clone()
    for value in _empty_sums(model):
        zero = ir.Value(name=f"{value.name}_zero", const_value=ir.tensor(np.zeros((), value.dtype.numpy())))
        model.graph.initializers.add(zero)
        name, value.name = value.name, f"{value.name}_unwritten"
        mul = ir.Node("", "Mul", [value, zero], num_outputs=1)
        mul.outputs[0].name, mul.outputs[0].type, mul.outputs[0].shape = name, value.type, value.shape
        ir.convenience.replace_all_uses_with(value, mul.outputs[0], replace_graph_outputs=True)
        mul.replace_input_with(0, value)
        model.graph.insert_after(value.producer(), mul)
    return model


def _run_original(
    model: ir.Model, names: Mapping[str, ir.DataType], sets: Sets, fallback: Callable[[], Sets] | None
) -> tuple[Sets, dict[str, dict[str, object]], list[str]]:
    """Run ORIGINAL on ``sets``, or on the ``fallback`` sets at batch 1 if it cannot run those; the sets
    it ran, its values, and notes for the report."""
    model = _zeroed(model)
    try:
        return sets, _run_all(model, names, sets), []
    except runtimes.RuntimeFailure as error:  # ORT's message is the clearest one-liner available
        failure = f"ORT cannot run ORIGINAL: {one_line(error)}"
    if fallback is None:
        raise InputError(failure)
    sets = fallback()
    try:
        runs = _run_all(model, names, sets)
    except runtimes.RuntimeFailure as error:
        raise InputError(f"ORT cannot run ORIGINAL: {one_line(error)}") from None
    note = f"ORIGINAL does not run at batch {BATCH_SIZE} ({failure}); both models ran at batch {FALLBACK_BATCH}"
    return sets, runs, [note]


def _expanded_on(original: ir.Model, sets: Sets, runtime: runtimes.Runtime) -> Sets:
    """ORIGINAL with its DQL expanded by the runtime's target variant, run there; RuntimeFailure if it cannot."""
    model = original.clone()
    ExpandDynamicQuantizeLinearPass(variant=runtime.variant, runtime=None)(model)
    return _run_all(model, {}, sets, runtime)


def _original_on(original: ir.Model, sets: Sets, runtime: runtimes.Runtime, on_ort: Sets) -> tuple[Sets, str]:
    """The graph outputs REWRITTEN is held to on ``runtime``: ORIGINAL with its DQL expanded by the
    runtime's target variant, run there; ORIGINAL on ORT (``on_ort``) when the runtime cannot run it."""
    try:
        runs = _expanded_on(original, sets, runtime)
    except runtimes.RuntimeFailure as error:
        return on_ort, (f"graph outputs compared with ORIGINAL on ORT: {runtime.name} cannot run ORIGINAL with its DQL "
                        f"expanded ({one_line(error)})")
    return runs, (f"graph outputs compared with ORIGINAL run on {runtime.name}, its DQL expanded by the variant exact "
                  f"there ({runtime.variant}): {runtime.name} rounds the other ops its own way")


def _from_ort_in_context(
    runtime: runtimes.Runtime, from_ort: Sequence[OutputResult], baseline: Sequence[OutputResult]
) -> list[str]:
    """What a final output's distance from ORT means: ``baseline`` is ORIGINAL (its DQL expanded for
    the runtime) run there against ORIGINAL on ORT, the runtime's own float rounding."""
    notes = []
    for rewritten, original in zip(from_ort, baseline, strict=True):
        if rewritten.identical:
            continue
        if (rewritten.differing, rewritten.max_abs) == (original.differing, original.max_abs):
            notes.append(f"from ORT, {rewritten.name!r}: ORIGINAL on {runtime.name} is as far from ORT ({original.detail}): "
                         f"that is {runtime.name}'s own float rounding, not the rewrite")
        else:
            distance = "bit-identical" if original.identical else original.detail
            notes.append(f"from ORT, {rewritten.name!r}: ORIGINAL on {runtime.name} against ORIGINAL on ORT: {distance}; "
                         f"the rest is the rewrite's own difference on {runtime.name}")
    return notes


def _qdq_note(original: ir.Model, sets: Sets, runs: Sets) -> list[str]:
    """For an ORIGINAL holding QuantizeLinear or DequantizeLinear (a QDQ model): what exact means,
    and which of ORT's graph transformers, at its default level, change ORIGINAL's outputs, and by
    how much, measured on ``sets``."""
    if not any(node.op_type in _QDQ and node.domain in (*DOMAINS, "com.microsoft")
               for graph in graph_scopes(original) for node in graph):
        return []
    note = ("ORIGINAL holds QuantizeLinear/DequantizeLinear: exact means the ops as ONNX defines them, as ORT computes "
            "them at level basic without its QDQ transformers, which is how ORIGINAL ran")
    names = [v.name for v in original.graph.outputs]
    total = sum(_size(run[name]) for run in runs.values() for name in names)

    def differing(session: runtimes.Session) -> int:
        fused = {label: dict(zip(session.output_names, session.run(feeds))) for label, feeds in sets.items()}
        return sum(_compare_output(name, [r[name] for r in runs.values()], [r[name] for r in fused.values()]).differing
                   for name in names)

    try:
        applied = _ORT.transformers(original)
        changed = differing(_ORT.load_without(original, ()))
        # Each transformer that changed the graph, alone (the others off): which of them change the bits.
        alone = {name: differing(_ORT.load_without(original, [other for other in applied if other != name]))
                 for name in applied} if changed else {}
    except runtimes.RuntimeFailure as error:
        return [f"{note} (ORIGINAL does not run at ORT's default level: {one_line(error)})"]
    if not changed:
        return [f"{note}; at ORT's default level ORIGINAL gives the same bits on these input sets"]
    causes = ", ".join(f"{name} ({count:,} alone)" for name, count in alone.items() if count) or (
        f"none alone, so their combination: {', '.join(applied)}")
    return [f"{note}; at ORT's default level ORIGINAL itself gives {changed:,} of {total:,} output elements otherwise "
            f"on these input sets, through the graph transformers {causes}"]


def _saturation_note(original: ir.Model) -> list[str]:
    """Where ORT's kernels for some of ORIGINAL's integer products saturate on this CPU: how it ran."""
    nodes = saturating_nodes(original, _ORT.saturating_products())
    if not nodes:
        return []
    return [f"ORT's kernels for {', '.join(sorted({n.split()[0] for n in nodes}))} with these operand types saturate "
            f"on this CPU (x86 without VNNI, ORT PR #12088): {len(nodes)} such node(s) ran on ORT with their int8 "
            "operands shifted to uint8, which ORT computes exactly, as ONNX defines the op"]


def _either(runtime: runtimes.Runtime, on_runtime: OutputResult, on_ort: OutputResult,
            ort_runs: Sets, runtime_runs: Sets, notes: list[str]) -> OutputResult:
    """A final output of REWRITTEN on ``runtime``, held to ORIGINAL there (``on_runtime``) or, where it
    differs from that, to ORIGINAL on ORT (``on_ort``), the contract's values: a rewrite that gives
    ORT's bits is exact, whatever ORIGINAL gives on the runtime. The note says which side differs."""
    if on_runtime.identical or not on_ort.identical:
        return on_runtime
    name = on_runtime.name
    apart = _compare_output(name, [r[name] for r in ort_runs.values()], [r[name] for r in runtime_runs.values()])
    notes.append(f"final output {name!r}: ORIGINAL on {runtime.name} differs from ORT: {apart.detail}; REWRITTEN on "
                 f"{runtime.name} is bit-identical to ORT")
    return on_ort


def not_checked(tallies: Sequence[SiteTally], reason: str) -> ModelCheck:
    """The model level when it cannot run at all."""
    for tally in tallies:
        tally.result.model_level = f"not checked in the models: {reason}"
    return ModelCheck([], {}, not_checked=reason)


def check_model(
    original: ir.Model,
    rewritten: ir.Model,
    tallies: Sequence[SiteTally],
    sets: Sets,
    fallback: Callable[[], Sets] | None,
    zero_range: str,
    runtime: runtimes.Runtime = _ORT,
) -> ModelCheck:
    """Run both models; check what main-graph sites' readers read on the sites' actual inputs, and
    compare the graph outputs.

    ORIGINAL runs on ORT, REWRITTEN on ``runtime``. On another runtime the readers' values are
    checked against the reference on the site's input as REWRITTEN computes it there, and the
    graph outputs are compared with ORIGINAL run there with its DQL expanded by the runtime's
    target variant: the runtime computes the other ops with its own rounding. An output that
    differs from that but is bit-identical to ORIGINAL on ORT passes: it has the contract's values.
    """
    exposed = [
        t for t in tallies
        if t.site.graph == "main" and t.read and all(v.graph is rewritten.graph for values in t.read for v in values)
    ]
    chosen = set(map(id, exposed))
    for tally in tallies:
        if id(tally) not in chosen:
            tally.result.model_level = (
                "not checked in the models: its values live in a subgraph or function, they cannot be graph outputs"
                if tally.site.graph != "main" or tally.read
                else "not checked in the models: lost output" if "lost output" in tally.result.classes
                else "not checked in the models: what reads it in REWRITTEN is unknown"
            )
    original_names = {t.site.input: ir.DataType.FLOAT for t in exposed}
    rewritten_names = {v.name: dtype for t in exposed for values in t.read for v, dtype in zip(values, t.outputs[1])}
    elsewhere = runtime is not _ORT
    if elsewhere:  # the sites' inputs as the runtime computes them, where REWRITTEN still has them
        present = values_by_name(rewritten.graph)
        rewritten_names.update((name, dtype) for name, dtype in original_names.items() if name in present)
    sets, expected_runs, notes = _run_original(original, original_names, sets, fallback)
    try:
        actual_runs = _run_all(rewritten, rewritten_names, sets, runtime)
    except runtimes.RuntimeTimeout as error:  # slow, not refused: nothing compared, no fault found
        return not_checked(tallies, f"REWRITTEN did not finish on {runtime.name}: {one_line(error)}")
    except runtimes.RuntimeFailure as error:  # a rewrite that the runtime refuses is a failed rewrite...
        failure = f"{runtime.name} cannot run REWRITTEN: {one_line(error)}"
        for tally in exposed:
            tally.result.model_level = "not checked in the models: REWRITTEN did not run"
        if elsewhere:  # ...unless the runtime cannot run ORIGINAL either
            try:
                _expanded_on(original, sets, runtime)
            except runtimes.RuntimeFailure as original_error:
                reason = f"{failure}; nor ORIGINAL, its DQL expanded for {runtime.name}: {one_line(original_error)}"
                return ModelCheck([], sets, notes=notes, not_checked=reason, cannot_run=reason)
        outputs = _compare_outputs(original, rewritten, expected_runs, None)
        return ModelCheck(outputs, sets, failure, notes)
    for tally in exposed:
        tally.result.model_level = f"checked on {len(sets)} input sets"
        for label in sets:
            x = (actual_runs if elsewhere and tally.site.input in actual_runs[label] else expected_runs)[label][tally.site.input]
            expected = dynamic_quantize_linear(x, zero_range)
            for values in tally.read:
                diff = compare_site([actual_runs[label][v.name] for v in values], tally.expected(expected), tally.outputs[0])
                # On another runtime, excused where its differences for x's classes name each output that differs.
                known = runtime.differences(np.asarray(x), runtime.variant, zero_range, diff.outputs) if elsewhere and diff else []
                tally.add(label, ["model input"], diff, known=known[0] if known else None)
    notes += _qdq_note(original, sets, expected_runs) + _saturation_note(original)
    held_to, from_ort = expected_runs, []
    if elsewhere:
        held_to, note = _original_on(original, sets, runtime, expected_runs)
        notes.append(note)
        from_ort = _compare_outputs(original, rewritten, expected_runs, actual_runs)
        if held_to is not expected_runs:
            notes += _from_ort_in_context(runtime, from_ort, _compare_outputs(original, original, expected_runs, held_to))
    # Held to ORIGINAL on ORT (the runtime cannot run it): the same comparison as from_ort.
    outputs = from_ort if held_to is expected_runs and elsewhere else _compare_outputs(original, rewritten, held_to, actual_runs)
    if held_to is not expected_runs:
        outputs = [_either(runtime, o, ort, expected_runs, held_to, notes) for o, ort in zip(outputs, from_ort)]
    compared = sum(_size(run[name]) for run in expected_runs.values() for name in [*original_names, *(v.name for v in original.graph.outputs)])
    if not compared:
        reason = "every input set gives empty graph outputs and DQL inputs: nothing was compared"
        for tally in exposed:
            tally.result.model_level = f"not checked in the models: {reason}"
        return ModelCheck(outputs, sets, notes=notes, not_checked=reason, from_ort=from_ort)
    return ModelCheck(outputs, sets, notes=notes, from_ort=from_ort)
