"""Lowering: the quantization ops of a ``quantize_dynamic`` model as float32 primitives, bit-exact.

- :mod:`dql_pass.lowering.proof`: when a float32 matrix product or convolution of integers is exact,
  and how a reduction is cut when it is not;
- :mod:`dql_pass.lowering.rules`: what each op becomes, or why it is left alone, one record per op
  that also names the reference and the operands verify checks it with; the rewrites themselves in
  :mod:`~dql_pass.lowering.products` and :mod:`~dql_pass.lowering.qdq`, built with
  :mod:`~dql_pass.lowering.rewrite`;
- :mod:`dql_pass.lowering.operands` and :mod:`dql_pass.lowering.qdq_operands`: the operands each
  rule is checked on;
- :mod:`dql_pass.lowering.quantization`: the onnx_ir pass over every graph and function, and its report.
"""

from __future__ import annotations

__all__ = ["LOWERED", "LowerQuantizationPass", "LowerReport", "LowerResult", "LoweredNode", "UnloweredNode"]

from dql_pass.lowering.quantization import LowerQuantizationPass, LowerReport, LowerResult, LoweredNode, UnloweredNode
from dql_pass.lowering.rules import LOWERED
