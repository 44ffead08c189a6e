"""The model level's notes: what a final output's distance from ORT means on another runtime, what
exact means for a QDQ model and which of ORT's transformers change its outputs, and where ORT's
integer kernels saturate on this CPU.
"""

from __future__ import annotations

__all__ = ["either", "from_ort_in_context", "qdq_note", "saturation_note"]

from collections.abc import Sequence

import onnx_ir as ir

from dql_pass import runtimes
from dql_pass.errors import one_line
from dql_pass.graph.walk import graph_scopes
from dql_pass.op import DOMAINS
from dql_pass.runtimes.unsaturated import saturating_nodes
from dql_pass.verification.outputs import Sets, compare_output, size
from dql_pass.verification.report import OutputResult

_ORT = runtimes.get("onnxruntime")
_QDQ = ("QuantizeLinear", "DequantizeLinear")


def from_ort_in_context(
    runtime: runtimes.Runtime, from_ort: Sequence[OutputResult], baseline: Sequence[OutputResult]
) -> list[str]:
    """What a final output's distance from ORT means: ``baseline`` is ORIGINAL (its DQL expanded for
    the runtime) run there against ORIGINAL on ORT, the runtime's own float rounding."""
    notes = []
    for rewritten, original in zip(from_ort, baseline, strict=True):
        if rewritten.identical:
            continue
        if (rewritten.differing, rewritten.max_abs) == (original.differing, original.max_abs):
            notes.append(f"from ORT, {rewritten.name!r}: ORIGINAL on {runtime.name} is as far from ORT "
                         f"({original.detail}): that is {runtime.name}'s own float rounding, not the rewrite")
        else:
            distance = "bit-identical" if original.identical else original.detail
            notes.append(f"from ORT, {rewritten.name!r}: ORIGINAL on {runtime.name} against ORIGINAL on ORT: "
                         f"{distance}; the rest is the rewrite's own difference on {runtime.name}")
    return notes


def qdq_note(original: ir.Model, sets: Sets, runs: Sets) -> list[str]:
    """For an ORIGINAL holding QuantizeLinear or DequantizeLinear (a QDQ model): what exact means,
    and which of ORT's graph transformers, at its default level, change ORIGINAL's outputs, and by
    how much, measured on ``sets``."""
    if not any(node.op_type in _QDQ and node.domain in (*DOMAINS, "com.microsoft")
               for graph in graph_scopes(original) for node in graph):
        return []
    note = ("ORIGINAL holds QuantizeLinear/DequantizeLinear: exact means the ops as ONNX defines them, as ORT computes "
            "them at level basic without its QDQ transformers, which is how ORIGINAL ran")
    names = [v.name for v in original.graph.outputs]
    total = sum(size(run[name]) for run in runs.values() for name in names)

    def differing(session: runtimes.Session) -> int:
        fused = {label: dict(zip(session.output_names, session.run(feeds))) for label, feeds in sets.items()}
        return sum(compare_output(name, [r[name] for r in runs.values()], [r[name] for r in fused.values()]).differing
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


def saturation_note(original: ir.Model) -> list[str]:
    """Where ORT's kernels for some of ORIGINAL's integer products saturate on this CPU: how it ran."""
    nodes = saturating_nodes(original, _ORT.saturating_products())
    if not nodes:
        return []
    return [f"ORT's kernels for {', '.join(sorted({n.split()[0] for n in nodes}))} with these operand types saturate "
            f"on this CPU (x86 without VNNI, ORT PR #12088): {len(nodes)} such node(s) ran on ORT with their int8 "
            "operands shifted to uint8, which ORT computes exactly, as ONNX defines the op"]


def either(runtime: runtimes.Runtime, on_runtime: OutputResult, on_ort: OutputResult,
            ort_runs: Sets, runtime_runs: Sets, notes: list[str]) -> OutputResult:
    """A final output of REWRITTEN on ``runtime``, held to ORIGINAL there (``on_runtime``) or, where it
    differs from that, to ORIGINAL on ORT (``on_ort``), the contract's values: a rewrite that gives
    ORT's bits is exact, whatever ORIGINAL gives on the runtime. The note says which side differs."""
    if on_runtime.identical or not on_ort.identical:
        return on_runtime
    name = on_runtime.name
    apart = compare_output(name, [r[name] for r in ort_runs.values()], [r[name] for r in runtime_runs.values()])
    notes.append(f"final output {name!r}: ORIGINAL on {runtime.name} differs from ORT: {apart.detail}; REWRITTEN on "
                 f"{runtime.name} is bit-identical to ORT")
    return on_ort
