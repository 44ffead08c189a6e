"""The model level of verify: both models run whole on the input sets, what the main-graph sites'
readers read checked against the reference, and the graph outputs compared.

Rules:

- both models run on ORT (optimisation "basic" without the QDQ transformers, which keeps every
  kernel as written: for a QDQ model, the ops as ONNX defines them, not the integer kernels ORT
  fuses QDQ groups into at its default level; a note says so, with how many output elements
  ORIGINAL itself gives otherwise at that level), REWRITTEN on the runtime it is deployed on when
  that is another one, on the input sets, one set held at a time;
- every main-graph DQL input of ORIGINAL and every value its readers read in REWRITTEN are exposed
  as graph outputs in one session per model; those values must equal the reference applied to the
  site's input in ORIGINAL; the graph outputs are compared by :mod:`dql_pass.verification.outputs`;
  the models run set by set, and once a set's exposed values are checked only its graph outputs
  are kept (a large model's activations are held for one set, not for all);
- ORIGINAL's integer products without terms (a reduction axis of size 0) run multiplied by 0:
  ORT leaves their outputs unwritten, ONNX defines them 0;
- a model level that compared no element (every output and site value empty) is reported as not
  checked, never as a pass.
"""

from __future__ import annotations

__all__ = ["ModelCheck", "check_model", "not_checked"]

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from dql_pass import runtimes
from dql_pass.compare import SiteDifference, compare_site
from dql_pass.errors import InputError, one_line
from dql_pass.expansion import ExpandDynamicQuantizeLinearPass
from dql_pass.graph.walk import ops_used
from dql_pass.lowering.quantization import LowerQuantizationPass
from dql_pass.lowering.rules import RULES
from dql_pass.op import DOMAINS
from dql_pass.reference import dynamic_quantize_linear
from dql_pass.verification.extract import values_by_name
from dql_pass.verification.notes import either, from_ort_in_context, qdq_note, saturation_note
from dql_pass.verification.outputs import Sets, compare_outputs, size
from dql_pass.verification.progress import advance
from dql_pass.verification.report import OutputResult
from dql_pass.verification.site_level import SiteTally
from dql_pass.verification.synthesis import InputSets, Sizes, next_sizes

_ORT = runtimes.get("onnxruntime")


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
        if name in values
        and not (values[name].is_graph_output() or values[name].is_graph_input() or values[name].is_initializer())
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


class _Loaded:
    """A model's session on ``runtime`` with the main-graph values ``names`` exposed as graph outputs;
    ``run`` gives every output and exposed value of one input set (those that are inputs or
    initializers from there)."""

    def __init__(self, model: ir.Model, names: Mapping[str, ir.DataType], runtime: runtimes.Runtime = _ORT):
        with _exposed(model, names):
            # On ORT, the integer products as ONNX defines them, not a kernel that saturates on this CPU.
            load = _ORT.load_exact if runtime is _ORT else runtime.load
            self.session = load(model, optimize="basic")
        values = values_by_name(model.graph)
        self.names = names
        self.constants = {n: values[n].const_value.numpy() for n in names
                          if n in values and values[n].const_value is not None}
        self.outputs = {v.name for v in model.graph.outputs}

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, object]:
        out = {**self.constants, **{name: feeds[name] for name in self.names if name in feeds}}
        out.update(zip(self.session.output_names, self.session.run(feeds)))
        return out

    def kept(self, values: Mapping[str, object]) -> dict[str, object]:
        """The graph outputs of ``values``: what is kept of a set once its exposed values are checked."""
        return {name: value for name, value in values.items() if name in self.outputs}


def _run_all(model: ir.Model, sets: Sets, runtime: runtimes.Runtime) -> dict[str, dict[str, object]]:
    """Run ``model`` on every input set."""
    loaded = _Loaded(model, {}, runtime)
    return {label: loaded.run(feeds) for label, feeds in sets.items()}


class _OriginalUnloadable(Exception):
    """ORT cannot load ORIGINAL."""

    def __init__(self, error: runtimes.RuntimeFailure):
        super().__init__(f"ORT cannot load ORIGINAL: {one_line(error)}")


class _OriginalFailure(Exception):
    """ORT cannot run ORIGINAL on the input set ``label``."""

    def __init__(self, label: str, error: runtimes.RuntimeFailure):
        super().__init__(f"ORT cannot run ORIGINAL: {one_line(error)}")  # ORT's message is the clearest one-liner
        self.label = label


