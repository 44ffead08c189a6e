"""What to run for a model, per runtime: what the model needs that the runtime lacks, and the
command that fixes it (``expand --target``, ``lower --target``, ``lower`` or nothing).

For a runtime with an adapter the answer comes from its stated data (the ops it lacks, the ops
that run but off the accelerator, the inputs its own DynamicQuantizeLinear gets wrong, the
products lower leaves alone there) and, when asked to, from a real load where it is installed.
For a runtime without one (TensorRT, CoreML, ...) it comes from
:data:`dql_pass.registry.ELSEWHERE`, with the source of each fact.
"""

from __future__ import annotations

__all__ = ["Advice", "RuntimeAdvice", "advise"]

import collections
import dataclasses
import os
import shlex  # the commands are printed for a shell: a path with spaces or quotes stays one argument
from collections.abc import Sequence

import onnx_ir as ir

from dql_pass import runtimes as registry
from dql_pass.files import load_model
from dql_pass.graph.walk import check_ir_model, op_key
from dql_pass.lowering import LOWERED
from dql_pass.op import ai_onnx_opset
from dql_pass.verification.deployable import blockers

_DQL = "DynamicQuantizeLinear"
_QUANTIZATION = (_DQL, *(op for op in LOWERED if op != _DQL))  # the ops expand or lower replace


@dataclasses.dataclass
class RuntimeAdvice:
    """One runtime's answer: what the model needs there that it lacks, and what to run."""

    runtime: str
    adapter: bool  # whether dql_pass can run models there (verify --runtime, --target)
    needs: list[str]  # one line per thing the runtime lacks of this model; empty: nothing
    command: str | None  # the dql-pass command that fixes it; None: nothing to run
    notes: list[str] = dataclasses.field(default_factory=list)  # what stays after it, what was not tried, sources
    loaded: bool | None = None  # True: it loaded and ran the model; False: it refused it; None: not tried


@dataclasses.dataclass
class Advice:
    """Per runtime, what ``model`` needs and the command for it; :meth:`format` is the CLI's report."""

    model: str
    ops: dict[str, int]  # the quantization ops of the model, counted
    runtimes: list[RuntimeAdvice]

    def format(self) -> str:
        counted = ", ".join(f"{n} {op}" for op, n in self.ops.items()) or "no quantization op"
        lines = [f"{self.model}: {counted}"]
        width = max(len(r.runtime) for r in self.runtimes)
        for row in self.runtimes:
            # A need no command meets (a load refused for another op) is not "nothing to run".
            command = row.command or ("no dql-pass command meets what it needs" if row.needs else "nothing to run")
            lines.append(f"{row.runtime:<{width}}  {command}")
            lines += [f"{'':<{width}}    needs: {need}" for need in row.needs]
            lines += [f"{'':<{width}}    note: {note}" for note in row.notes]
            if row.loaded is not None:
                lines.append(f"{'':<{width}}    loaded on {row.runtime}: "
                             f"{'it loads and runs' if row.loaded else 'refused'}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _count(model: ir.Model) -> collections.Counter[tuple[str, str]]:
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for root in (model.graph, *model.functions.values()):
        counts.update(op_key(node) for node in ir.traversal.RecursiveGraphIterator(root))
    return counts


def _names(ops: Sequence[str], counts: collections.Counter[tuple[str, str]]) -> str:
    return ", ".join(f"{counts[('', op)]} {op}" for op in ops)


def _beside(path: str, label: str) -> str:
    """An output path for the command: beside the model, named after it and ``label``."""
    return os.path.join(os.path.dirname(path), f"{os.path.splitext(os.path.basename(path))[0]}.{label}.onnx")


def _with_adapter(
    name: str, path: str, counts: collections.Counter[tuple[str, str]], opset: int, model: ir.Model | None
) -> RuntimeAdvice:
    runner = registry.get(name)
    stem = f"dql-pass {{}} {shlex.quote(path)} -o {shlex.quote(_beside(path, name))} --target {name}"
    needs, notes = [], []
    lacks = registry.lacking(name, counts, opset)
    needs += [lack.describe() for lack in lacks]
    wanting = {lack.op_type for lack in lacks if lack.domain == ""}
    off_device = [op for op in runner.no_kernel if ("", op) in counts and op in _QUANTIZATION]
    if off_device:
        needs.append(f"{_names(off_device, counts)} run on the CPU, not on {name}: it has no kernel for them")
        wanting |= set(off_device)
    native = sorted({d.inputs or "some" for d in runner.known_differences
                     if "native" in d.forms and d.policy in (None, "onnxruntime")})
    if ("", _DQL) in counts and native and _DQL not in wanting:
        needs.append(f"its own {_DQL} differs from ORT's on {', '.join(native)} inputs")
        wanting.add(_DQL)
    loaded = None
    if model is not None:
        found = blockers(model, name)
        if found.not_tried:
            notes.append(found.not_tried)
        else:
            refusals = [reason for reason in found.reasons if reason not in needs]
            needs += refusals
            loaded = not refusals
            wanting |= {op for op in _QUANTIZATION if any(op in reason for reason in refusals)}
    fixable = wanting & set(_QUANTIZATION)
    if fixable - {_DQL}:
        command = stem.format("lower")
        notes += [f"lower leaves {p.op_type} alone on {name}: {p.reason}" for p in runner.inexact_products
                  if ("", p.op_type) in counts]
    elif fixable:
        command = stem.format("expand")
    else:
        command = None
    if wanting - fixable:
        notes.append(f"no dql-pass command gives it {', '.join(sorted(wanting - fixable))}")
    return RuntimeAdvice(name, True, needs, command, notes, loaded)


def _without_adapter(name: str, path: str, counts: collections.Counter[tuple[str, str]]) -> RuntimeAdvice:
    other = registry.ELSEWHERE[name]
    present = [op for op in other.lacks if ("", op) in counts]
    if not present:
        return RuntimeAdvice(name, False, [], None, [f"{other.title} has no adapter here: from {other.source}"])
    needs = [f"{_names(present, counts)}: {other.reason}"]
    notes = [f"source: {other.source} (not measured here)"]
    if other.after:
        notes.append(f"then {other.after}")
    return RuntimeAdvice(name, False, needs,
                         f"dql-pass lower {shlex.quote(path)} -o {shlex.quote(_beside(path, 'float'))}", notes)


def advise(model: str | os.PathLike, runtimes: Sequence[str] | None = None, *, load: bool | None = None) -> Advice:
    """What ``model`` (a path) needs on each runtime of ``runtimes`` (default: every runtime
    dql_pass knows, with an adapter or not) and the command for it.

    ``load``: also load and run the model where the runtime is installed (a real load tells of an
    op no stated lack names); default: only for the runtimes named.
    """
    path = os.fspath(model)
    graph = load_model(path)
    check_ir_model(graph, "advise")
    names = list(runtimes) if runtimes else [*registry.RUNTIMES, *registry.ELSEWHERE]
    for name in names:
        if name not in registry.ELSEWHERE:
            registry.get(name)  # an unknown name is bad input, before any work
    load = bool(runtimes) if load is None else load
    counts = _count(graph)
    opset = ai_onnx_opset(graph.opset_imports) or 0
    rows = [
        _without_adapter(name, path, counts) if name in registry.ELSEWHERE
        else _with_adapter(name, path, counts, opset, graph if load else None)
        for name in names
    ]
    ops = {op: counts[("", op)] for op in _QUANTIZATION if counts[("", op)]}
    return Advice(path, ops, rows)
