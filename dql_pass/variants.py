"""The expansion variants, one record each and the only list of them, the other choices every
form of DynamicQuantizeLinear is built under (mode, zero-range policy), and the forms ``lower``
stores constant weights in.

A leaf with no onnx import, so that the command line can list the variants in its help without
loading a graph library. Each record says what the variant is for and how ``lower`` may divide
when a target's model uses it; its body is the onnxscript function of the same name in
:mod:`dql_pass.onnxscript_bodies`, shipped as ``bodies/DynamicQuantizeLinear_<name>_<policy>.pb``.
"""

from __future__ import annotations

__all__ = ["BY_NAME", "MODES", "NAMES", "REGISTRY", "Variant", "WEIGHTS", "ZERO_RANGE_POLICIES"]

import dataclasses


@dataclasses.dataclass(frozen=True)
class Variant:
    """An expansion variant of DynamicQuantizeLinear."""

    name: str
    summary: str
    # How lower divides in QuantizeLinear for a target whose variant this is: "float" (float32
    # where the runtime rounds a division correctly), "double" (float64, cast back once, where it
    # divides through the reciprocal), or None: QuantizeLinear is left alone for that target.
    division: str | None
    # Whether y is the Cast to uint8 of a float32 integer in [0, 255] on every input, NaN and
    # infinities included (or a Gather from such a table: lean), so that lower's blocks may read
    # that float (dql_pass.lowering.blocks).
    # arithmetic and float64 cast Clip(NaN) for an x of both infinities, relying on the Cast.
    float_y: bool = False


REGISTRY: tuple[Variant, ...] = (
    Variant("quantizelinear", "two reductions, scalar arithmetic for the scale and the zero point, then QuantizeLinear",
            "float"),
    Variant("arithmetic", "no quantization op at all (Div, Round, Add, Clip, Cast), for runtimes that lack "
            "QuantizeLinear too", "float"),
    Variant("float64", "arithmetic with every division done in float64 and cast back, and reductions that never see "
            "an empty tensor: exact on runtimes that divide through a reciprocal or refuse empty reductions", "double"),
    Variant("residual", "float64's reductions, with float32 divisions corrected by exact residuals (a - n * b with b "
            "split in two): exact on runtimes that divide through a reciprocal and compute float64 as float32", None),
    Variant("portable", "float32 only, rounding built from Floor, exact residuals and Less against 0: exact where Div "
            "is up to 3 ulp off (WebGPU), products are fused into sums or comparisons read float bits as int32, and "
            "with subnormals flushed but for a subnormal x or scale; no Round, Sign, QuantizeLinear, Equal, Greater or "
            "float64", None, float_y=True),
    Variant("lean", "portable's guarantees in 53 nodes, 15 of them over the whole tensor: exact thresholds built once "
            "per site on a vector of 769 (Gemm for the exact products), then per element Div, a clamp, Cast to int32, "
            "Gather, Less and Gather", None,
            float_y=True),
)

NAMES: tuple[str, ...] = tuple(variant.name for variant in REGISTRY)
BY_NAME: dict[str, Variant] = {variant.name: variant for variant in REGISTRY}

MODES: tuple[str, ...] = ("inline", "function")  # the ops where each DQL was, or a call to one model-local function
# The scale of an all-zero or empty input: 1.0 as ORT's kernel gives it, or 1/255 as onnx.reference does.
ZERO_RANGE_POLICIES: tuple[str, ...] = ("onnxruntime", "onnx-reference")
# How lower stores a constant int8 or uint8 weight: as it is, cast and shifted in the graph (which
# runtimes fold at load), or cast and shifted once, as float32, four times its size.
WEIGHTS: tuple[str, ...] = ("integer", "float")
