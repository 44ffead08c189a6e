"""Checking what REWRITTEN computes in place of the integer ops of ORIGINAL that it no longer has.

Rules:

- a lowered site is a MatMulInteger, ConvInteger, QuantizeLinear or DequantizeLinear node of
  ORIGINAL (ai.onnx; main graph, subgraphs, functions) whose output no node of the same type
  makes in REWRITTEN: a rewrite replaced it, by dql_pass or any other tool;
- its replacement is REWRITTEN's computation of the value its readers read (a reader of the same
  domain, type and output names as ORIGINAL's, else the value named like that output), sliced
  back to the values named like the node's inputs that are not constant in ORIGINAL by the one
  slice DQL sites go through (:mod:`dql_pass.graph.slice`, which imports only the domains the
  replacement uses); one that needs any other value is not reachable, and the verdict INCOMPLETE,
  never PASS; a REWRITTEN without that value has lost it;
- the replacement runs on the runtime against the exact NumPy reference
  (:mod:`dql_pass.reference`) with ORIGINAL's constants (weights, scales, zero points, and any
  operand stored in ORIGINAL: the replacement reads that one, so it is checked on its stored value
  only) and synthesized operands for the others; every case must match in type, shape and bits;
- the operands are those its rule's record names (:mod:`dql_pass.lowering.operands`), and the
  expected values its reference's, the record being the one place a rule lives
  (:data:`dql_pass.lowering.rules.RULES`): this module names no op;
- of the cases that differ, the row keeps the most severe (a failure, then a wrong type or shape,
  then the most wrong elements), as a DQL site's row does;
- what no operands are made for (blocked quantization, 4-bit and float8 types, a product with a
  batched B past 2^24) is not checked, with the reason: INCOMPLETE; so is the replacement of an
  integer product whose float product reads a constant that is not whole, whose fraction a Cast to
  int32 hides from the cases;
- the replacement's inputs declare the operands' shapes (a runtime may need their rank); one that
  another runtime cannot load runs on ORT, and what that runtime cannot load or run is reported
  not checked there, with its reason;
- operands whose shape cannot be told (a non-constant weight of unknown shape), or that were made in
  other shapes than the site's static ones the replacement declares, are not checked, with the
  reason: INCOMPLETE;
- a block (:mod:`dql_pass.lowering.blocks`): where REWRITTEN lacks an operand and its zero point
  (a pair the rule's record names) but holds their float32 difference under
  :func:`~dql_pass.lowering.blocks.centred_name` of the operand, the replacement is sliced back to
  that difference and fed the operands' difference in float32; the DQL site's check holds that
  value to the reference's y - y_zero_point, so the two checks cover the block;
- where REWRITTEN lacks the op's output and ORIGINAL's only reader of it is a Cast to float32 (a
  block drops that Cast pair), the value named like the Cast's output is checked against the
  reference cast to float32: all that ORIGINAL reads of the op.
"""

from __future__ import annotations

__all__ = ["LoweredSite", "check_lowered", "lowered_sites"]

import dataclasses
import logging
from collections.abc import Iterable, Sequence

import numpy as np
import onnx_ir as ir

from dql_pass import runtimes
from dql_pass.compare import WORST, SiteDifference, bit_difference
from dql_pass.errors import one_line
from dql_pass.graph.constants import constant
from dql_pass.graph.slice import NotReachable, site_model
from dql_pass.graph.walk import described, graph_scopes, live, op_key
from dql_pass.lowering.blocks import cast_reader, centred_name
from dql_pass.lowering.operands import Unsynthesizable
from dql_pass.lowering.rules import RULES, Rule
from dql_pass.op import DOMAINS
from dql_pass.verification.extract import Scopes, reader
from dql_pass.verification.progress import advance
from dql_pass.verification.report import SiteResult, Tally

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoweredSite:
    """An integer op of ORIGINAL: where it is, its input names (None: absent), the arrays of its
    constant inputs, the types and static shapes of the others, and its attributes."""

    name: str
    graph: str
    op_type: str
    output: str
    inputs: tuple[str | None, ...]
    constants: tuple[np.ndarray | None, ...]
    types: tuple[ir.DataType | None, ...]
    shapes: tuple[tuple[int, ...] | None, ...]
    attributes: dict[str, object]
    live: bool
    # ORIGINAL's nodes in the same graph that read the output: ((domain, op type), their output names, input index).
    readers: tuple[tuple[tuple[str, str], tuple[str, ...], int], ...] = ()
    cast: str | None = None  # the output of ORIGINAL's only reader of the output, when that is a Cast to float32



