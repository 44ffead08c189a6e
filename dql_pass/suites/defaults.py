"""What a suite holds unless told otherwise: a leaf, so that the command line's help costs no suite import."""

from __future__ import annotations

__all__ = ["DEFAULT_OPSETS", "DEFAULT_OUTDIR", "FORMS"]

from dql_pass.variants import NAMES

# 11 is the operator's only version; 13, 18 and 21 bring new versions of the ops the expansion uses
# (QuantizeLinear, ReduceMin/ReduceMax, Cast); 27 is the newest opset onnxruntime 1.32 runs in
# full: it has no QuantizeLinear-28 kernel.
DEFAULT_OPSETS: tuple[int, ...] = (11, 13, 18, 21, 27)
DEFAULT_OUTDIR = "conformance/dql"
FORMS: tuple[str, ...] = ("native", *NAMES)  # the DQL node itself, and each expansion variant
