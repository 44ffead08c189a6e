"""The one place that reaches into onnxscript's internals; it checks the version on import.

Jobs:

- the version check: importing :mod:`dql_pass.fusion` with an onnxscript outside
  :data:`SUPPORTED` raises :class:`UnsupportedOnnxscript`, one sentence that names the supported
  versions; expand and verify do not need onnxscript's rewriter and are not affected;
- :class:`NeighbourMatcher`, the matcher of every fusion rule (see below);
- :func:`rewrite`: the rule set applied through the rewriter's public pass, node names kept.

What still needs internals, and why. A pattern whose outputs come from several nodes (ONNX's body
with its two Identity nodes, the arithmetic body whose zero point is cast apart from y) is matched
by onnxscript's SimplePatternMatcher through every combination of same-op nodes of the whole
graph: quadratic in the Identity or Cast nodes of a model (timings in docs/performance.md).
The public API has no way to match the first output node alone, nor to say
where the others may be, so :class:`NeighbourMatcher` drives the matcher's private
``_init_match``, ``_match_node`` and ``_multi_match``, reads its ``_match`` and sets its
``_graph`` (which ``_match_node`` reads). It also reads the pattern's ``output_nodes``,
``has_single_output_node`` and the node patterns' ``op_identifier()``: not private, but not
documented either. Everything else of the fusion uses the public API only: ``RewriteRule``,
``RewriteRuleSet``, ``RewritePass``, ``MatchResult``, ``MatchStatus`` (by name),
``MatchingTracer.log`` and ``RULE_NAME_TAG``.

The invariant the matcher relies on, which :func:`dql_pass.fusion.rules.body_problems` checks
for every body a rule is built from: every output of the body other than y is computed by a node
of y's backward slice, or by a node that reads a value computed there. So the nodes that compute
the other outputs are consumers of the nodes that matched y's slice.

:func:`rewrite` undoes one thing of the rewriter: its closing NameFixPass names every unnamed
node of the model, and onnx_ir names the new ones, where the fusion names its own nodes and no
other.
"""

from __future__ import annotations

__all__ = ["NAME_TAG", "SUPPORTED", "NeighbourMatcher", "UnsupportedOnnxscript", "check_version", "rewrite"]

import itertools
import re

import onnx_ir as ir
import onnxscript

from dql_pass.errors import MissingDependency
from dql_pass.graph.walk import graph_scopes


class UnsupportedOnnxscript(MissingDependency):
    """The installed onnxscript is not one whose internals the fusion was tested with."""


# (major, minor) of the onnxscript releases the fusion was tested with.
SUPPORTED: tuple[tuple[int, int], ...] = ((0, 7),)


def check_version(version: str) -> None:
    """Raise :class:`UnsupportedOnnxscript` unless ``version`` is a release series of :data:`SUPPORTED`."""
    series = re.match(r"(\d+)\.(\d+)", version)
    if series is None or (int(series[1]), int(series[2])) not in SUPPORTED:
        names = " or ".join(f"{major}.{minor}.x" for major, minor in SUPPORTED)
        raise UnsupportedOnnxscript(
            f"dql_pass's fusion works with onnxscript {names}, and onnxscript {version} is installed; "
            "install a supported one to fuse (expanding and verifying work with any)"
        )


check_version(onnxscript.__version__)

from onnxscript.rewriter import RewritePass, pattern  # noqa: E402  (after the check, which says why it fails)


class NeighbourMatcher(pattern.SimplePatternMatcher):
    """SimplePatternMatcher that looks for the other output nodes next to the first one only.

    A pattern's first output node is matched at the candidate node as usual; the other output
    nodes are then searched among the consumers of the nodes that matched, not among every node
    of the graph (the invariant in the module docstring).
    """

    def match(
        self,
        model: ir.Model,
        graph_or_function: ir.Graph | ir.Function,
        node: ir.Node,
        *,
        verbose: int = 0,
        remove_nodes: bool = True,
        tracer: pattern.MatchingTracer | None = None,
    ) -> pattern.MatchResult:
        if self.pattern.has_single_output_node:
            return super().match(
                model, graph_or_function, node, verbose=verbose, remove_nodes=remove_nodes, tracer=tracer
            )
        self._graph = graph_or_function if isinstance(graph_or_function, ir.Graph) else graph_or_function.graph
        first, *others = self.pattern.output_nodes
        self._init_match(verbose)
        if not self._match_node(first, node):
            return self._match
        neighbours = list(
            dict.fromkeys(
                consumer
                for matched in self._match.nodes
                for value in matched.outputs
                for consumer in value.consumers()
                if consumer.graph is node.graph
            )
        )
        candidates = [[node]] + [
            [n for n in neighbours if other.op_identifier() in (None, n.op_identifier())] for other in others
        ]
        match = self._match
        for combination in itertools.product(*candidates):
            self._init_match(verbose)
            match = self._multi_match(combination, check_removable=remove_nodes)
            if match:
                return match
        if all(candidates[1:]):
            return match
        missing = ", ".join(other.op_type for other, found in zip(others, candidates[1:]) if not found)
        return pattern.MatchResult().fail(f"no {missing} node next to the block computes its other outputs", node)


# The metadata key under which a rule's rewrite leaves the name it gives its node ("" for none).
NAME_TAG = "dql_pass.fusion.name"


def rewrite(rules: pattern.RewriteRuleSet, model: ir.Model) -> list[ir.Node]:
    """Apply ``rules`` to ``model`` in place with the rewriter's RewritePass; the nodes it added.

    The nodes that were there keep their names, unnamed ones stay unnamed, and each new node takes
    the name its rule left under :data:`NAME_TAG`: the rewriter's closing NameFixPass names every
    unnamed node, and onnx_ir names each new node inserted without one.
    """
    names = {node: node.name for graph in graph_scopes(model) for node in graph}
    RewritePass(rules)(model)
    for node, name in names.items():
        node.name = name
    added = [node for graph in graph_scopes(model) for node in graph if node not in names]
    for node in added:
        # "" and not None: onnx_ir names a node without a name when the sort re-inserts it.
        node.name = node.metadata_props.pop(NAME_TAG, node.name)
    return added