def _static(value: ir.Value) -> tuple[int, ...] | None:
    shape = value.shape
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def lowered_sites(original: ir.Model) -> list[LoweredSite]:
    """Every integer op of ORIGINAL that a rewrite may lower."""
    alive = live(original)[0]
    sites = []
    for graph, (label, _) in graph_scopes(original).items():
        for node in graph:
            if node.domain not in DOMAINS or node.op_type not in RULES or len(node.outputs) != 1:
                continue
            inputs = list(node.inputs)
            sites.append(LoweredSite(
                described(node), label, node.op_type, node.outputs[0].name,
                tuple(None if v is None else v.name for v in inputs),
                tuple(constant(v) for v in inputs),
                RULES[node.op_type].operand_types(node),
                tuple(None if v is None else _static(v) for v in inputs),
                {name: attr.value for name, attr in node.attributes.items()},
                node in alive,
                tuple((op_key(use.node), tuple(v.name for v in use.node.outputs), use.idx)
                      for use in node.outputs[0].uses() if use.node.graph is graph),
                cast_reader(node.outputs[0]),
            ))
    return sites


def _fed(site: LoweredSite) -> list[int]:
    """The positions of the site's inputs that are not constant in ORIGINAL: the extracted model's inputs."""
    return [i for i, (name, array) in enumerate(zip(site.inputs, site.constants)) if name is not None and array is None]


def _read(values: dict[str, ir.Value], site: LoweredSite, alive: set[ir.Node]) -> ir.Value:
    """The value REWRITTEN's readers of the site read: where ORIGINAL's reader is still there (same
    domain, type and output names) and live in REWRITTEN (``alive``, where the site was live), what it
    reads in the site's place, else the value of the site's name. A value that only keeps the name,
    read by nothing that matters, is not what gets checked."""
    read = {
        node.inputs[index]
        for op, outputs, index in site.readers
        if (node := reader(values, op, outputs)) is not None and index < len(node.inputs)
        and (node in alive or not site.live)
    }
    if len(read) > 1:
        raise NotReachable("REWRITTEN's readers of its output read different values")
    return read.pop() if read and None not in read else values[site.output]


