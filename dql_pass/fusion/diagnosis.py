"""Why a block that looks like DynamicQuantizeLinear was left alone.

A block looks like DQL when a ReduceMin and a ReduceMax read the same x (every body begins so,
see :func:`dql_pass.fusion.rules.body_problems`). For each such pair still there after the
fusion, :func:`left_alone` tries every rule at every node within :func:`reach` steps downstream,
without rewriting, and keeps the attempt that came closest (:func:`closest_miss`):

- a full match, checks passed, beats a failed check, which beats a partial structure; then the
  most nodes matched; then the later root (the block's last node, which computes y, says most);
- a full match left alone means a value inside the block is used outside it or is a graph
  output: the rewriter replaces only blocks whose inner values nobody else reads. That is
  checked here, not read off the matcher's message.
"""

from __future__ import annotations

__all__ = ["Miss", "UnfusedBlock", "closest_miss", "left_alone", "reach"]

import collections
import dataclasses
import functools
from collections.abc import Iterable

import onnx
import onnx_ir as ir
from onnxscript.rewriter.pattern import MatchingTracer, MatchResult, MatchStatus, RewriteRule

from dql_pass import decomposition
from dql_pass.op import NAME, VARIANTS
from dql_pass.graph.walk import graph_scopes


@dataclasses.dataclass(frozen=True)
class Miss:
    """The closest any rule came to fusing at a node: how many nodes matched, and why it stopped."""

    rule: str
    matched_nodes: int
    status: MatchStatus
    reason: str


@dataclasses.dataclass(frozen=True)
class UnfusedBlock:
    """A ReduceMin and ReduceMax of the same x that no rule fused."""

    graph: str
    x: str
    reason: str
    rule: str | None = None
    matched_nodes: int = 0


# How far an attempt got, least first. A rule's match() logs no REPLACEMENT_FAILED; it is placed
# where the rewriter puts it, between a passed check and a rewrite.
_PROGRESS = (MatchStatus.NO_MATCH, MatchStatus.CONDITION_FAILED, MatchStatus.REPLACEMENT_FAILED, MatchStatus.SUCCESS)


class _ClosestTracer(MatchingTracer):
    """Keeps the single attempt that went furthest (see the module docstring for the order)."""

    def __init__(self) -> None:
        super().__init__()
        self.best: tuple[tuple[int, int, int], Miss] | None = None
        self.root_index = 0

    def log(self, rule, container, node, match_result: MatchResult, status: MatchStatus) -> None:
        score = (_PROGRESS.index(status), len(match_result.nodes), self.root_index)
        if score[:2] == (0, 0) or (self.best is not None and score <= self.best[0]):
            return
        if status == MatchStatus.SUCCESS:
            reason = _used_outside(match_result)
        else:
            reason = match_result.reason or "no reason given"
            places = [_where(s) for s in match_result.failure_nodes_and_values if isinstance(s, ir.Node)]
            if places:
                reason = f"{reason} (at {places[0]})"
        self.best = (score, Miss(str(rule), score[1], status, reason))


def _used_outside(match: MatchResult) -> str:
    """Why a full match cannot replace its nodes: the first inner value read outside them."""
    for node in match.nodes:
        for value in node.outputs:
            if value in match.outputs:
                continue
            if value.is_graph_output() or any(user not in match.nodes for user, _ in value.uses()):
                return f"a value inside the block is used outside it or is a graph output ({value.name!r})"
    return "the whole block matches, and nothing inside it is used outside"


def _where(node: ir.Node) -> str:
    if node.name:
        return f"{node.op_type} {node.name!r}"
    return f"the {node.op_type} computing {node.outputs[0].name!r}" if node.outputs else node.op_type


def closest_miss(
    rules: Iterable[RewriteRule],
    model: ir.Model,
    container: ir.Graph | ir.Function,
    roots: Iterable[ir.Node],
) -> Miss | None:
    """Try every rule at every root without rewriting; the attempt that went furthest.

    Nodes are matched as if they could be replaced, so that a block whose inner value is used
    outside comes out as a full match. None when nothing matched a single node.
    """
    tracer = _ClosestTracer()
    rules = list(rules)
    for tracer.root_index, root in enumerate(roots):
        for rule in rules:
            rule.match(model, container, root, check_nodes_are_removable=False, tracer=tracer)
    return None if tracer.best is None else tracer.best[1]


@functools.cache
def reach() -> int:
    """How many steps downstream of its reductions a block's y can be.

    The longest path of any body the rules fuse: dql_pass's from its variant records, ONNX's
    bounded by its number of compute nodes.
    """
    schema = onnx.defs.get_schema(NAME)
    onnx_bodies = (
        onnx.FunctionProto.FromString(schema.get_function_with_opset_version(v)) for v in schema.function_opset_versions
    )
    return max(
        *(decomposition.variant(v).longest_path for v in VARIANTS),
        *(sum(n.op_type != "Constant" for n in body.node) for body in onnx_bodies),
    )


def _reachable(graph: ir.Graph, start: list[ir.Node]) -> list[ir.Node]:
    """Nodes of ``graph`` at most :func:`reach` steps downstream of ``start``, nearest first."""
    seen = dict.fromkeys(start)
    frontier = list(start)
    for _ in range(reach()):
        frontier = [
            consumer
            for node in frontier
            for value in node.outputs
            for consumer in value.consumers()
            if consumer.graph is graph and consumer not in seen
        ]
        seen.update(dict.fromkeys(frontier))
    return list(seen)


def left_alone(model: ir.Model, rules: Iterable[RewriteRule]) -> list[UnfusedBlock]:
    """ReduceMin and ReduceMax pairs on the same x that are still there, with the closest miss."""
    rules = list(rules)
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
            miss = closest_miss(rules, model, container, _reachable(graph, list(pair.values())))
            if miss is None:
                found.append(UnfusedBlock(label, x.name or "", "nothing downstream has the shape of a DQL body"))
            else:
                found.append(UnfusedBlock(label, x.name or "", miss.reason, miss.rule, miss.matched_nodes))
    return found
