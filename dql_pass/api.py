"""The public API over the passes: models in, models out, and files in, files out with the result.

- :func:`expand` and :func:`fuse` take a ModelProto, an ``ir.Model`` or a path, and give the model
  back in kind (see :func:`expand`).
- :func:`expand_file` and :func:`fuse_file` read a checked model, rewrite it and write it
  atomically, and return the pass result: per-graph counts for expand, the report for fuse.

Fusion is imported when it is first used: expanding needs neither onnxscript's rewriter nor a runtime.
"""

from __future__ import annotations

__all__ = ["expand", "expand_file", "fuse", "fuse_file"]

import os
from typing import TYPE_CHECKING, overload

import onnx
import onnx_ir as ir

from dql_pass.expand import ExpandDynamicQuantizeLinearPass, ExpandResult
from dql_pass.modelfiles import as_ir_model, load_model, save_model

if TYPE_CHECKING:
    from dql_pass.fusion import FuseReport, FuseResult


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
    from dql_pass.fusion import FuseDynamicQuantizeLinearPass

    model, result = _apply(FuseDynamicQuantizeLinearPass(), model)
    return model, result.report


def _apply(rewrite: ir.passes.InPlacePass, model):
    """Run ``rewrite`` on a model argument; a ModelProto comes back as a new ModelProto."""
    result = rewrite(as_ir_model(model))
    return (ir.serde.serialize_model(result.model) if isinstance(model, onnx.ModelProto) else result.model), result


def expand_file(
    source: str | os.PathLike,
    target: str | os.PathLike,
    *,
    variant: str = "quantizelinear",
    mode: str = "inline",
    zero_range: str = "onnxruntime",
    runtime: str | None = "onnxruntime",
) -> ExpandResult:
    """Expand the model at ``source`` into ``target``; the result counts the sites of each graph."""
    rewrite = ExpandDynamicQuantizeLinearPass(variant=variant, mode=mode, zero_range=zero_range, runtime=runtime)
    result = rewrite(load_model(source))
    save_model(result.model, target, source=source)
    return result


def fuse_file(source: str | os.PathLike, target: str | os.PathLike) -> FuseResult:
    """Fuse the model at ``source`` into ``target``; the result's report says what was fused and left alone."""
    from dql_pass.fusion import FuseDynamicQuantizeLinearPass

    result = FuseDynamicQuantizeLinearPass()(load_model(source))
    save_model(result.model, target, source=source)
    return result