def _run_both(
    original: ir.Model, rewritten: ir.Model, names: tuple[Mapping[str, ir.DataType], Mapping[str, ir.DataType]],
    sets: Sets, runtime: runtimes.Runtime, reads: _Reads,
) -> tuple[Sets, Sets | runtimes.RuntimeFailure]:
    """ORIGINAL on ORT and REWRITTEN on ``runtime``, one input set at a time: ``reads`` sees each
    set's exposed values, then only the graph outputs are kept, so one set's values are held at a
    time. ORIGINAL's failure is raised (:class:`_OriginalFailure`); REWRITTEN's is returned in
    place of its runs, ORIGINAL going on (a failed rewrite is still compared with ORIGINAL's
    outputs). REWRITTEN is loaded once ORIGINAL has run a set (ORIGINAL may not run at this batch)."""
    try:
        first = _Loaded(original, names[0])
    except runtimes.RuntimeFailure as error:
        raise _OriginalUnloadable(error) from error
    second, failure = None, None
    expected_runs: dict[str, dict[str, object]] = {}
    actual_runs: dict[str, dict[str, object]] = {}
    for done, (label, feeds) in enumerate(sets.items()):
        advance("input sets", done, len(sets))
        try:
            expected = first.run(feeds)
        except runtimes.RuntimeFailure as error:
            raise _OriginalFailure(label, error) from error
        try:
            if failure is None:
                second = second or _Loaded(rewritten, names[1], runtime)
                actual = second.run(feeds)
                reads.add(label, expected, actual)
                actual_runs[label] = second.kept(actual)
        except runtimes.RuntimeFailure as error:
            failure = error
        expected_runs[label] = first.kept(expected)
    return expected_runs, actual_runs if failure is None else failure


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


def _run_models(
    original: ir.Model, rewritten: ir.Model, names: tuple[Mapping[str, ir.DataType], Mapping[str, ir.DataType]],
    sets: InputSets, fallback: Callable[[Sequence[Sizes]], InputSets], runtime: runtimes.Runtime, reads: _Reads,
) -> tuple[Sets, Sets, Sets | runtimes.RuntimeFailure, list[str]]:
    """Run both models on ``sets`` (see :func:`_run_both`), or where ORIGINAL cannot run a set at its
    default sizes, on the ``fallback`` sets at smaller ones; the sets they ran, their graph outputs
    (REWRITTEN's failure in place of its), and notes for the report."""
    original = _zeroed(original)
    failures: list[str] = []  # where ORIGINAL did not run, and ORT's reason
    failed: set[Sizes] = set()
    while True:
        try:
            runs = _run_both(original, rewritten, names, sets, runtime, reads)
            break
        except _OriginalFailure as failure:
            if failure.label not in sets.sizes:
                raise InputError(str(failure)) from None
            failures.append(f"with {sets.spelled(failure.label)} ({failure})")
            failed.add(sets.sizes[failure.label])
            sizes = next_sizes(failed)
            if sizes is None:
                raise InputError(f"ORIGINAL does not run {'; nor '.join(failures)}") from None
        reads.clear()
        sets = fallback(sizes)
    if not failures:
        return sets, *runs, sets.notes
    ran = "the sizes the next note gives" if sets.notes else f"{sets.spelled(next(iter(sets)))} in every set"
    return sets, *runs, [f"ORIGINAL does not run {'; nor '.join(failures)}: both models ran with {ran}", *sets.notes]


def _expanded_on(
    original: ir.Model, rewritten: ir.Model, sets: Sets, runtime: runtimes.Runtime
) -> tuple[Sets, list[runtimes.ComputedOtherwise]]:
    """ORIGINAL with its DQL expanded by the runtime's target variant, run there, and the ops it computes otherwise
    than ONNX that REWRITTEN no longer has (it lowered them) lowered to lower's exact float32 forms: what was
    lowered so. RuntimeFailure if it cannot run."""
    model = original.clone()
    ExpandDynamicQuantizeLinearPass(variant=runtime.variant, runtime=None)(model)
    kept = {op_type for domain, op_type in ops_used(rewritten) if domain in DOMAINS}
    used = {op_type for domain, op_type in ops_used(model) if domain in DOMAINS}
    otherwise = {op.op_type: op for op in runtime.computed_otherwise if op.op_type in used - kept}
    lowered: list[runtimes.ComputedOtherwise] = []
    if otherwise:
        report = LowerQuantizationPass(runtime.name, op_types=list(otherwise))(model).report
        lowered = [otherwise[op_type] for op_type in dict.fromkeys(n.op_type for n in report.lowered)]
    return _run_all(model, sets, runtime), lowered


