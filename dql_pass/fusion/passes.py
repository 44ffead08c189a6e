"""The fusion pass and its report: :class:`FuseDynamicQuantizeLinearPass` (see the package docstring)."""

from __future__ import annotations

__all__ = ["FuseDynamicQuantizeLinearPass", "FuseReport", "FuseResult"]

import collections
import dataclasses
import logging
from collections.abc import Iterator

import onnx_ir as ir
from onnx_ir.passes.common import TopologicalSortPass

# First: the version check runs before anything else of onnxscript's rewriter is imported.
from dql_pass.fusion._onnxscript_compat import rewrite

from onnxscript.rewriter import RULE_NAME_TAG

from dql_pass.fusion.diagnosis import UnfusedBlock, left_alone
from dql_pass.files.written import Written, shared_lines, written_dict
from dql_pass.fusion.rules import behaviour_notes, fuse_rules
from dql_pass.graph.constants import drop_unused
from dql_pass.graph.names import UniqueNames
from dql_pass.graph.walk import called_functions, check_ir_model, find_sites, graph_scopes

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class FuseReport:
    """What a fusion did: counts per graph path and rule, behaviour notes, blocks left alone."""

    fused: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    notes: dict[str, str] = dataclasses.field(default_factory=dict)
    left_alone: list[UnfusedBlock] = dataclasses.field(default_factory=list)
    dropped_functions: list[str] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(sum(by_rule.values()) for by_rule in self.fused.values())

    def counts(self) -> list[str]:
        """One line per graph path and rule: how many were fused there."""
        return [f"  {count:6d}  {label}  ({rule})"
                for label, by_rule in self.fused.items() for rule, count in by_rule.items()]

    def format(self) -> str:
        """The functions dropped, the behaviour changes, and what was left alone, with why."""
        lines = [f"dropped the model-local function {function}: nothing calls it any more"
                 for function in self.dropped_functions]
        for rule, note in self.notes.items():
            count = sum(by_rule.get(rule, 0) for by_rule in self.fused.values())
            lines.append(f"behaviour change of the {count} node(s) fused by {rule}: {note}")
        if self.left_alone:
            lines.append(f"left alone {len(self.left_alone)} ReduceMin/ReduceMax pair(s) that look like "
                         "DynamicQuantizeLinear:")
        for item in self.left_alone:
            closest = f"closest rule {item.rule}, {item.matched_nodes} nodes matched: " if item.rule else ""
            lines.append(f"  {item.graph}, x {item.x!r}: {closest}{item.reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"total": self.total, **dataclasses.asdict(self)}


@dataclasses.dataclass
class FuseResult(ir.passes.PassResult):
    """A PassResult that also carries the :class:`FuseReport`, and from :func:`dql_pass.fuse_file` what
    it read and wrote."""

    report: FuseReport = dataclasses.field(default_factory=FuseReport)
    written: Written | None = None

    def __repr__(self) -> str:  # not the model
        return f"FuseResult(modified={self.modified}, fused={self.report.total})"

    def format(self) -> str:
        """What fuse did: a line, the counts, the output's shared data, then the report."""
        report, written = self.report, self.written
        if report.total:
            what = f"fused {report.total} DynamicQuantizeLinear"
            lines = [written.done(what) if written else what, *report.counts()]
        else:
            lines = [written.unchanged("nothing to fuse") if written else "nothing to fuse"]
        lines += shared_lines(written)
        notes = report.format()
        return "\n".join(lines + ([notes] if notes else []))

    def to_dict(self) -> dict:
        return written_dict(self.written, self.report.to_dict())


def _containers(model: ir.Model) -> list[ir.Graph | ir.Function]:
    return [model.graph, *model.functions.values()]


def _domains(container: ir.Graph | ir.Function) -> set[str]:
    return {node.domain for node in ir.traversal.RecursiveGraphIterator(container)}


def _constants_in_use(model: ir.Model) -> Iterator[ir.Value]:
    for graph in graph_scopes(model):
        yield from (v for v in graph.initializers.values() if v.uses())
        yield from (n.outputs[0] for n in graph if n.op_type == "Constant" and n.domain == "" and n.outputs[0].uses())


@dataclasses.dataclass
class _Inventory:
    """What the model used before the fusion, to remove exactly what the fusion orphaned."""

    constants: list[ir.Value]
    functions: set[ir.OperatorIdentifier]
    domains: dict[ir.Graph | ir.Function, set[str]]

    @classmethod
    def of(cls, model: ir.Model) -> _Inventory:
        domains = {c: _domains(c) for c in _containers(model)}
        domains[model.graph] = set().union(*domains.values())  # the model imports what its functions use
        return cls(list(_constants_in_use(model)), called_functions(model, model.graph), domains)

    def remove_orphans(self, model: ir.Model) -> list[str]:
        """Remove what was in use before and is not now; the labels of the dropped functions."""
        drop_unused(self.constants)
        dropped = sorted(self.functions - called_functions(model, model.graph))
        for identifier in dropped:
            del model.functions[identifier]
        for container, before in self.domains.items():
            if container is model.graph:
                now = set().union(*(_domains(c) for c in _containers(model)))
                imports = model.opset_imports
            elif container.identifier() in model.functions:
                now, imports = _domains(container), container.opset_imports
            else:
                continue
            for domain in before - now:
                imports.pop(domain, None)
        return [f"{domain}::{name}" for domain, name, _ in dropped]


def _unique_names(model: ir.Model, fused: list[ir.Node]) -> None:
    """Rename fused nodes whose name another node of the model holds: ORT refuses the model otherwise.

    Unnamed ones stay unnamed: ORT takes any number of those.
    """
    new = set(fused)
    names = UniqueNames({node.name for graph in graph_scopes(model) for node in graph if node not in new and node.name})
    for node in fused:
        if node.name:
            node.name = names.unique(node.name)


def _fused_by_graph(model: ir.Model, fused: list[ir.Node]) -> dict[str, dict[str, int]]:
    """Graph path -> rule -> how many DQL nodes it fused there (the rule's tag is taken off the node)."""
    new = set(fused)
    counts = {}
    for label, nodes in find_sites(model).items():
        by_rule = collections.Counter(node.metadata_props.pop(RULE_NAME_TAG, "?") for node in nodes if node in new)
        if by_rule:
            counts[label] = dict(by_rule)
            logger.info("fused %d DynamicQuantizeLinear in %s", sum(by_rule.values()), label)
    return counts


class FuseDynamicQuantizeLinearPass(ir.passes.InPlacePass):
    """Fuse every decomposed DynamicQuantizeLinear back into one node (see the package docstring)."""

    def call(self, model: ir.Model) -> FuseResult:
        check_ir_model(model, "fuse")
        for container in _containers(model):
            imports = container.opset_imports
            if "ai.onnx" in imports and "" not in imports:
                # The same opset under its other name: the rewriter's new nodes import "".
                imports[""] = imports.pop("ai.onnx")
        inventory = _Inventory.of(model)
        rule_set = fuse_rules()
        fused = rewrite(rule_set, model)
        report = FuseReport()
        if fused:
            _unique_names(model, fused)
            report.dropped_functions = inventory.remove_orphans(model)
            TopologicalSortPass()(model)
            report.fused = _fused_by_graph(model, fused)
            used = {rule for by_rule in report.fused.values() for rule in by_rule}
            report.notes = {rule: note for rule, note in behaviour_notes().items() if rule in used}
        report.left_alone = left_alone(model, rule_set)
        return FuseResult(model, modified=bool(fused), report=report)
