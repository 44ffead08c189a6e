"""Apache TVM's Relax compiler on the CPU (LLVM): ONNX imported by the Relax frontend, compiled, run
on the Relax virtual machine.

Rules:

- The model is compiled once, with its inputs' dimensions as the model declares them: symbolic
  dimensions stay symbolic, so one compiled module runs every input shape (compile times in
  docs/performance.md), and a shape the model does not admit is the virtual machine's refusal.
  An input of unknown rank gets symbolic dimensions: one compile per rank fed.
- ``optimize``: ``"all"`` is TVM's default CPU pipeline (constant folding, operator fusion);
  ``"basic"`` folds constants, then lowers without fusion; ``"none"`` lowers every op as written.
- ``threads`` is ignored: TVM's thread pool is one per process, sized from ``TVM_NUM_THREADS`` when
  it first runs.
"""

from __future__ import annotations

__all__ = ["Tvm"]

import warnings
from typing import TYPE_CHECKING

from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, Lack, Runtime, Session
from dql_pass.runtimes.sessions import Compiled, compiled_per_rank, whole_proto

# onnx is imported where used: listing the adapters needs none of it.
if TYPE_CHECKING:
    import onnx


class Tvm(Runtime):
    name = "tvm"
    module = "tvm"
    distribution = "apache-tvm"
    extra = "tvm"
    variant = "float64"
    lacks = tuple(
        Lack("tvm", op_type, since_version, "0.27.0",
             f"OpNotImplemented: The following operators are not supported for frontend ONNX: {op_type}")
        for op_type, since_version in (("ConvInteger", 10), ("GRU", 1), ("LSTM", 1))
    )
    known_differences = (
        KnownDifference(("native",), "all zero",
                        "measured: TVM's DynamicQuantizeLinear gives an all-zero input the scale 0 and y 255 (ORT: "
                        "scale 1.0, y 0)", outputs=OUTPUTS),
        KnownDifference(("native", "quantizelinear", "arithmetic"), "empty",
                        "measured: TVM's ReduceMin/ReduceMax (and its DynamicQuantizeLinear) over an empty tensor "
                        "give whatever the output buffer held: scales 0, 2.5e-44 and inf, zero point 255, changing "
                        "from run to run", outputs=OUTPUTS),
        KnownDifference(("native", "quantizelinear"), "infinite",
                        "measured: TVM's QuantizeLinear (and its DynamicQuantizeLinear) saturates a NaN quotient "
                        "(±inf / inf) to 255; ORT gives 0", outputs=("y",)),
        KnownDifference(("native", "quantizelinear"), "x/scale overflows to +inf",
                        "measured: where the scale underflows to 0, 0/0 is a NaN quotient, which TVM's QuantizeLinear "
                        "(and its DynamicQuantizeLinear) saturates to 255; ORT gives 0", outputs=("y",)),
    )

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        proto = whole_proto(model)
        return compiled_per_rank(proto, lambda ranked: _compile(ranked, optimize))


def _compile(proto: onnx.ModelProto, optimize: str) -> Compiled:
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the frontend warns about every output without a shape
        module = from_onnx(proto, keep_params_in_input=False)
    module = relax.transform.DecomposeOpsForInference()(module)
    if optimize == "basic":
        module = relax.transform.FoldConstant()(module)
    # "default_build" legalizes and lowers every op as written; "default" fuses on the way.
    executable = tvm.compile(module, target="llvm", relax_pipeline="default" if optimize == "all" else "default_build")
    function = relax.VirtualMachine(executable, tvm.cpu())["main"]

    def run(arrays):
        results = function(*[tvm.runtime.tensor(a) for a in arrays])
        # One output comes back as a tensor, several as an array of them.
        return [r.numpy() for r in ([results] if hasattr(results, "numpy") else results)]

    return run
