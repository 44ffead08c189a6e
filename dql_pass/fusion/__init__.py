"""Fuse decomposed DynamicQuantizeLinear back into single nodes, and report what was and was not fused.

The package:

- :mod:`~dql_pass.fusion.passes`: the pass and its report;
- :mod:`~dql_pass.fusion.rules`: the onnxscript rewriter rules; :func:`fuse_rules` composes them;
- :mod:`~dql_pass.fusion.diagnosis`: why a ReduceMin/ReduceMax pair was left alone;
- :mod:`~dql_pass.fusion._onnxscript_compat`: the only code that touches onnxscript's internals;
  importing this package with an unsupported onnxscript raises :class:`UnsupportedOnnxscript`.

What :class:`FuseDynamicQuantizeLinearPass` does:

- applies :func:`fuse_rules` with onnxscript's rewriter: in the main graph, in If/Loop/Scan bodies
  at any depth and in every model-local function;
- names each fused node after the node that computed y (see :mod:`~dql_pass.fusion.rules`),
  made unique in the model: ORT refuses two nodes of one name;
- removes only what the fusion left unused: the constants (initializers, Constant nodes) that fed
  fused blocks, the model-local functions that nothing calls any more (dql_pass's own after
  ``expand(mode="function")``), and the opset imports of domains that no node uses any more;
- keeps every graph topologically sorted;
- reports, in a :class:`FuseReport`: the fused sites per graph path and per rule; how fused nodes
  behave differently from the blocks they replace (ONNX's unguarded body, dql_pass's
  ``onnx-reference`` zero range); the blocks that look like DQL but were left alone, and why.
"""

from __future__ import annotations

__all__ = [
    "FuseDynamicQuantizeLinearPass",
    "FuseReport",
    "FuseResult",
    "UnfusedBlock",
    "UnsupportedOnnxscript",
    "fuse_rules",
]

# First: the version check runs before anything else of onnxscript's rewriter is imported.
from dql_pass.fusion._onnxscript_compat import UnsupportedOnnxscript

from dql_pass.fusion.diagnosis import UnfusedBlock
from dql_pass.fusion.passes import FuseDynamicQuantizeLinearPass, FuseReport, FuseResult
from dql_pass.fusion.rules import fuse_rules
