"""Lower the quantization ops of a ``quantize_dynamic`` model to float32 primitives, exactly.

Rules the pass applies:

- In the ai.onnx domain, in the main graph, If/Loop/Scan bodies at any depth and every
  model-local function: MatMulInteger, ConvInteger, QuantizeLinear and DequantizeLinear are
  rewritten by :mod:`dql_pass.lowering.rules`, each under the proof of :mod:`dql_pass.lowering.proof`;
  a node that cannot be lowered exactly is left alone, with the reason in the report, and so is an
  integer product whose float32 form ``target`` was measured not to compute exactly
  (:attr:`~dql_pass.runtimes.Runtime.inexact_products`).
- Constant int8 and uint8 weights are kept as they are in the file (``weights="integer"``, a Cast
  and Sub in the graph that runtimes fold at load) or stored cast and shifted as float32
  (``"float"``, four times their size); the default is the target's
  (:attr:`dql_pass.runtimes.Runtime.weights`), ``float`` without a target.
- Then every DynamicQuantizeLinear goes through :class:`~dql_pass.expansion.ExpandDynamicQuantizeLinearPass`
  with the variant that is exact on ``target`` (``arithmetic``, which has no quantization op, when
  there is no target); the QuantizeLinear that variant may stamp is the target's to run.
- With ``blocks`` (the target's :attr:`~dql_pass.runtimes.Runtime.blocks` by default, off without a
  target), a DQL whose y and y_zero_point only lowered products read keeps its quantized activation
  in float32, and a product's Cast to int32 that only a Cast to float32 reads goes with it
  (:mod:`dql_pass.lowering.blocks`).
- Every replaced node's output keeps its name, but for a Cast pair a block drops, whose float32 value
  takes the name of the last Cast's output; every new name is unique across the model.
- Constants (shifted weights, scales, zero points, Slice bounds) are shared per root: initializers
  of the main graph, Constant nodes at the top of a function. Weights and zero points that only
  the replaced nodes read are dropped as each node is replaced, so that one weight at a time is
  held in both forms.
- The report says per node which proof applied, what was left alone and why, and which ops that
  stay in the model ``target`` lacks (:func:`dql_pass.runtimes.lacking`).
- A model with nothing to lower is left untouched; the pass is idempotent.
"""

from __future__ import annotations

__all__ = ["LowerQuantizationPass", "LowerReport", "LowerResult", "LoweredNode", "UnloweredNode"]

import collections
import dataclasses
import logging
import re
from collections.abc import Collection

import numpy as np
import onnx_ir as ir

from dql_pass import runtimes, variants
from dql_pass.files.written import Written, shared_lines, written_dict
from dql_pass.expansion import ExpandDynamicQuantizeLinearPass, check_sites
from dql_pass.graph.constants import drop_unused
from dql_pass.lowering import blocks
# expand's name and constant stores, so that lowered and expanded sites share one naming scheme.
from dql_pass.graph.names import SharedConstants, UniqueNames
from dql_pass.graph.walk import check_ir_model, find_sites, graph_scopes, label, ops_used
from dql_pass.lowering.rules import LOWERED, Builder, CannotLower, lower_node
from dql_pass.op import DOMAINS, ai_onnx_opset, check_choice

logger = logging.getLogger(__name__)

_MIN_OPSET = 11  # Round, and Clip with its bounds as inputs


@dataclasses.dataclass(frozen=True)
class LoweredNode:
    graph: str
    node: str
    op_type: str
    proof: str


@dataclasses.dataclass(frozen=True)
class UnloweredNode:
    graph: str
    node: str
    op_type: str
    reason: str


@dataclasses.dataclass
class LowerReport:
    """What :class:`LowerQuantizationPass` lowered (per node, with its proof), left alone (with the
    reason), and which remaining ops the target lacks."""

    target: str | None
    variant: str
    weights: str = "float"  # how constant integer weights were stored: dql_pass.variants.WEIGHTS
    blocks: int = 0  # DQL sites whose quantized activation stays in float32 (dql_pass.lowering.blocks)
    no_blocks: str | None = None  # why blocks were asked for and none kept
    lowered: list[LoweredNode] = dataclasses.field(default_factory=list)
    left_alone: list[UnloweredNode] = dataclasses.field(default_factory=list)
    lacking: list[runtimes.Lack] = dataclasses.field(default_factory=list)  # of the target, after lowering

    def format(self) -> str:
        lines = [f"  {n.op_type} {n.node!r} in {n.graph}: {n.proof}" for n in self.lowered]
        lines += [f"left alone: {n.op_type} {n.node!r} in {n.graph}: {n.reason}" for n in self.left_alone]
        if self.blocks:
            lines.append(f"{self.blocks} DynamicQuantizeLinear sites keep y - y_zero_point in float32 (blocks)")
        lines += [f"no blocks: {self.no_blocks}"] if self.no_blocks else []
        lines += [f"still blocks {self.target}: {lack.describe()}" for lack in self.lacking]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "lacking": [lack.describe() for lack in self.lacking]}


