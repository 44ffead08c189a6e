"""tract (Sonos' Rust engine): reads ONNX files, and needs every input's shape and type fixed
before it analyses and optimizes a model, so a session compiles once per input shape.

``threads`` and ``optimize`` are ignored: the Python bindings have no thread setting, and
``into_runnable`` always optimizes.
"""

from __future__ import annotations

__all__ = ["Tract"]

import contextlib
from collections.abc import Iterator

import numpy as np

from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, Lack, Runtime, Session, failures_of
from dql_pass.runtimes.sessions import ShapeCachedSession, as_file, fed_inputs, hold, output_types



def _fact(shape: tuple[int, ...], dtype: np.dtype) -> str:
    """tract's spelling of an input fact: ``"2,16,f32"``, or ``"f32"`` for a scalar."""
    kind = "bool" if dtype == np.bool_ else f"{dtype.kind}{dtype.itemsize * 8}"
    return ",".join([*map(str, shape), kind])


@contextlib.contextmanager
def _without_backtrace() -> Iterator[None]:
    """tract's errors without the Rust stack trace it appends when RUST_BACKTRACE is set."""
    import tract

    try:
        yield
    except tract.TractError as error:
        raise tract.TractError(str(error).split("\n\nStack backtrace:")[0]) from None


class Tract(Runtime):
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
        KnownDifference(("residual",), "tiny scale",
                        "measured: with a scale near 1.5e-38 the residual variant's remainders fall out of the "
                        "normal float32 range, where tract loses their low bits (1 of 1,256 inputs)",
                        outputs=("y_scale",)),
    )

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        import onnx  # here: listing the runtimes needs no graph library
        import tract

        with contextlib.ExitStack() as files:
            # A copy of our own, even of a file: its shapes are about to go.
            path = str(files.enter_context(as_file(model)))
            proto = onnx.load(path, load_external_data=False)
            # tract fails to unify the symbolic dims of value_info and graph outputs ("batch") with the
            # input facts set per run (2): without them it infers every shape from the facts.
            del proto.graph.value_info[:]
            for output in proto.graph.output:
                output.type.tensor_type.ClearField("shape")
            onnx.save(proto, path)
            with failures_of("tract"), _without_backtrace():
                tract.onnx().load(path)  # a model tract cannot read fails here, not at its first run
            inputs = [value.name for value in fed_inputs(proto)]
            kept = files.pop_all()  # open as long as the session, below

        def compile(signature):
            with _without_backtrace():
                inference = tract.onnx().load(path)
                for index, (shape, dtype) in enumerate(signature):
                    inference.set_input_fact(index, _fact(shape, dtype))
                runnable = inference.into_model().into_runnable()

            def run(arrays):
                with _without_backtrace():
                    return [t.to_numpy() for t in runnable.run([np.require(a, requirements="C") for a in arrays])]
            return run

        # Names from the file: tract's output_name gives a multi-output node's first output for each.
        outputs = [value.name for value in proto.graph.output]
        session = ShapeCachedSession(inputs, outputs, output_types(proto), compile, "tract")
        # Each new input shape reads the file again: a temporary copy lives as long as the session.
        hold(session, kept.close)
        return session
