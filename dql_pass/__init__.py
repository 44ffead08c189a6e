"""dql_pass: expand, check and fuse ONNX DynamicQuantizeLinear, bit-exact with ONNX Runtime.

The public API:

- :func:`expand` rewrites every DynamicQuantizeLinear of a model into primitive ops.
- :func:`dynamic_quantize_linear` is the NumPy reference.
- :func:`function_proto` gives the decomposition itself as a FunctionProto.
- :class:`ExpandDynamicQuantizeLinearPass` is the onnx_ir pass behind :func:`expand`.
- :func:`fuse` turns decomposed DynamicQuantizeLinear back into single nodes and reports what it did;
  :func:`dql_pass.rules.fuse_rules` gives its onnxscript rewriter rules.
- :func:`generate_suite` writes a conformance suite in ONNX's backend-test layout; :func:`run_suite` runs one.
- :func:`load_model` and :func:`save_model` read checked models and write them atomically.
- :func:`verify` checks a rewritten model against the original, bit for bit, on ONNX Runtime.
"""

from __future__ import annotations

__all__ = [
    "ExpandDynamicQuantizeLinearPass",
    "ExpandResult",
    "FuseDynamicQuantizeLinearPass",
    "FuseReport",
    "InputError",
    "MODES",
    "VARIANTS",
    "VerifyReport",
    "ZERO_RANGE_POLICIES",
    "dynamic_quantize_linear",
    "expand",
    "find_sites",
    "function_proto",
    "fuse",
    "generate_suite",
    "load_model",
    "run_suite",
    "save_model",
    "verify",
]

import os
from typing import overload

import onnx
import onnx_ir as ir

from dql_pass.conformance import generate_suite, run_suite
from dql_pass.errors import InputError
from dql_pass.expand import ExpandDynamicQuantizeLinearPass, ExpandResult
from dql_pass.walk import find_sites
from dql_pass.modelfiles import as_ir_model, load_model, save_model
from dql_pass.fuse import FuseDynamicQuantizeLinearPass, FuseReport
from dql_pass.decomposition import function_proto
from dql_pass.op import MODES, VARIANTS, ZERO_RANGE_POLICIES
from dql_pass.reference import dynamic_quantize_linear
from dql_pass.verify import VerifyReport, verify


@overload
def expand(
    model: onnx.ModelProto, *, variant: str = ..., mode: str = ..., zero_range: str = ..., runtime: str | None = ...
) -> onnx.ModelProto: ...
@overload
def expand(
    model: ir.Model | str | os.PathLike, *, variant: str = ..., mode: str = ..., zero_range: str = ..., runtime: str | None = ...
) -> ir.Model: ...
def expand(
    model: onnx.ModelProto | ir.Model | str | os.PathLike,
    *,
    variant: str = "quantizelinear",
    mode: str = "inline",
    zero_range: str = "onnxruntime",
    runtime: str | None = "onnxruntime",
) -> onnx.ModelProto | ir.Model:
    """Expand every DynamicQuantizeLinear of ``model`` into primitive ONNX ops.

    A ModelProto comes back as a new ModelProto and is left as it was. An ``ir.Model`` is
    rewritten in place and returned. A path is loaded (external weights stay on disk) and the
    rewritten ``ir.Model`` is returned.

    ``runtime`` is where the expansion must load (see :mod:`dql_pass.runtimes`): a variant it
    cannot load at the model's opset raises :class:`InputError`; ``None`` skips the check.
    """
    rewrite = ExpandDynamicQuantizeLinearPass(variant=variant, mode=mode, zero_range=zero_range, runtime=runtime)
    return _apply(rewrite, model)[0]


@overload
def fuse(model: onnx.ModelProto) -> tuple[onnx.ModelProto, FuseReport]: ...
@overload
def fuse(model: ir.Model | str | os.PathLike) -> tuple[ir.Model, FuseReport]: ...
def fuse(model: onnx.ModelProto | ir.Model | str | os.PathLike) -> tuple[onnx.ModelProto | ir.Model, FuseReport]:
    """Fuse every decomposed DynamicQuantizeLinear of ``model`` back into one node.

    Returns the model and a :class:`FuseReport` (what was fused, where, by which rule; what was
    left alone and why). Models are taken and given back as in :func:`expand`.
    """
    model, result = _apply(FuseDynamicQuantizeLinearPass(), model)
    return model, result.report


def _apply(rewrite: ir.passes.InPlacePass, model):
    """Run ``rewrite`` on a model argument; a ModelProto comes back as a new ModelProto."""
    result = rewrite(as_ir_model(model))
    return (ir.serde.serialize_model(result.model) if isinstance(model, onnx.ModelProto) else result.model), result