def _original_on(
    original: ir.Model, rewritten: ir.Model, sets: Sets, runtime: runtimes.Runtime, on_ort: Sets
) -> tuple[Sets, str]:
    """The graph outputs REWRITTEN is held to on ``runtime``: ORIGINAL as :func:`_expanded_on` makes it, run there;
    ORIGINAL on ORT (``on_ort``) when the runtime cannot run it."""
    try:
        runs, lowered = _expanded_on(original, rewritten, sets, runtime)
    except runtimes.RuntimeFailure as error:
        return on_ort, (f"graph outputs compared with ORIGINAL on ORT: {runtime.name} cannot run ORIGINAL with its DQL "
                        f"expanded ({one_line(error)})")
    otherwise = "".join(f" and its {op.op_type} lowered as in REWRITTEN ({op.describe()})" for op in lowered)
    return runs, (f"graph outputs compared with ORIGINAL run on {runtime.name}, its DQL expanded by the variant exact "
                  f"there ({runtime.variant}){otherwise}: {runtime.name} rounds the other ops its own way")


def not_checked(tallies: Sequence[SiteTally], reason: str) -> ModelCheck:
    """The model level when it cannot run at all."""
    for tally in tallies:
        tally.result.model_level = f"not checked in the models: {reason}"
    return ModelCheck([], {}, not_checked=reason)


def _exposed_tallies(tallies: Sequence[SiteTally], rewritten: ir.Model) -> list[SiteTally]:
    """The sites whose values the model level checks: main-graph ones whose read values all live in
    REWRITTEN's main graph; the others say why they are not checked there."""
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
    return exposed


def _exposed_names(
    exposed: Sequence[SiteTally], rewritten: ir.Model, elsewhere: bool
) -> tuple[dict[str, ir.DataType], dict[str, ir.DataType]]:
    """The values to expose in ORIGINAL (the sites' inputs) and in REWRITTEN (what their readers
    read; on another runtime, the sites' inputs too, where REWRITTEN still has them)."""
    original_names = {t.site.input: ir.DataType.FLOAT for t in exposed}
    rewritten_names = {v.name: dtype for t in exposed for values in t.read for v, dtype in zip(values, t.outputs[1])}
    if elsewhere:
        present = values_by_name(rewritten.graph)
        rewritten_names.update((name, dtype) for name, dtype in original_names.items() if name in present)
    return original_names, rewritten_names


def _refused(
    original: ir.Model, rewritten: ir.Model, exposed: Sequence[SiteTally], sets: Sets, expected_runs: Sets,
    notes: list[str], runtime: runtimes.Runtime, error: runtimes.RuntimeFailure,
) -> ModelCheck:
    """REWRITTEN did not run: a failed rewrite, unless the runtime cannot run ORIGINAL either."""
    failure = f"{runtime.name} cannot run REWRITTEN: {one_line(error)}"
    for tally in exposed:
        tally.result.model_level = "not checked in the models: REWRITTEN did not run"
    if runtime is not _ORT:
        try:
            _expanded_on(original, rewritten, sets, runtime)
        except runtimes.RuntimeFailure as original_error:
            reason = f"{failure}; nor ORIGINAL, its DQL expanded for {runtime.name}: {one_line(original_error)}"
            return ModelCheck([], sets, notes=notes, not_checked=reason, cannot_run=reason)
    return ModelCheck(compare_outputs(original, rewritten, expected_runs, None), sets, failure, notes)


