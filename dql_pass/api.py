"""The public API over the passes: models in, models out, and files in, files out with the result.

- :func:`expand`, :func:`fuse` and :func:`lower` take a ModelProto, an ``ir.Model`` or a path, and
  give back the model in kind (see :func:`expand`) and the pass's report: ``model, report = ...``.
- :func:`expand_file` and :func:`fuse_file` read a checked model, rewrite it and write it
  atomically, and return the pass result: per-graph counts for expand, the report for fuse.

Fusion is imported when it is first used: expanding needs neither onnxscript's rewriter nor a runtime.
"""

from __future__ import annotations

__all__ = ["expand", "expand_file", "fuse", "fuse_file", "lower", "lower_file", "target_variant"]

import os
import time
from typing import TYPE_CHECKING, overload

import onnx
import onnx_ir as ir

from dql_pass import runtimes
from dql_pass.expansion import ExpandDynamicQuantizeLinearPass, ExpandReport, ExpandResult
from dql_pass.lowering import LowerQuantizationPass, LowerReport, LowerResult
from dql_pass.files import as_ir_model, external_tensors, load_model, save_model
from dql_pass.files.written import Written, footprint

if TYPE_CHECKING:
    from dql_pass.fusion import FuseReport, FuseResult


@overload
def expand(
    model: onnx.ModelProto, *, variant: str | None = ..., mode: str = ..., zero_range: str = ...,
    runtime: str | None = ..., target: str | None = ...,
) -> tuple[onnx.ModelProto, ExpandReport]: ...
@overload
def expand(
    model: ir.Model | str | os.PathLike, *, variant: str | None = ..., mode: str = ..., zero_range: str = ...,
    runtime: str | None = ..., target: str | None = ...,
) -> tuple[ir.Model, ExpandReport]: ...
def expand(
    model: onnx.ModelProto | ir.Model | str | os.PathLike,
    *,
    variant: str | None = None,
    mode: str = "inline",
    zero_range: str = "onnxruntime",
    runtime: str | None = "onnxruntime",
    target: str | None = None,
) -> tuple[onnx.ModelProto | ir.Model, ExpandReport]:
    """Expand every DynamicQuantizeLinear of ``model`` into primitive ONNX ops; the model and an
    :class:`~dql_pass.expansion.ExpandReport` (the sites per graph path, the variant) come back.

    A ModelProto comes back as a new ModelProto and is left as it was. An ``ir.Model`` is
    rewritten in place and returned. A path is loaded (external weights stay on disk) and the
    rewritten ``ir.Model`` is returned.

    ``runtime`` is where the expansion must load (see :mod:`dql_pass.runtimes`): a variant it
    cannot load at the model's opset raises :class:`InputError`; ``None`` skips the check.

    ``target`` names the runtime the model is for: its exact variant is used (see
    :func:`target_variant`), and it is the runtime checked. ``variant`` defaults to quantizelinear.
    """
    model, result = _apply(_expansion(variant, mode, zero_range, runtime, target), model)
    return model, result.report


def target_variant(target: str) -> str:
    """The expansion variant that is exact on the runtime ``target`` (:attr:`Runtime.variant`)."""
    return runtimes.get(target).variant


def _expansion(
    variant: str | None, mode: str, zero_range: str, runtime: str | None, target: str | None
) -> ExpandDynamicQuantizeLinearPass:
    return ExpandDynamicQuantizeLinearPass(variant=variant, mode=mode, zero_range=zero_range, runtime=runtime,
                                          target=target)


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


