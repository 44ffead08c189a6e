"""tinygrad on its CPU device (C code compiled by clang), through its ONNX runner.

A runner pins the model's symbolic dimensions on its first call, so a session builds one per
input shape. The device is chosen per call with tinygrad's own ``Context(DEV="CPU")``: nothing
global changes, and a GPU that tinygrad would pick by default is never opened. ``threads`` > 0
caps the threads a kernel is split over (NUM_CPU_THREADS); ``optimize`` is ignored: tinygrad
always fuses and schedules its kernels its own way.
"""

from __future__ import annotations

__all__ = ["Tinygrad"]

import contextlib
import itertools

from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, Runtime, Session, failures_of, quantizes_otherwise
from dql_pass.runtimes.sessions import ShapeCachedSession, as_file, hold, output_types



_REWRITES = ("measured: tinygrad rewrites float algebra before it runs, as if it were real arithmetic, which "
             "undoes the exact remainders of the residual, portable and lean variants: (v + e) - v becomes e (that "
             "rewrite and one more, made on ORT, break 53 of the 62 inputs portable loses on tinygrad 0.14); lean's "
             "thresholds lose their exact residual test the same way (ties of x / scale round the wrong way: the "
             "spec's example, tie_unit_scale), and for an empty x, whose whole graph tinygrad folds as constants, "
             "lean's scale loses its correction too (0.99999994 for 1)")


class Tinygrad(Runtime):
    name = "tinygrad"
    module = "tinygrad"
    distribution = "tinygrad"
    extra = "tinygrad"
    variant = "float64"
    computed_otherwise = (
        quantizes_otherwise("tinygrad", "0.14.0", 117),
    )
    known_differences = (
        KnownDifference(("native",), "zero range",
                        "measured: tinygrad's DynamicQuantizeLinear gives a zero range (all zero, or empty) the "
                        "scale 0", outputs=("y_scale",)),
        KnownDifference(("native", "quantizelinear"), "x/scale overflows to +inf",
                        "measured: where the scale underflows to 0, tinygrad's DynamicQuantizeLinear gives the zero "
                        "point 0 or 128, and its QuantizeLinear y 0 for x/0 = +inf; the contract saturates them to 255",
                        outputs=("y", "y_zero_point")),
        KnownDifference(("native",), "infinite",
                        "measured: with -inf in x, tinygrad's DynamicQuantizeLinear gives the zero point 0 for "
                        "inf/inf; the contract saturates it to 255", outputs=("y", "y_zero_point")),
        KnownDifference(("native", "quantizelinear"), "near tie",
                        "measured: tinygrad rounds a quotient on a tie, or within a few ulps of one, away from zero "
                        "(82.5 + 114 to 197, 127.49999 to 128); the contract rounds half to even",
                        outputs=("y", "y_zero_point")),
        KnownDifference(("native", "quantizelinear", "arithmetic"), "reciprocal",
                        "measured: tinygrad divides by a constant (range / 255) through its reciprocal",
                        outputs=OUTPUTS),
        *(KnownDifference(("residual", "portable", "lean"), inputs, _REWRITES, outputs=OUTPUTS)
          for inputs in ("reciprocal", "near tie")),
        # lean's scale and thresholds are rewritten whatever x holds: a subnormal range and an empty x differ too.
        *(KnownDifference(("lean",), inputs, _REWRITES, outputs=OUTPUTS) for inputs in ("subnormal", "empty")),
    )

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        import onnx
        from tinygrad.helpers import Context

        # No kernel cache (a database it would write in ~/.cache/tinygrad), and kernels compiled here, not
        # in a pool of processes that it spawns, which read neither setting and outlive the command.
        settings = {"DEV": "CPU", "CACHELEVEL": 0, "PARALLEL": 0}
        settings |= {"NUM_CPU_THREADS": threads} if threads > 0 else {}
        with Context(**settings):
            # Its import asks for the default device: unset, tinygrad would pick the first one it
            # can open (a GPU, say) and write it to os.environ["DEV"].
            from tinygrad.nn.onnx import OnnxRunner
        with contextlib.ExitStack() as files:
            # A copy of our own, even of a file: the per-shape copies go beside it.
            path = files.enter_context(as_file(model))
            proto = onnx.load(path, load_external_data=False)
            # tinygrad raises plain Python errors (ValueError, AssertionError...), and only tinygrad runs here.
            with failures_of(), Context(**settings):
                probe = OnnxRunner(path)  # a model tinygrad cannot read fails here, not at its first run
            kept = files.pop_all()  # open as long as the session, below
        copies = itertools.count()

        def compile(signature):
            # A runner takes only arrays of its inputs' declared rank and pins their dims on first
            # use: each input shape gets a copy of the model that declares that shape, beside the
            # original so that its external data is found.
            fixed = onnx.ModelProto()
            fixed.CopyFrom(proto)
            for value, (shape, _) in zip((v for v in fixed.graph.input if v.name in probe.graph_inputs), signature):
                value.type.tensor_type.shape.Clear()
                for size in shape:
                    value.type.tensor_type.shape.dim.add().dim_value = size
            copy = path.with_name(f"shape{next(copies)}.onnx")
            onnx.save(fixed, copy)
            with Context(**settings):
                runner = OnnxRunner(copy)

            def run(arrays):
                with Context(**settings):
                    results = runner(dict(zip(probe.graph_inputs, arrays)))
                    return [results[name].numpy() for name in probe.graph_outputs]
            return run

        session = ShapeCachedSession(
            list(probe.graph_inputs), list(probe.graph_outputs), output_types(proto), compile,
        )
        hold(session, kept.close)
        return session
