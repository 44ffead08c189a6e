"""Fuse decomposed DynamicQuantizeLinear back into single nodes, and report what was and was not fused.

What the pass does:

- applies :func:`dql_pass.rules.fuse_rules` with onnxscript's rewriter: in the main graph, in
  If/Loop/Scan bodies at any depth and in every model-local function;
- removes only what the fusion left unused: the constants (initializers, Constant nodes) that fed
  fused blocks, the model-local functions that nothing calls any more (dql_pass's own after
  ``expand(mode="function")``), and the opset imports of domains that no node uses any more;
- keeps every graph topologically sorted;
- reports, in a :class:`FuseReport`: the fused sites per graph path and per rule; how fused nodes
  behave differently from the blocks they replace (ONNX's unguarded body, dql_pass's
  ``onnx-reference`` zero range); the blocks that look like DQL but were left alone, and why.

A block looks like DQL when a ReduceMin and a ReduceMax read the same x. The reason given for
leaving it alone is the one of the rule that came closest to fusing it (the most nodes matched,
a failed check counting more than any partial structure).
"""

from __future__ import annotations

__all__ = ["FuseDynamicQuantizeLinearPass", "FuseReport", "FuseResult", "LeftAlone"]

import collections
import dataclasses
import logging
from collections.abc import Iterator

import onnx_ir as ir
from onnx_ir.passes.common import TopologicalSortPass
from onnxscript.rewriter import RULE_NAME_TAG

from dql_pass import rules
from dql_pass.walk import called_functions, find_sites, free_name, graph_scopes

logger = logging.getLogger(__name__)

# How far past the reductions a block's y can be: 12 nodes in the longest body (arithmetic).
_REACH = 16
_OTHER_USES = "Matched nodes have other uses preventing replacement."


@dataclasses.dataclass(frozen=True)
class LeftAlone:
    """A ReduceMin and ReduceMax of the same x that no rule fused."""

    graph: str
    x: str
    reason: str
    rule: str | None = None
    matched_nodes: int = 0


@dataclasses.dataclass
class FuseReport:
    """What a fusion did: counts per graph path and rule, behaviour notes, blocks left alone."""

    fused: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    notes: dict[str, str] = dataclasses.field(default_factory=dict)
    left_alone: list[LeftAlone] = dataclasses.field(default_factory=list)
    dropped_functions: list[str] = dataclasses.field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(sum(by_rule.values()) for by_rule in self.fused.values())


@dataclasses.dataclass
class FuseResult(ir.passes.PassResult):
    """A PassResult that also carries the :class:`FuseReport`."""

    report: FuseReport = dataclasses.field(default_factory=FuseReport)


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
    dql_nodes: set[ir.Node]

    @classmethod
    def of(cls, model: ir.Model) -> _Inventory:
        domains = {c: _domains(c) for c in _containers(model)}
        domains[model.graph] = set().union(*domains.values())  # the model imports what its functions use
        dql_nodes = {n for nodes in find_sites(model).values() for n in nodes}
        return cls(list(_constants_in_use(model)), called_functions(model, model.graph), domains, dql_nodes)

    def remove_orphans(self, model: ir.Model) -> list[str]:
        """Remove what was in use before and is not now; the labels of the dropped functions."""
        for value in self.constants:
            if value.uses() or value.is_graph_output():
                continue
            producer = value.producer()
            if producer is not None and producer.graph is not None:
                producer.graph.remove(producer, safe=True)
            elif value.is_initializer() and value.graph is not None:
                value.graph.initializers.pop(value.name)
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


def _reachable(graph: ir.Graph, start: list[ir.Node]) -> list[ir.Node]:
    """Nodes of ``graph`` at most ``_REACH`` steps downstream of ``start``."""
    seen = dict.fromkeys(start)
    frontier = list(start)
    for _ in range(_REACH):
        frontier = [
            consumer
            for node in frontier
            for value in node.outputs
            for consumer in value.consumers()
            if consumer.graph is graph and consumer not in seen
        ]
        seen.update(dict.fromkeys(frontier))
    return list(seen)


def _left_alone(model: ir.Model, rule_set) -> list[LeftAlone]:
    """ReduceMin and ReduceMax pairs on the same x that are still there, with the closest miss."""
    found = []
    for graph, (label, root) in graph_scopes(model).items():
        container = root if isinstance(root, ir.Function) and root.graph is graph else graph
        reductions: dict[ir.Value, dict[str, ir.Node]] = collections.defaultdict(dict)
        for node in graph:
            if node.op_type in ("ReduceMin", "ReduceMax") and node.domain == "" and node.inputs and node.inputs[0]:
                reductions[node.inputs[0]].setdefault(node.op_type, node)
        for x, pair in reductions.items():
            if len(pair) != 2:
                continue
            miss = rules.closest_miss(rule_set, model, container, _reachable(graph, list(pair.values())))
            if miss is None:
                found.append(LeftAlone(label, x.name or "", "nothing downstream has the shape of a DQL body"))
                continue
            reason = miss.reason
            if reason == _OTHER_USES:
                reason = "a value inside the block is used outside it or is a graph output"
            found.append(LeftAlone(label, x.name or "", reason, miss.rule, miss.matched_nodes))
    return found


def _unique_fused_names(model: ir.Model, kept: set[ir.Node]) -> None:
    """Rename fused nodes whose name another node of the model holds: ORT refuses the model otherwise."""
    nodes = [node for c in _containers(model) for node in ir.traversal.RecursiveGraphIterator(c)]
    used = {node.name for node in nodes if node in kept and node.name}
    counts: collections.Counter[str] = collections.Counter()
    for node in nodes:
        if node not in kept:
            node.name = free_name(node.name or "DynamicQuantizeLinear", used, counts)
            used.add(node.name)


class FuseDynamicQuantizeLinearPass(ir.passes.InPlacePass):
    """Fuse every decomposed DynamicQuantizeLinear back into one node (see the module docstring)."""

    def call(self, model: ir.Model) -> FuseResult:
        for container in _containers(model):
            imports = container.opset_imports
            if "ai.onnx" in imports and "" not in imports:
                # The same opset under its other name: the rewriter's new nodes import "".
                imports[""] = imports.pop("ai.onnx")
        inventory = _Inventory.of(model)
        rule_set = rules.fuse_rules()
        names = {node: node.name for c in _containers(model) for node in ir.traversal.RecursiveGraphIterator(c)}
        count = rule_set.apply_to_model(model)
        # The rewriter's closing NameFixPass names every unnamed node; only the fused ones need it.
        for node, name in names.items():
            node.name = name
        _unique_fused_names(model, set(names))
        report = FuseReport()
        if count:
            report.dropped_functions = inventory.remove_orphans(model)
            TopologicalSortPass()(model)
            for label, nodes in find_sites(model).items():
                by_rule: collections.Counter[str] = collections.Counter()
                for node in nodes:
                    if node not in inventory.dql_nodes:
                        by_rule[node.metadata_props.pop(RULE_NAME_TAG, "?")] += 1
                if by_rule:
                    report.fused[label] = dict(by_rule)
                    logger.info("fused %d DynamicQuantizeLinear in %s", sum(by_rule.values()), label)
            used = {rule for by_rule in report.fused.values() for rule in by_rule}
            report.notes = {rule: note for rule, note in rules.behaviour_notes().items() if rule in used}
        report.left_alone = _left_alone(model, rule_set)
        return FuseResult(model, modified=bool(count), report=report)