@dataclasses.dataclass(frozen=True)
class _Replacement:
    """REWRITTEN's computation of a site's output as a model, what feeds its inputs (per input, the
    positions of the site's operands: one, or an operand and its zero point fed as their float32
    difference), and whether the output is the op's result cast to float32."""

    model: ir.Model
    feeds: tuple[tuple[int, ...], ...]
    cast: bool

    def fed(self, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        return [arrays[i[0]] if len(i) == 1 else arrays[i[0]].astype(np.float32) - arrays[i[1]].astype(np.float32)
                for i in self.feeds]


def _feeds(site: LoweredSite, values: dict[str, ir.Value]) -> list[tuple[int, ...]]:
    """The positions each replacement input is fed from: the site's non-constant operands, an operand
    and its zero point that a block replaced by their difference (both absent, the difference there)
    as one."""
    fed = _fed(site)
    for operand, zero_point in RULES[site.op_type].centred:
        pair = [site.inputs[operand], site.inputs[zero_point] if zero_point < len(site.inputs) else None]
        if (operand in fed and zero_point in fed and not any(name in values for name in pair)
                and centred_name(pair[0]) in values):
            fed[fed.index(operand)] = (operand, zero_point)
            fed.remove(zero_point)
    return [i if isinstance(i, tuple) else (i,) for i in fed]


class _Dropped(Exception):
    """REWRITTEN dropped a lowered op no graph output of ORIGINAL depends on (dead code): nothing to check."""


def _replacement(model: ir.Model, scopes: Scopes, site: LoweredSite) -> _Replacement | None:
    """REWRITTEN's computation of the site's output from its non-constant inputs, as a model whose
    inputs are those in order; None when REWRITTEN still runs the op itself."""
    graph = scopes.counterpart(site.graph, [site.output], site.live)
    cast = graph is None and site.cast is not None  # a block dropped the Cast pair: the Cast's output stands
    if cast:
        graph = scopes.counterpart(site.graph, [site.cast], site.live)
    if graph is None and not site.live:
        raise _Dropped(f"no graph output of ORIGINAL depends on it, and no graph of REWRITTEN holds {site.output!r}")
    if graph is None:
        raise NotReachable(f"no graph of REWRITTEN that its outputs depend on holds {site.output!r}")
    values = scopes.values[graph]
    output = values[site.cast] if cast else _read(values, site, scopes.live_nodes)
    producer = output.producer()
    if site.live and producer is not None and producer not in scopes.live_nodes:
        raise NotReachable(f"{output.name!r} is in REWRITTEN, but nothing REWRITTEN outputs depends on it: what is "
                           "computed in its place is unknown")
    if producer is not None and producer.op_type == site.op_type and producer.domain in DOMAINS:
        return None
    feeds = _feeds(site, values)
    names = [site.inputs[i[0]] if len(i) == 1 else centred_name(site.inputs[i[0]]) for i in feeds]
    replacement = site_model(model, graph, [output], names)  # an input it ignores is still fed
    body = replacement.graph
    for k, (value, i) in enumerate(zip(body.inputs, feeds)):
        if site.types[i[0]] is None:
            raise Unsynthesizable(f"the type of {site.inputs[i[0]]!r} is unknown")
        dtype = site.types[i[0]] if len(i) == 1 else ir.DataType.FLOAT
        value.name, value.shape, value.type = f"input{k}", None, ir.TensorType(dtype)
    if body.outputs[0].producer() is None:  # a stored value (a rewrite folded the op): renaming it renames the tensor
        identity = ir.node("Identity", [body.outputs[0]])
        body.append(identity)
        body.outputs[0] = identity.outputs[0]
    body.outputs[0].name = "output"
    for value in [*body.outputs, *(v for node in body for v in node.outputs)]:
        value.shape = None  # the model's shapes do not hold for synthesized operands
    return _Replacement(replacement, tuple(feeds), cast)


def _static_shapes(site: LoweredSite, replacement: _Replacement) -> list[tuple[int, ...]] | None:
    """The shapes of what feeds the replacement's inputs, where the site's static shapes tell them
    all (the operands are made in those shapes); None where one is not static."""
    shapes = []
    for positions in replacement.feeds:
        known = [site.shapes[i] if site.constants[i] is None else site.constants[i].shape
                 for i in positions if i < len(site.inputs) and site.inputs[i] is not None]
        if any(shape is None for shape in known):
            return None
        shapes.append(np.broadcast_shapes(*known))
    return shapes


def _cases(rule: Rule, site: LoweredSite, replacement: _Replacement, rng: np.random.Generator) -> tuple[
    Iterable[tuple[str, str, list[np.ndarray | None]]], list[list[tuple[int, ...]]]
]:
    """The site's cases and the shapes fed to the replacement's inputs: made one at a time where the
    site's static shapes tell those shapes (a large operand is a graph input of declared shape), else
    all made first, to read their shapes (operands of unknown shape are made small)."""
    static = _static_shapes(site, replacement)
    if static is not None:
        return rule.cases(site, rng), [static]
    cases = list(rule.cases(site, rng))
    return cases, [[np.shape(array) for array in replacement.fed(arrays)] for _, _, arrays in cases]


def _declare_shapes(model: ir.Model, operands: Sequence[Sequence[tuple[int, ...]]]) -> None:
    """Give the replacement's inputs the shapes of the operands fed to them (a dimension that varies
    is symbolic): a runtime may need an input's rank to read the model (OpenVINO's Conv does)."""
    for k, value in enumerate(model.graph.inputs):
        shapes = {shapes[k] for shapes in operands}
        if len({len(shape) for shape in shapes}) == 1:
            value.shape = ir.Shape([
                sizes.pop() if len(sizes := {shape[axis] for shape in shapes}) == 1 else f"input{k}_{axis}"
                for axis in range(len(next(iter(shapes))))
            ])


def _session(
    model: ir.Model, runtime: runtimes.Runtime
) -> tuple[runtimes.Session | None, runtimes.Runtime, str | None]:
    """The replacement loaded on ``runtime``, else on ORT, with the runtime and why it is not checked
    on ``runtime``; no session when ORT, which runs the ops as ONNX defines them, cannot load it either."""
    try:
        return runtime.load(model, threads=1, optimize="basic"), runtime, None
    except runtimes.RuntimeFailure as error:
        reason = f"{runtime.name} {runtimes.refused(error, 'load the replacement')}: {one_line(error)}"
    ort = runtimes.get("onnxruntime")
    if runtime is ort:
        return None, ort, reason
    try:
        return ort.load(model, threads=1, optimize="basic"), ort, f"{reason}; checked on onnxruntime only"
    except runtimes.RuntimeFailure as error:
        return None, ort, f"{reason}; onnxruntime cannot load it either: {one_line(error)}"


def _block(site: LoweredSite, replacement: _Replacement) -> str | None:
    """What was checked of a site a block changed: from the float32 difference, or as the Cast's output."""
    if not replacement.cast and all(len(i) == 1 for i in replacement.feeds):
        return None
    return "checked " + " and ".join(
        [f"from {centred_name(site.inputs[i[0]])!r}, its operand minus its zero point in float32"
         for i in replacement.feeds if len(i) > 1]
        + [f"as {site.cast!r}, the reference cast to float32"] * replacement.cast)


_FLOAT_PRODUCTS = ("MatMul", "Conv", "Gemm")


def _fractional_operand(replacement: _Replacement) -> str | None:
    """A constant float operand of a product in the replacement of an integer product that holds a value
    that is not a whole number, said; None where there is none. Its terms are then not the op's, and the
    Cast to int32 that ends such a replacement rounds the fraction away on every operand whose sums are not
    small: no case shows it, so the replacement is not checked."""
    model = replacement.model
    for node in model.graph:
        if node.domain not in DOMAINS or node.op_type not in _FLOAT_PRODUCTS:
            continue
        for value in node.inputs:
            if value is None:
                continue
            try:  # the constant part of the replacement only: what no input feeds
                array = value.const_value.numpy() if value.const_value is not None else runtimes.get(
                    "onnxruntime").load(site_model(model, model.graph, [value], []), threads=1).run({})[0]
            except (NotReachable, runtimes.RuntimeFailure):
                continue
            if array.dtype.kind != "f":
                continue
            fractional = np.isfinite(array) & (array != np.trunc(array))
            if fractional.any():
                at = tuple(int(i) for i in np.argwhere(fractional)[0])
                return (f"{value.name!r}, a constant operand of its {node.op_type}, holds {int(fractional.sum())} "
                        f"values that are not whole numbers ({float(array[at]):.9g} at {list(at)}) where the op's "
                        "terms are whole: not checked, since a Cast to int32 hides a fraction from every case whose "
                        "sums are not small")
    return None


def _check(
    site: LoweredSite, replacement: _Replacement, runtime: runtimes.Runtime, rng: np.random.Generator
) -> SiteResult:
    result = SiteResult(site.name, site.graph, model_level="lowered op: its replacement checked against the exact "
                        "reference; the final outputs at the model level")
    result.block = _block(site, replacement)
    rule = RULES[site.op_type]
    if rule.whole_terms and (fraction := _fractional_operand(replacement)):
        result.not_reachable = fraction
        return result
    model = replacement.model
    cases, declared = _cases(rule, site, replacement, rng)
    _declare_shapes(model, declared)
    session, runtime, reason = _session(model, runtime)
    if session is None:
        for _ in cases:  # drawn all the same: the next sites' operands stay as they were
            pass
        result.mismatches, result.detail = 1, reason
        return result
    result.not_checked = reason
    tally = Tally(result)
    for name, category, arrays in cases:
        fed = replacement.fed(arrays)
        if len(declared) == 1 and [np.shape(a) for a in fed] != declared[0]:
            # The replacement declares the static shapes: operands of another shape would be checked
            # against what the runtime makes of a wrong model. Not checked: INCOMPLETE, never a verdict.
            raise Unsynthesizable(f"its operands were made in shapes {[np.shape(a) for a in fed]}, not in its "
                                  f"static ones {declared[0]}")
        expected = rule.expected(arrays, site.attributes)
        if replacement.cast:
            expected = expected.astype(np.float32)
        try:
            (actual,) = session.run({f"input{k}": array for k, array in enumerate(fed)})
            difference = bit_difference("output", actual, expected)
            # Worse is a wrong type or shape before more wrong elements.
            diff = None if difference is None else SiteDifference(
                (difference.elements is None, difference.elements or 0), difference.text)
        except runtimes.RuntimeFailure as error:
            if runtime.name != "onnxruntime":  # another runtime's refusal of a piece: not checked there
                refusal = f"{runtime.name} {runtimes.refused(error, f'run case {name}')}: {one_line(error)}"
                result.not_checked = result.not_checked or refusal
                continue
            # An operand ORT cannot run is a mismatch.
            diff = SiteDifference(WORST, f"{runtime.name} failed: {one_line(error)}")
        tally.add(name, category, diff)
    return result


def check_lowered(
    original: ir.Model, rewritten: ir.Model, seed: int, runtime: runtimes.Runtime, scopes: Scopes | None = None
) -> list[SiteResult]:
    """One row per integer op of ORIGINAL that REWRITTEN replaced, its replacement run on ``runtime``
    against the reference; ``scopes``: REWRITTEN's, when already built."""
    scopes = scopes or Scopes(rewritten)
    rng = np.random.default_rng(seed)
    results = []
    sites = lowered_sites(original)
    for done, site in enumerate(sites):
        advance("lowered ops", done, len(sites))
        try:
            replacement = _replacement(rewritten, scopes, site)
            if replacement is None:
                continue  # REWRITTEN runs the op itself: the model level compares it
            results.append(_check(site, replacement, runtime, rng))
        except _Dropped as dropped:
            results.append(SiteResult(site.name, site.graph, dropped=str(dropped)))
        except (NotReachable, Unsynthesizable) as reason:
            results.append(SiteResult(site.name, site.graph, not_reachable=str(reason),
                                      model_level="lowered op: not checked against the reference"))
    logger.info("%d lowered ops of ORIGINAL checked against the reference", len(results))
    return results