@overload
def lower(
    model: onnx.ModelProto, *, target: str | None = ..., weights: str | None = ..., blocks: bool | None = ...
) -> tuple[onnx.ModelProto, LowerReport]: ...
@overload
def lower(
    model: ir.Model | str | os.PathLike, *, target: str | None = ..., weights: str | None = ...,
    blocks: bool | None = ...
) -> tuple[ir.Model, LowerReport]: ...
def lower(
    model: onnx.ModelProto | ir.Model | str | os.PathLike, *, target: str | None = None, weights: str | None = None,
    blocks: bool | None = None,
) -> tuple[onnx.ModelProto | ir.Model, LowerReport]:
    """Lower the quantization ops of ``model`` (DynamicQuantizeLinear, MatMulInteger, ConvInteger,
    QuantizeLinear, DequantizeLinear) to float32 primitives, bit-exact.

    Returns the model and a :class:`~dql_pass.lowering.LowerReport` (per node, the proof that applied;
    what was left alone and why; what ``target`` still lacks). ``target`` names a runtime of
    :mod:`dql_pass.runtimes`, whose exact expansion variant is used; None: ``arithmetic``.
    ``weights``: ``"integer"`` keeps constant int8/uint8 weights as they are, cast and shifted in
    the graph (runtimes fold that at load), ``"float"`` stores them cast and shifted as float32,
    four times larger; None: the target's default (integer for ``webgpu`` and ``wasm``), float
    without a target. ``blocks``: where only lowered products read a DynamicQuantizeLinear's y and
    zero point, keep y - zero point in float32 (:mod:`dql_pass.lowering.blocks`); None: the
    target's (on for ``webgpu`` and ``wasm``), off without a target. Models are taken and given
    back as in :func:`expand`.
    """
    model, result = _apply(LowerQuantizationPass(target, weights, blocks), model)
    return model, result.report


def _apply(rewrite: ir.passes.InPlacePass, model):
    """Run ``rewrite`` on a model argument; a ModelProto comes back as a new ModelProto."""
    result = rewrite(as_ir_model(model))
    return (ir.serde.serialize_model(result.model) if isinstance(model, onnx.ModelProto) else result.model), result


def expand_file(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    variant: str | None = None,
    mode: str = "inline",
    zero_range: str = "onnxruntime",
    runtime: str | None = "onnxruntime",
    target: str | None = None,
    share_data: bool = False,
) -> ExpandResult:
    """Expand the model at ``source`` into ``output``; the result counts the sites of each graph.
    The options are :func:`expand`'s. The output stands alone: the weights it keeps from the
    input's external data are streamed into its own data file. ``share_data``: an output in the
    input's folder refers to the input's data files instead, nothing copied, and needs them from then on."""
    return _rewrite_file(_expansion(variant, mode, zero_range, runtime, target), source, output, share_data)


def fuse_file(source: str | os.PathLike, output: str | os.PathLike, *, share_data: bool = False) -> FuseResult:
    """Fuse the model at ``source`` into ``output``; the result's report says what was fused and left alone.
    ``share_data`` is :func:`expand_file`'s."""
    from dql_pass.fusion import FuseDynamicQuantizeLinearPass

    return _rewrite_file(FuseDynamicQuantizeLinearPass(), source, output, share_data)


def lower_file(
    source: str | os.PathLike, output: str | os.PathLike, *, target: str | None = None, weights: str | None = None,
    blocks: bool | None = None,
    share_data: bool = False,
) -> LowerResult:
    """Lower the model at ``source`` into ``output``; the result's report gives each node's proof.
    The options are :func:`lower`'s; ``share_data`` is :func:`expand_file`'s."""
    return _rewrite_file(LowerQuantizationPass(target, weights, blocks), source, output, share_data, measure=True)


def _rewrite_file(
    rewrite: ir.passes.InPlacePass, source: str | os.PathLike, output: str | os.PathLike, share_data: bool = False,
    measure: bool = False,
):
    """Run ``rewrite`` on the model at ``source`` and write it to ``output``, in external data if
    the input kept some there, even when the rewrite dropped every tensor that did; ``share_data``:
    see :func:`expand_file`; ``measure``: the result's ``footprint``, the input's and the output's."""
    start = time.perf_counter()
    model = load_model(source)
    inputs = frozenset(os.path.realpath(tensor.path) for tensor in external_tensors(model))
    before = footprint(model, source, inputs) if measure else None  # the rewrite is in place
    result = rewrite(model)
    outputs = save_model(result.model, output, source=source, external=bool(inputs), share_data=share_data)
    seconds = time.perf_counter() - start
    shared = sorted(os.path.basename(file) for file in outputs & inputs) if share_data else None
    result.written = Written(os.fspath(source), os.fspath(output), seconds, shared)
    if measure:  # from what was loaded and written: the output is not read back
        result.footprint = before, footprint(result.model, output, outputs)
    return result