class _Reads:
    """What each exposed site's readers read, against the reference on the site's input (on another
    runtime, that input as REWRITTEN computes it there, where it still has it), set by set as the
    models run; told to the tallies once every set has run (ORIGINAL may yet fail and run at other sizes)."""

    def __init__(self, exposed: Sequence[SiteTally], zero_range: str, runtime: runtimes.Runtime):
        self.exposed, self.zero_range, self.runtime = exposed, zero_range, runtime
        self.clear()

    def clear(self) -> None:
        self.found: list[list[tuple[str, SiteDifference | None, str | None]]] = [[] for _ in self.exposed]
        self.elements = 0  # of the sites' inputs in ORIGINAL, over the sets

    def add(self, label: str, expected: Mapping[str, object], actual: Mapping[str, object]) -> None:
        elsewhere = self.runtime is not _ORT
        self.elements += sum(size(expected[name]) for name in {t.site.input for t in self.exposed})
        for tally, found in zip(self.exposed, self.found):
            x = (actual if elsewhere and tally.site.input in actual else expected)[tally.site.input]
            reference = tally.expected(dynamic_quantize_linear(x, self.zero_range))
            for values in tally.read:
                diff = compare_site([actual[v.name] for v in values], reference, tally.outputs[0])
                # On another runtime, excused where its differences for x's classes name each output that differs.
                known = (self.runtime.differences(np.asarray(x), tally.form, self.zero_range, diff.outputs)
                         if elsewhere and diff and tally.form else [])
                found.append((label, diff, known[0] if known else None))

    def tell(self, sets: Sets) -> None:
        for tally, found in zip(self.exposed, self.found):
            tally.result.model_level = f"checked on {len(sets)} input sets"
            for label, diff, known in found:
                tally.add(label, ["model input"], diff, known=known)


def _final_outputs(
    original: ir.Model, rewritten: ir.Model, sets: Sets, expected_runs: Sets, actual_runs: Sets,
    runtime: runtimes.Runtime, notes: list[str],
) -> tuple[list[OutputResult], list[OutputResult]]:
    """The graph outputs of REWRITTEN held to ORIGINAL's, and on another runtime how far they are
    from ORIGINAL on ORT: held to ORIGINAL run there, its DQL expanded, or where the runtime cannot
    run that, to ORIGINAL on ORT; an output bit-identical to ORIGINAL on ORT passes either way."""
    if runtime is _ORT:
        return compare_outputs(original, rewritten, expected_runs, actual_runs), []
    held_to, note = _original_on(original, rewritten, sets, runtime, expected_runs)
    notes.append(note)
    from_ort = compare_outputs(original, rewritten, expected_runs, actual_runs)
    if held_to is expected_runs:
        return from_ort, from_ort
    notes += from_ort_in_context(runtime, from_ort, compare_outputs(original, original, expected_runs, held_to))
    outputs = compare_outputs(original, rewritten, held_to, actual_runs)
    return [either(runtime, o, ort, expected_runs, held_to, notes) for o, ort in zip(outputs, from_ort)], from_ort


def check_model(
    original: ir.Model,
    rewritten: ir.Model,
    tallies: Sequence[SiteTally],
    sets: InputSets,
    fallback: Callable[[Sequence[Sizes]], InputSets],
    zero_range: str,
    runtime: runtimes.Runtime = _ORT,
) -> ModelCheck:
    """Run both models; check what main-graph sites' readers read on the sites' actual inputs, and
    compare the graph outputs (ORIGINAL on ORT, REWRITTEN on ``runtime``; see :func:`_final_outputs`)."""
    exposed = _exposed_tallies(tallies, rewritten)
    names = _exposed_names(exposed, rewritten, runtime is not _ORT)
    reads = _Reads(exposed, zero_range, runtime)
    try:
        sets, expected_runs, actual_runs, notes = _run_models(
            original, rewritten, names, sets, fallback, runtime, reads)
    except _OriginalUnloadable as error:  # a custom op, say
        return not_checked(tallies, str(error))
    if isinstance(actual_runs, runtimes.RuntimeTimeout):  # slow, not refused: nothing compared, no fault found
        return not_checked(tallies, f"REWRITTEN did not finish on {runtime.name}: {one_line(actual_runs)}")
    if isinstance(actual_runs, runtimes.RuntimeFailure):
        return _refused(original, rewritten, exposed, sets, expected_runs, notes, runtime, actual_runs)
    reads.tell(sets)
    notes += qdq_note(original, sets, expected_runs) + saturation_note(original)
    outputs, from_ort = _final_outputs(original, rewritten, sets, expected_runs, actual_runs, runtime, notes)
    final = sum(size(run[v.name]) for run in expected_runs.values() for v in original.graph.outputs)
    if not reads.elements + final:
        reason = ("every input set gives empty graph outputs and DQL inputs: nothing was compared (their bits agree "
                  "only as empty arrays do); sizes above 0 check them")
        for tally in exposed:
            tally.result.model_level = f"not checked in the models: {reason}"
        return ModelCheck(outputs, sets, notes=notes, not_checked=reason, from_ort=from_ort)
    return ModelCheck(outputs, sets, notes=notes, from_ort=from_ort)
