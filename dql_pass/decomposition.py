"""DynamicQuantizeLinear written with primitive ONNX ops: each variant's body, at any opset.

The bodies come from the onnxscript functions of :mod:`dql_pass.onnxscript_bodies`, the single
source of the decomposition; the pass, the function mode, the fusion rules and the conformance
suites all stamp what this module gives. Six variants exist:

- ``quantizelinear``: two reductions, scalar arithmetic for the scale and zero point, then
  QuantizeLinear; as cheap as ONNX's own function body.
- ``arithmetic``: no quantization op at all (Div, Round, Add, Clip, Cast), for runtimes that lack
  QuantizeLinear too.
- ``float64``: arithmetic with its three divisions in float64, each quotient cast back once, and
  reductions that never see an empty tensor: exact where float32 Div goes through a reciprocal.
- ``residual``: float32 only, each quotient corrected by an exact remainder: exact where float32
  Div goes through a reciprocal and float64 runs as float32 (OpenVINO); some 100 nodes.
- ``portable``: float32 only, with every op one that onnxruntime-web's WebGPU provider runs:
  rounding built from Floor, an exact residual and Less, the scale without Div and settled by
  its own residual, reductions over x and one 0. Exact where Div is up to 3 ulp off, products
  are fused into sums, comparisons read float bits as int32, or (except for a subnormal x or
  y_scale) subnormals are flushed; ``tools.gpu_divider`` runs it so.
- ``lean``: portable's guarantees (but for comparisons of float bits as int32) in about two thirds
  of its nodes and half its whole-tensor ones: the exact thresholds of every rounding step built
  once per site on a small vector, then per element a slot from Div, one Less and Gathers.

:func:`variant` gives each one's record (summary, node count, longest path), read off its body.

All carry the guards that ``docs/SEMANTICS.md`` asks for, on scalars only:

- a zero range (all ±0, or empty) gets the policy's scale, never 0/0;
- a NaN zero point (0/0 when the scale underflows, inf/inf when x holds -inf) saturates to 255,
  through ``Where(Less(zp, 255), zp, 255)``, which is exact for NaN on every runtime, where
  ``Clip`` would keep the NaN.

Every op used means the same from opset 11 to the newest (ReduceMin/ReduceMax without axes reduce
all, Clip takes its bounds as inputs, Round is half to even), so one script serves every opset.
"""

from __future__ import annotations

__all__ = ["BODIES", "FUNCTION_DOMAIN", "Variant", "body_path", "build_body", "form_of", "function_name",
           "function_proto", "variant"]

import dataclasses
import functools
from collections.abc import Iterable
from pathlib import Path

import onnx
import onnx_ir as ir

from dql_pass import variants
from dql_pass.errors import InputError
from dql_pass.op import MAX_OPSET, MIN_OPSET, NAME, check_choice

FUNCTION_DOMAIN = "dql_pass"


def function_name(variant: str, zero_range: str) -> str:
    """The name of the model-local function for a variant and zero-range policy."""
    return f"{NAME}_{variant}_{zero_range.replace('-', '_')}"


def build_body(variant: str, zero_range: str) -> bytes:
    """The body of ``variant`` under ``zero_range``, built from the onnxscript function, at the
    oldest opset: a serialized FunctionProto. :data:`BODIES` holds what this builds."""
    import onnx_ir.passes.common

    # The variant calls the shared part; onnx_ir's inliner flattens the call into one body.
    from dql_pass.onnxscript_bodies import scripts

    model = ir.serde.deserialize_model(scripts(zero_range)[variant].to_model_proto())
    onnx_ir.passes.common.InlinePass()(model)
    model.graph.opset_imports.clear()
    model.graph.opset_imports[""] = MIN_OPSET
    function = ir.Function(FUNCTION_DOMAIN, function_name(variant, zero_range), graph=model.graph, attributes=[])
    return ir.serde.serialize_function(function).SerializeToString()


# The bodies as built, shipped so that expanding needs no onnxscript (whose import alone costs half a
# second and loads its rewriter). A test checks that they equal what build_body builds today;
# `python -m tools.make_bodies` writes them again.
BODIES = Path(__file__).with_name("bodies")


def body_path(variant: str, zero_range: str) -> Path:
    return BODIES / f"{function_name(variant, zero_range)}.pb"


@functools.cache
def _function_proto(variant: str, opset: int, zero_range: str) -> bytes:
    check_choice("variant", variant)
    check_choice("zero-range policy", zero_range)
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise InputError(f"ai.onnx opset {opset} is outside {MIN_OPSET}..{MAX_OPSET}")
    # Every op of the bodies means the same at every opset from the oldest on: only the import changes.
    proto = onnx.FunctionProto.FromString(body_path(variant, zero_range).read_bytes())
    proto.opset_import[0].version = opset
    return proto.SerializeToString()


def function_proto(
    variant: str = "quantizelinear", opset: int = MAX_OPSET, zero_range: str = "onnxruntime"
) -> onnx.FunctionProto:
    """DynamicQuantizeLinear as a FunctionProto at ai.onnx ``opset``: inputs x, outputs y, y_scale, y_zero_point."""
    proto = onnx.FunctionProto()
    proto.ParseFromString(_function_proto(variant, opset, zero_range))
    return proto


@dataclasses.dataclass(frozen=True)
class Variant:
    """One variant's facts, read off its FunctionProto so that no other file copies them."""

    name: str
    summary: str
    nodes: int  # compute nodes per site, Constant nodes left out (inline mode shares them)
    longest_path: int  # compute nodes on the longest path from x to an output
    op_types: frozenset[str]


@functools.cache
def variant(name: str, opset: int = MAX_OPSET) -> Variant:
    """The record of variant ``name`` at ai.onnx ``opset``."""
    check_choice("variant", name)
    nodes = [node for node in function_proto(name, opset).node if node.op_type != "Constant"]
    depth: dict[str, int] = {}
    for node in nodes:  # a FunctionProto lists its nodes in topological order
        depth.update((output, 1 + max((depth.get(i, 0) for i in node.input), default=0)) for output in node.output)
    return Variant(name, variants.BY_NAME[name].summary, len(nodes), max(depth.values()),
                   frozenset(n.op_type for n in nodes))


def form_of(op_types: Iterable[str]) -> str | None:
    """The form of a DQL site written with ``op_types`` (its ai.onnx ops): "native" where DynamicQuantizeLinear
    is one of them, else the one variant whose body has every one of them, or of several, the one whose body
    has just those (a block of lower adds Sub, and Gather to a body that ends in a table, which they have);
    None where no body has them all, or several do and none just those (part of a site: its y dropped)."""
    found = set(op_types) - {"Constant"}
    if NAME in found:
        return "native"
    having = [body for body in map(variant, variants.NAMES) if found <= body.op_types]
    exact = [body for body in having if body.op_types == found]
    return having[0].name if len(having) == 1 else exact[0].name if len(exact) == 1 else None
