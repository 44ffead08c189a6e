"""IREE on the CPU: ONNX imported to MLIR by iree-base-compiler's ONNX importer, compiled by
``iree-compile`` for the host's llvm-cpu backend, run by iree-base-runtime.

Rules:

- The model is compiled once, with its inputs' dimensions as the model declares them: symbolic
  dimensions stay dynamic, so one compiled module runs every input shape (compile times in
  docs/performance.md), and a shape the model does not admit is the runtime's refusal. An input
  of unknown rank gets symbolic dimensions: one compile per rank fed.
- IREE hands uint8 outputs back as int8 arrays: the bits are right, the outputs take the model's
  types by reinterpretation.
- ``threads``: 1 runs on IREE's synchronous driver (the calling thread); any other value on its
  task driver, whose pool IREE sizes itself (one pool per process).
- ``optimize``: ``"all"`` is iree-compile's default; ``"basic"`` and ``"none"`` compile at
  ``--iree-opt-level=O0``, IREE's only level that promises no extra optimization.
"""

from __future__ import annotations

__all__ = ["Iree"]

import contextlib
import functools
import io
import logging
from typing import TYPE_CHECKING

import numpy as np

from dql_pass import variants
from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, Runtime, Session
from dql_pass.runtimes.sessions import Compiled, compiled_per_rank, whole_proto

# onnx is imported where used: listing the adapters needs none of it.
if TYPE_CHECKING:
    import onnx

logger = logging.getLogger(__name__)

_FUNCTION = "main"
_COMPILE_FLAGS = ("--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
                  "--iree-llvmcpu-target-cpu=host")


class Iree(Runtime):
    name = "iree"
    module = "iree.runtime"
    distribution = "iree-base-runtime"
    extra = "iree"
    # Not arithmetic, float64, residual or portable: iree-compile miscompiles their Cast(float32 ->
    # uint8), 128 to 255 become 127 (lean gathers its uint8 answers and casts nothing to uint8).
    variant = "quantizelinear"
    known_differences = (
        KnownDifference(("native", *variants.NAMES), "subnormal",
                        "measured: IREE's llvm-cpu code flushes subnormal floats to zero, so a subnormal x, "
                        "range or scale quantizes as zero (x/0 is inf, 0/0 NaN)", outputs=OUTPUTS),
        KnownDifference(("arithmetic", "float64", "residual", "portable"), None,
                        "measured: IREE 3.13 compiles Cast(float32 -> uint8) into int8's range: 128 to 255 become "
                        "127 (a one-node Cast model gives it too: its ONNX import lowers the Cast to "
                        "arith.fptosi f32 to i8, a signed conversion)", outputs=("y", "y_zero_point")),
        KnownDifference(("native",), "zero range",
                        "measured: IREE's DynamicQuantizeLinear gives an all-zero or empty input the scale 0 "
                        "(ORT: 1.0)", outputs=("y_scale",)),
        KnownDifference(("native",), "infinite",
                        "measured: IREE's DynamicQuantizeLinear gives -inf in x the zero point 0 and quantizes "
                        "every element to 0 (ORT: zero point 255)", outputs=("y", "y_zero_point")),
    )

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        proto = whole_proto(model)
        driver = "local-sync" if threads == 1 else "local-task"
        return compiled_per_rank(proto, lambda ranked: _compile(ranked, driver, optimize))


@functools.cache
def _config(driver: str):
    """One runtime configuration (device, thread pool) per driver, shared by every session."""
    import iree.runtime

    return iree.runtime.Config(driver)


def _compile(proto: onnx.ModelProto, driver: str, optimize: str) -> Compiled:
    import iree.compiler
    import iree.runtime
    from iree.compiler.extras import onnx_importer
    from iree.compiler.ir import Context
    import onnx

    # What iree-import-onnx does, in memory: infer shapes, import the main graph as one function,
    # named after the graph (which MLIR needs to be a symbol).
    proto = onnx.shape_inference.infer_shapes(proto)
    proto.graph.name = _FUNCTION
    info = onnx_importer.ModelInfo(proto)
    module = info.create_module(context=Context()).operation
    onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
    flags = [*_COMPILE_FLAGS, *(["--iree-opt-level=O0"] if optimize != "all" else [])]
    warnings = io.StringIO()
    with contextlib.redirect_stderr(warnings):  # where iree.compiler copies iree-compile's warnings
        flatbuffer = iree.compiler.compile_str(module.get_asm(), input_type="onnx", extra_args=flags)
    if warnings.getvalue():
        logger.debug("iree-compile: %s", warnings.getvalue())
    context = iree.runtime.SystemContext(config=_config(driver))
    context.add_vm_module(iree.runtime.VmModule.copy_buffer(context.instance, flatbuffer))
    function = context.modules.module[_FUNCTION]

    def run(arrays):
        results = function(*arrays)
        # One output comes back as an array, several as a tuple of them.
        # Copies, made while IREE's buffers live: a view of one outlives it and reads reused memory.
        return [np.array(r.to_host()) for r in (results if isinstance(results, (tuple, list)) else [results])]

    return run
