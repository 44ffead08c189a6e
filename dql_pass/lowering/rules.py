"""What each lowered op becomes, in float32 primitives, and when an op is left alone: one
:class:`Rule` record per op (ai.onnx domain) in :data:`REGISTRY`, which holds all there is of it:
its rewrite, the exact reference verify checks the rewrite against, its operand types and the
generator of the operands it is checked on.

- MatMulInteger and ConvInteger: :mod:`dql_pass.lowering.products`, a float32 MatMul or Conv of the
  shifted operands, cut into exact chunks where the proof (:mod:`dql_pass.lowering.proof`) needs it;
- QuantizeLinear and DequantizeLinear with constant scale and zero point: :mod:`dql_pass.lowering.qdq`;
- every rewrite builds with :mod:`dql_pass.lowering.rewrite`, keeps its output name, and raises
  :class:`CannotLower` with the reason for whatever it cannot prove exact, which leaves the node alone.
"""

from __future__ import annotations

__all__ = ["DIVISIONS", "LOWERED", "REGISTRY", "RULES", "Builder", "CannotLower", "Lowering", "Rule", "element_type",
           "lower_node"]

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from dql_pass import reference
from dql_pass.lowering import operands, products, qdq, qdq_operands
from dql_pass.lowering.proof import Proof
from dql_pass.lowering.qdq import DIVISIONS
from dql_pass.lowering.rewrite import Builder, CannotLower, Lowering, element_type


Attributes = Mapping[str, object]  # a node's attributes by name, their values as onnx_ir gives them


@dataclasses.dataclass(frozen=True)
class Rule:
    """A lowering rule, the one place it lives: the op it lowers (ai.onnx), its rewrite, and what
    verify checks the rewrite against: the exact reference in :mod:`dql_pass.reference` it names,
    fed the node's inputs in order and the keyword arguments its attributes give, on the operands
    its generator in :mod:`dql_pass.lowering.operands` makes, of the types the node's inputs have."""

    op_type: str
    rewrite: Callable[[ir.Node, Builder], tuple[ir.Value, Proof | None]]
    reference: Callable[..., np.ndarray]
    keywords: Callable[[Attributes, Sequence[np.ndarray | None]], dict[str, object]]  # attributes, operands
    operand_types: Callable[[ir.Node], tuple[ir.DataType | None, ...]]
    cases: Callable[[operands.Site, np.random.Generator], operands.Cases]
    # (operand, its zero point): the inputs a block (dql_pass.lowering.blocks) may feed as one
    # float32 difference, which verify then feeds as such.
    centred: tuple[tuple[int, int], ...] = ()
    # Whether the node's output is a sum without terms, which ONNX defines 0 and ORT 1.32 leaves
    # unwritten (whatever its memory held): verify holds ORIGINAL's to 0.
    without_terms: Callable[[ir.Node], bool] = lambda node: False
    # Whether the op sums products of whole numbers, so that a float rewrite of it multiplies whole
    # numbers only: verify leaves one whose product reads a constant that is not whole unchecked.
    whole_terms: bool = False

    def expected(self, arrays: Sequence[np.ndarray | None], attributes: Attributes) -> np.ndarray:
        """The exact result of the op on ``arrays``, one per input (None: absent)."""
        return self.reference(*arrays, **self.keywords(attributes, arrays))


def _own_types(node: ir.Node) -> tuple[ir.DataType | None, ...]:
    return tuple(None if v is None else element_type(v) for v in node.inputs)


def _zero_point_types(node: ir.Node) -> tuple[ir.DataType | None, ...]:
    """Each input's type, an integer operand of unknown type taking its zero point's: they share one."""
    types = list(_own_types(node))
    for i in range(min(2, len(types) - 2)):
        types[i] = types[i] or types[i + 2]
    return tuple(types)


def _conv_keywords(attributes: Attributes, arrays: Sequence[np.ndarray | None]) -> dict[str, object]:
    if arrays[0].ndim == 2:  # no spatial axis
        return {}
    pads = attributes.get("pads")
    if attributes.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        pads = operands.same_pads(arrays[0].shape[2:], arrays[1].shape[2:], attributes, attributes["auto_pad"])
    return {"pads": pads, "strides": attributes.get("strides"), "dilations": attributes.get("dilations"),
            "group": int(attributes.get("group", 1))}


def _no_keywords(attributes: Attributes, arrays: Sequence[np.ndarray | None]) -> dict[str, object]:
    return {}


def _quantize_keywords(attributes: Attributes, arrays: Sequence[np.ndarray | None]) -> dict[str, object]:
    precision = attributes.get("precision")  # opset 23: the type the division rounds to
    return {**_dequantize_keywords(attributes, arrays),
            "dtype": ir.DataType(attributes.get("output_dtype") or ir.DataType.UINT8).numpy(),
            **({"precision": ir.DataType(precision).numpy()} if precision else {})}


def _dequantize_keywords(attributes: Attributes, arrays: Sequence[np.ndarray | None]) -> dict[str, object]:
    block_size = int(attributes.get("block_size", 0))  # opset 21: blocked scales
    return {"axis": int(attributes.get("axis", 1)), **({"block_size": block_size} if block_size else {})}


# The only list of the rules: adding one adds its record here and the reference it names.
REGISTRY: tuple[Rule, ...] = (
    Rule("MatMulInteger", rewrite=products.MATMUL_INTEGER.rewrite, reference=reference.matmul_integer,
         keywords=_no_keywords, operand_types=_zero_point_types, cases=operands.matmul_integer,
         centred=((0, 2), (1, 3)), whole_terms=True,
         without_terms=products.MATMUL_INTEGER.without_terms),
    Rule("ConvInteger", rewrite=products.CONV_INTEGER.rewrite, reference=reference.conv_integer,
         keywords=_conv_keywords, operand_types=_zero_point_types, cases=operands.conv_integer,
         centred=((0, 2), (1, 3)), whole_terms=True,
         without_terms=products.CONV_INTEGER.without_terms),
    # x is float, its zero point an integer: each has its own type
    Rule("QuantizeLinear", rewrite=qdq.quantize_linear, reference=reference.quantize_linear,
         keywords=_quantize_keywords, operand_types=_own_types, cases=qdq_operands.quantize_linear),
    Rule("DequantizeLinear", rewrite=qdq.dequantize_linear, reference=reference.dequantize_linear,
         keywords=_dequantize_keywords, operand_types=_zero_point_types, cases=qdq_operands.dequantize_linear),
)


RULES: dict[str, Rule] = {rule.op_type: rule for rule in REGISTRY}


LOWERED: tuple[str, ...] = tuple(RULES)


def lower_node(node: ir.Node, builder: Builder) -> Lowering:
    """The lowering of ``node``, one of :data:`LOWERED`; :class:`CannotLower` when it cannot be exact."""
    if len(node.outputs) != 1 or not node.inputs or any(v is None for v in node.inputs[:2]):
        raise CannotLower("it lacks an input or has other outputs than one")
    output, proof = RULES[node.op_type].rewrite(node, builder)
    return Lowering(builder.nodes, output, proof)