@dataclasses.dataclass
class LowerResult(ir.passes.PassResult):
    """A PassResult that also carries the :class:`LowerReport`; from :func:`dql_pass.lower_file` also
    what it read and wrote, and the nodes and bytes of both models."""

    report: LowerReport = dataclasses.field(default_factory=lambda: LowerReport(None, "arithmetic"))
    weights_asked: bool = False  # the weights were asked for, not the target's default
    written: Written | None = None
    footprint: tuple[tuple[int, int], tuple[int, int]] | None = None  # (nodes, bytes) before and after

    def __repr__(self) -> str:  # not the model
        return (f"LowerResult(modified={self.modified}, lowered={len(self.report.lowered)}, "
                f"left_alone={len(self.report.left_alone)})")

    def format(self, verbose: bool = False) -> str:
        """What lower did in a few lines; the proof of each node with ``verbose``."""
        report, written = self.report, self.written
        if self.modified:
            counts = collections.Counter(node.op_type for node in report.lowered)
            what = f"lowered {len(report.lowered)} nodes ({', '.join(f'{n} {op}' for op, n in counts.items())})"
            lines = [f"{written.done(what) if written else what} (weights {report.weights})", *self._summary(verbose)]
        else:
            lines = [written.unchanged("nothing to lower") if written else "nothing to lower"]
        lines += shared_lines(written)
        # The proof of each node is for verbose; what was left alone and what still blocks, always.
        lines += [line for line in report.format().splitlines() if verbose or not line.startswith("  ")]
        return "\n".join(lines)

    def _summary(self, verbose: bool) -> list[str]:
        """Each kind of rewrite with its count, nodes and size before and after, and the weights with why."""
        report = self.report
        kinds = collections.Counter((node.op_type, re.sub(r" \(.*\)$", "", node.proof)) for node in report.lowered)
        lines = [f"  {n:4d} {op}: {proof}" for (op, proof), n in kinds.items()]
        if self.footprint is not None:
            (nodes, size), (nodes_after, size_after) = self.footprint
            lines.append(f"  nodes {nodes:,} -> {nodes_after:,}; size {size:,} -> {size_after:,} bytes "
                         f"({size_after / max(size, 1):.1f}x)")
        why = ("as --weights asked" if self.weights_asked else f"{report.target}'s default" if report.target
               else "the default without --target")
        kept = ("8-bit weights kept as they are, cast and shifted in the graph, which runtimes fold when they load it"
                if report.weights == "integer" else "8-bit weights stored cast and shifted as float32, four times "
                "their size; --weights integer keeps them 8-bit")
        lines.append(f"  weights {report.weights} ({why}): {kept}")
        return lines if verbose else [*lines, "  (-v gives the proof of each node)"]

    def to_dict(self) -> dict:
        sizes = {}
        if self.footprint is not None:
            (nodes, size), (nodes_after, size_after) = self.footprint
            sizes = {"nodes_before": nodes, "nodes_after": nodes_after, "bytes_before": size, "bytes_after": size_after}
        return written_dict(self.written, {**sizes, **self.report.to_dict()})


