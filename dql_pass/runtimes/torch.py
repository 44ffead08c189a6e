"""PyTorch, through the two ONNX-to-PyTorch converters: onnx2torch and onnx2pytorch.

Rules:

- The converter turns the model into a ``torch.nn.Module`` once, at load; the module runs eagerly
  on the CPU under ``torch.no_grad()``, so every input shape runs without compiling.
- ``threads`` > 0 sets PyTorch's intra-op threads for the run and restores them after (a
  process-wide setting); 0 leaves PyTorch's default.
- ``optimize`` is ignored: eager PyTorch runs every converted op as written.
- Both converters raise plain Python exceptions (NotImplementedError for an op without a
  converter) and so does PyTorch: every exception out of them is the runtime's refusal.
"""

from __future__ import annotations

__all__ = ["OnnxToPytorch", "OnnxToTorch"]

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, Lack, Runtime, Session, failures_of
from dql_pass.runtimes.sessions import conform, fed_inputs, output_types, whole_proto

# onnx is imported where used: listing the adapters needs none of it.
if TYPE_CHECKING:
    import onnx


_EMPTY_REDUCTION = ("measured: PyTorch's min/max raise on an empty tensor (\"Expected reduction dim to be specified "
                    "for input.numel() == 0\", \"amin(): Expected reduction dim 0 to have non-zero size\"): the "
                    "form reduces x itself")


class _TorchSession(Session):
    def __init__(self, module, proto: onnx.ModelProto, threads: int) -> None:
        super().__init__([i.name for i in fed_inputs(proto)], [o.name for o in proto.graph.output])
        self._module = module
        self._types = output_types(proto)
        self._threads = threads

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        import torch

        # A copy: torch.from_numpy shares memory and warns about arrays that are not writable.
        tensors = [torch.from_numpy(np.array(array)) for array in self.fed(feeds)]
        threads = torch.get_num_threads()
        try:
            if self._threads > 0:
                torch.set_num_threads(self._threads)
            with torch.no_grad(), failures_of():
                results = self._module(*tensors)
        finally:
            torch.set_num_threads(threads)
        # One output comes back as a tensor, several as a sequence of them.
        results = [results] if isinstance(results, torch.Tensor) else list(results)
        return self.chosen([conform(r.numpy(), t) for r, t in zip(results, self._types)], outputs)


class _Converter(Runtime):
    """A converter to a ``torch.nn.Module``; subclasses name it and implement :meth:`_convert`."""

    variant = "float64"

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        proto = whole_proto(model)
        with failures_of():
            module = self._convert(proto)
        return _TorchSession(module, proto, threads)

    def _convert(self, proto: onnx.ModelProto):
        raise NotImplementedError


def _missing(runtime: str, op_type: str, since_version: int, measured: str) -> Lack:
    """onnx2torch's refusal of an op from ``since_version`` on, in its own words."""
    return Lack(runtime, op_type, since_version, measured,
                f"NotImplementedError: Converter is not implemented (OperationDescription(domain='', "
                f"operation_type='{op_type}', version={since_version}))")


class OnnxToTorch(_Converter):
    name = "onnx2torch"
    module = "onnx2torch"
    distribution = "onnx2torch"
    extra = "onnx2torch"
    lacks = tuple(
        _missing("onnx2torch", op_type, since_version, "1.5.15")
        for op_type, since_version in (
            ("DynamicQuantizeLinear", 11), ("QuantizeLinear", 10), ("DequantizeLinear", 10), ("MatMulInteger", 10),
            ("ConvInteger", 10), ("GreaterOrEqual", 16), ("Reshape", 19), ("ReduceMin", 18), ("ReduceMax", 18),
            ("Cast", 19), ("Equal", 19), ("Round", 22), ("Constant", 19), ("Shape", 19), ("Identity", 19),
            ("Unsqueeze", 21), ("Squeeze", 23), ("Transpose", 21), ("ConstantOfShape", 20), ("If", 1), ("GRU", 1),
        )
    )
    known_differences = (
        KnownDifference(("arithmetic",), "empty", _EMPTY_REDUCTION, outputs=OUTPUTS),
    )

    def _convert(self, proto: onnx.ModelProto):
        import onnx2torch

        return onnx2torch.convert(proto)


class OnnxToPytorch(_Converter):
    name = "onnx2pytorch"
    module = "onnx2pytorch"
    distribution = "onnx2pytorch"
    extra = "onnx2pytorch"
    known_differences = (
        KnownDifference(("native", "quantizelinear", "arithmetic"), "empty", _EMPTY_REDUCTION, outputs=OUTPUTS),
        KnownDifference(("native",), "all zero",
                        "measured: onnx2pytorch's DynamicQuantizeLinear gives an all-zero input the scale 0 (ORT: "
                        "1.0)", outputs=("y_scale",)),
        KnownDifference(("native",), "x/scale overflows to +inf",
                        "measured: onnx2pytorch's DynamicQuantizeLinear adds the zero point before it clamps: where "
                        "range/255 underflows to 0, x/0 = inf plus the zero point 0/0 = NaN casts to 0 (expected "
                        "255)", outputs=("y", "y_zero_point")),
        KnownDifference(("native",), "infinite",
                        "measured: onnx2pytorch's DynamicQuantizeLinear gives -inf in x the zero point "
                        "-(-inf)/inf = NaN, which casts to 0 (expected 255)", outputs=("y", "y_zero_point")),
    )

    def _convert(self, proto: onnx.ModelProto):
        import onnx2pytorch

        # experimental: a batch dimension other than 1 (every input shape) is allowed.
        return onnx2pytorch.ConvertModel(proto, experimental=True)
