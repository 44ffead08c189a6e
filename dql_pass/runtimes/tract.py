"""tract (Sonos' Rust engine): reads ONNX files, and needs every input's shape and type fixed
before it analyses and optimizes a model, so a model compiles once per input shape.

tract runs in a worker process (:mod:`dql_pass.runtimes.tract_worker`, through
:mod:`dql_pass.runtimes.served`), one for every session of the command: a panic in its Rust code aborts the
process it runs in (a model that asks for a tensor too large to allocate, measured), which is then that
run's failure with the panic's message, and the next run starts a new worker. ``threads`` and ``optimize``
are ignored: the Python bindings have no thread setting, and ``into_runnable`` always optimizes.
"""

from __future__ import annotations

__all__ = ["Tract"]

import re

from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, Lack, quantizes_otherwise
from dql_pass.runtimes.served import ServedRuntime

_PANIC = re.compile(r"panicked at [^\n]*:\n(.+)")


class Tract(ServedRuntime):
    name = "tract"
    module = "tract"
    distribution = "tract"
    extra = "tract"
    variant = "float64"
    lacks = (
        Lack("tract", "QuantizeLinear", 10, "0.23.9",
             "tract refuses QuantizeLinear whose scale is not a constant: 'y_scale must be a const'",
             unless_constant=(1, 2)),
    )
    computed_otherwise = (
        quantizes_otherwise("tract", "0.23.9", 74),
    )
    known_differences = (
        KnownDifference(("native",), "zero range",
                        "measured: tract's DynamicQuantizeLinear gives a zero range (all zero, or empty) the scale 0",
                        outputs=("y_scale",)),
        KnownDifference(("native",), "x/scale overflows to +inf",
                        "measured: where the scale underflows to 0, tract's DynamicQuantizeLinear gives the zero "
                        "point 0 for 0/0 and y 0 for x/0 = +inf; the contract saturates both to 255",
                        outputs=("y", "y_zero_point")),
        KnownDifference(("native",), "infinite",
                        "measured: with -inf in x, tract's DynamicQuantizeLinear gives the zero point 0 for "
                        "inf/inf and y 0 everywhere; the contract saturates that zero point to 255",
                        outputs=("y", "y_zero_point")),
        KnownDifference(("arithmetic",), "reciprocal",
                        "measured: tract computes every float32 Div as a multiplication by the reciprocal",
                        outputs=OUTPUTS),
        KnownDifference(("lean",), "subnormal",
                        "measured: tract's Gemm reads a subnormal operand as 0 (a one-node Gemm gives 2e-38 for "
                        "2e-38 - 256 * 7.8e-41; its Mul keeps it), and lean rounds a subnormal scale in two Gemms: "
                        "that scale comes out 0", outputs=OUTPUTS),
        KnownDifference(("residual",), "tiny scale",
                        "measured: with a scale near 1.5e-38 the residual variant's remainders fall out of the "
                        "normal float32 range, where tract loses their low bits (1 of 1,256 inputs)",
                        outputs=("y_scale",)),
    )

    def why(self, stderr: str) -> str | None:
        """The message of the panic that ended tract's worker."""
        found = _PANIC.search(stderr)
        return found.group(1).strip() if found else None

    def prepare(self, proto) -> None:
        # tract fails to unify the symbolic dims of value_info and graph outputs ("batch") with the
        # input facts set per run (2): without them it infers every shape from the facts.
        del proto.graph.value_info[:]
        for output in proto.graph.output:
            output.type.tensor_type.ClearField("shape")