class LowerQuantizationPass(ir.passes.InPlacePass):
    """Rewrite the quantization ops of ``quantize_dynamic`` into float32 primitives (see the module docstring)."""

    def __init__(self, target: str | None = None, weights: str | None = None, blocks: bool | None = None,
                 op_types: Collection[str] = LOWERED):
        super().__init__()
        # verify lowers only the ops a runtime computes otherwise than ONNX (DQL sites are expanded whatever it says)
        self.op_types = frozenset(op_types)
        runtime = None if target is None else runtimes.get(target)
        self.target = None if runtime is None else runtime.name
        self.variant = "arithmetic" if runtime is None else runtime.variant
        # The integer products the target does not compute exactly in float32 stay as they are.
        self.inexact = {} if runtime is None else {p.op_type: p for p in runtime.inexact_products}
        default = "float" if runtime is None else runtime.weights
        self.weights = check_choice("weights", default if weights is None else weights)
        self.blocks = (runtime is not None and runtime.blocks) if blocks is None else blocks
        self.asked = blocks is True  # say why when none can be kept
        self.weights_asked = weights is not None

    def call(self, model: ir.Model) -> LowerResult:
        check_ir_model(model, "lower")
        check_sites(find_sites(model))  # before anything is rewritten
        report = LowerReport(self.target, self.variant, self.weights)
        names = UniqueNames.of_model(model)
        stores: dict[int, SharedConstants] = {}
        made: set[ir.Node] = set()  # the nodes lower made: blocks only take the products' own Casts
        for graph, (path, root) in graph_scopes(model).items():
            opset = ai_onnx_opset(root.opset_imports) or 0
            for node in list(graph):
                if node.domain not in DOMAINS or node.op_type not in self.op_types:
                    continue
                where = label(node)
                if opset < _MIN_OPSET:
                    reason = f"ai.onnx opset {opset} < {_MIN_OPSET}"
                    report.left_alone.append(UnloweredNode(path, where, node.op_type, reason))
                    continue
                if node.op_type in self.inexact:
                    reason = self.inexact[node.op_type].describe()
                    report.left_alone.append(UnloweredNode(path, where, node.op_type, reason))
                    continue
                store = stores.setdefault(id(root), SharedConstants(root, names))
                constant = lambda role, array, store=store: store.get(role, ir.tensor(np.asarray(array, order="C")))  # noqa: E731
                try:
                    lowering = lower_node(node, Builder(names.prefix(where), constant, self.variant, self.weights))
                except CannotLower as reason:
                    report.left_alone.append(UnloweredNode(path, where, node.op_type, str(reason)))
                    continue
                inputs = list(node.inputs)
                ir.convenience.replace_nodes_and_values(graph, node, [node], lowering.nodes, node.outputs,
                                                        [lowering.output])
                drop_unused(inputs)  # now, so that each weight is freed before the next is converted
                made.update(lowering.nodes)
                if self.blocks and lowering.proof is not None and len(lowering.proof.chunks) == 1:
                    blocks.fold_cast_pair(graph, lowering.output)
                proof = lowering.proof.describe() if lowering.proof else "elementwise, exact as ORT computes it"
                report.lowered.append(LoweredNode(path, where, node.op_type, proof))
        sites = find_sites(model)
        for path, nodes in sites.items():
            proof = f"expanded, variant {self.variant}"
            report.lowered += [LoweredNode(path, n.name or n.outputs[0].name, n.op_type, proof) for n in nodes]
        kept = [block for nodes in sites.values() for node in nodes
                if (block := blocks.reading_products(node, made)) is not None] if self.blocks else []
        if sites:
            ExpandDynamicQuantizeLinearPass(variant=self.variant, runtime=self.target)(model)
        if kept and not variants.BY_NAME[self.variant].float_y:
            if self.asked:
                why = ("makes y by QuantizeLinear" if self.variant == "quantizelinear" else
                       "casts a NaN to uint8 for y where x holds both infinities")
                report.no_blocks = (f"variant {self.variant} {why}, so y - y_zero_point is not kept in float32 "
                                    "(variants portable's and lean's are, as for --target webgpu)")
            kept = []
        if kept:
            block_names = UniqueNames.of_model(model)  # the expansion's names too
            roots = {graph: root for graph, (_, root) in graph_scopes(model).items()}
            tables = {root: SharedConstants(root, block_names) for root in set(roots.values())}
            for block in kept:
                report.blocks += blocks.keep_in_float(block, block_names, tables[roots[block.shifts[0].graph]])
        if report.lowered:
            model.ir_version = max(model.ir_version, 4)  # initializers that are not graph inputs
        if self.target is not None:
            report.lacking = runtimes.lacking(self.target, ops_used(model), ai_onnx_opset(model.opset_imports) or 0)
        for item in report.left_alone:
            logger.info("left alone %s %r in %s: %s", item.op_type, item.node, item.graph, item.reason)
        logger.info("lowered %d nodes", len(report.lowered))
        return LowerResult(model, modified=bool(report.lowered), report=report, weights_asked=self.weights_asked)
