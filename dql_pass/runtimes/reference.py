"""onnx.reference: ONNX's own evaluator in NumPy, slow but independent of ORT."""

from __future__ import annotations

__all__ = ["OnnxReference"]

import os
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, Runtime, Session, failures_of
from dql_pass.runtimes.sessions import as_proto


class _ReferenceSession(Session):
    def __init__(self, evaluator) -> None:
        # Models below IR version 4 list their initializers among the inputs: those are not fed.
        weights = {tensor.name for tensor in evaluator.inits_}
        super().__init__([name for name in evaluator.input_names if name not in weights], evaluator.output_names)
        self._evaluator = evaluator

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        # 0/0 and inf/inf are part of what runs here: numpy's warnings about them are noise.
        # onnx.reference raises whatever its NumPy code raises: all of it is the runtime's refusal.
        with np.errstate(all="ignore"), warnings.catch_warnings(), failures_of():
            warnings.simplefilter("ignore")
            fed = dict(zip(self.input_names, self.fed(feeds)))
            return self._evaluator.run(None if outputs is None else list(outputs), fed)


class OnnxReference(Runtime):
    name = "reference"
    module = "onnx.reference"
    distribution = "onnx"
    variant = "arithmetic"  # its QuantizeLinear sends +inf to 0
    known_differences = (
        KnownDifference(("native",), "empty",
                        "onnx.reference's DynamicQuantizeLinear raises on an empty input (a reduction of no elements)",
                        outputs=OUTPUTS),
        KnownDifference(("native",), "all zero", "onnx.reference gives a zero range the scale 1/255; the "
                        "onnxruntime policy expects 1.0", policy="onnxruntime", outputs=("y_scale",)),
        KnownDifference(("quantizelinear",), "x/scale overflows to +inf",
                        "onnx.reference's QuantizeLinear sends x/scale = +inf to 0 (rint(inf) cast to int32); "
                        "the expected value saturates to 255", outputs=("y",)),
    )

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        import onnx_ir as ir  # here: listing the runtimes needs no graph library
        from onnx.reference import ReferenceEvaluator

        if isinstance(model, ir.Model):
            model = as_proto(model)[0]
        with failures_of():
            return _ReferenceSession(
                ReferenceEvaluator(os.fspath(model) if isinstance(model, (str, os.PathLike)) else model))
