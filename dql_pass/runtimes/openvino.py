"""OpenVINO's CPU plugin, always at float32 inference precision.

On a CPU with AMX-bf16 the plugin runs float32 models in bf16 unless told otherwise, which no
DQL output survives. A session compiles once per input shape: the plugin refuses inputs of
unknown rank. ``threads`` > 0 sets INFERENCE_NUM_THREADS; ``optimize`` is ignored: the plugin
has no switch for its graph transformations.
"""

from __future__ import annotations

__all__ = ["OpenVino"]

import sys

import numpy as np

from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, Runtime, RuntimeFailure, Session, failures_of
from dql_pass.runtimes.sessions import ShapeCachedSession, as_file, fed_inputs, output_types


def _import_openvino():
    """The openvino module, imported without its telemetry."""
    # `import openvino` starts openvino-telemetry, which writes a client id and usage stats under
    # $HOME/intel and sends an "import" event to Google Analytics; where that package does not
    # import, OpenVINO uses its own no-op stub. Nothing dql_pass runs may reach the network.
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)
    import openvino

    return openvino


class OpenVino(Runtime):
    name = "openvino"
    module = "openvino"
    distribution = "openvino"
    extra = "openvino"
    # float32 only, each quotient settled by its exact remainder: the plugin divides through the
    # reciprocal and runs float64 as float32. Portable rather than residual: residual's remainders
    # leave the normal range for scales near 2^-126 (32 of 1,256 inputs lost), portable's do not.
    # Not lean, exact on every other input: the plugin dies compiling its Gather for an empty x.
    variant = "portable"
    known_differences = (
        KnownDifference(("native",), "zero range",
                        "measured: OpenVINO's DynamicQuantizeLinear gives a zero range (all zero, or empty) the "
                        "scale 0", outputs=("y_scale", "y_zero_point")),
        KnownDifference(("native",), "x/scale overflows to +inf",
                        "measured: where the scale underflows to 0, OpenVINO's DynamicQuantizeLinear gives the zero "
                        "point 0 for 0/0; the contract saturates it to 255", outputs=("y_zero_point",)),
        KnownDifference(("native",), "infinite",
                        "measured: with -inf in x, OpenVINO's DynamicQuantizeLinear gives the zero point 0 for "
                        "inf/inf; the contract saturates it to 255", outputs=("y", "y_zero_point")),
        KnownDifference(("native", "quantizelinear"), "near tie",
                        "measured: OpenVINO rounds a quotient on or next to a tie away from zero, after adding the "
                        "zero point in float32 (127.49999 + 127 rounds to 255, not 254)",
                        outputs=("y", "y_zero_point")),
        KnownDifference(("quantizelinear",), "infinite",
                        "measured: OpenVINO's QuantizeLinear gives y 255 for x = +inf (inf/inf); the contract "
                        "gives 0", outputs=("y",)),
        KnownDifference(("native", "quantizelinear", "arithmetic"), "reciprocal",
                        "measured: OpenVINO computes every float32 Div as a multiplication by the reciprocal",
                        outputs=OUTPUTS),
        KnownDifference(("float64",), "reciprocal",
                        "measured: OpenVINO's CPU plugin computes float64 as float32, so the float64 divisions "
                        "go through a float32 reciprocal too", outputs=OUTPUTS),
        KnownDifference(("residual",), "tiny scale",
                        "measured: with a scale near 1.5e-38 the residual variant's remainders fall out of the "
                        "normal float32 range, where OpenVINO loses their low bits (32 of 1,256 inputs)",
                        outputs=("y_scale",)),
        KnownDifference(("lean",), "empty",
                        "measured: OpenVINO's CPU plugin dies (SIGFPE) compiling a Gather whose indices are empty, "
                        "as the lean variant's are for an empty x", outputs=OUTPUTS),
    )

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        import onnx

        openvino = _import_openvino()
        config = {"INFERENCE_PRECISION_HINT": "f32"}
        if threads > 0:
            config["INFERENCE_NUM_THREADS"] = threads
        # A copy of our own, even of a file: its inputs' fixed dimensions are about to go.
        with as_file(model) as path:
            proto = onnx.load(path, load_external_data=False)
            # The plugin fails to read a model whose input has a fixed dimension of 0 (an IndexError
            # out of its frontend); symbolic ones read, and each compile below fixes them again.
            for value in proto.graph.input:
                for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                    if dim.HasField("dim_value"):
                        dim.dim_param = f"{value.name}_{axis}"
            onnx.save(proto, path)
            with failures_of():
                core = openvino.Core()
                read = core.read_model(path)

        def compile(signature):
            # Compiled per input shape: the CPU plugin refuses an input of unknown rank, and a
            # fixed shape is what it optimizes best.
            fixed = read.clone()
            fixed.reshape({index: list(shape) for index, (shape, _) in enumerate(signature)})
            _refuse_empty_gathers(fixed)
            compiled = core.compile_model(fixed, "CPU", config)

            def run(arrays):
                results = compiled.create_infer_request().infer(dict(enumerate(arrays)))
                return [np.array(results[port]) for port in compiled.outputs]
            return run

        # Names from the file, outputs by position: the plugin keeps one of a port's names, not always the graph's.
        inputs = [value.name for value in fed_inputs(proto)]
        # The plugin raises plain RuntimeErrors, and only the plugin runs in ``compile``.
        return ShapeCachedSession(inputs, [value.name for value in proto.graph.output], output_types(proto), compile)


def _refuse_empty_gathers(model) -> None:
    """A refusal, where compiling would kill the process: the CPU plugin dies (SIGFPE) compiling a
    Gather whose indices are empty (measured on a three-node model, and on the lean variant's for an
    empty x)."""
    for node in model.get_ordered_ops():
        if node.get_type_name() == "Gather":
            indices = node.input_value(1).get_partial_shape()
            if indices.is_static and 0 in indices.to_shape():
                raise RuntimeFailure("OpenVINO's CPU plugin dies (SIGFPE) compiling a Gather with empty indices; "
                                     "not run")
