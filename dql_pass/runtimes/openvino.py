"""OpenVINO's CPU plugin, always at float32 inference precision, in a worker process
(:mod:`dql_pass.runtimes.openvino_worker`, through :mod:`dql_pass.runtimes.served`): the plugin dies
(SIGSEGV) compiling some models, which is then that run's failure, and the next run starts a new worker.

On a CPU with AMX-bf16 the plugin runs float32 models in bf16 unless told otherwise, which no
DQL output survives. A model compiles once per input shape: the plugin refuses inputs of
unknown rank. ``threads`` > 0 sets INFERENCE_NUM_THREADS; ``optimize`` is ignored: the plugin
has no switch for its graph transformations.
"""

from __future__ import annotations

__all__ = ["OpenVino"]

from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, dequantizes_otherwise, quantizes_otherwise
from dql_pass.runtimes.served import ServedRuntime


class OpenVino(ServedRuntime):
    name = "openvino"
    module = "openvino"
    distribution = "openvino"
    extra = "openvino"
    # float32 only, each quotient settled by its exact remainder: the plugin divides through the
    # reciprocal and runs float64 as float32. Portable rather than residual: residual's remainders
    # leave the normal range for scales near 2^-126 (32 of 1,256 inputs lost), portable's do not.
    # Not lean, exact on every other input: the plugin dies compiling its Gather for an empty x, and its
    # scale's pair of Gemms in some lowered models.
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

    computed_otherwise = (
        dequantizes_otherwise("openvino", "2026.4.1", 161),
        quantizes_otherwise("openvino", "2026.4.1", 27),
    )

    def prepare(self, proto) -> None:
        # The plugin fails to read a model whose input has a fixed dimension of 0 (an IndexError out of
        # its frontend); symbolic ones read, and each compile fixes them again.
        for value in proto.graph.input:
            for axis, dim in enumerate(value.type.tensor_type.shape.dim):
                if dim.HasField("dim_value"):
                    dim.dim_param = f"{value.name}_{axis}"

    def load_arguments(self, *, threads: int) -> tuple[object, ...]:
        return (threads,)
