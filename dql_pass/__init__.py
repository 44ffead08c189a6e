"""dql_pass: expand, check and fuse ONNX DynamicQuantizeLinear, bit-exact with ONNX Runtime.

The public API:

- :func:`expand` rewrites every DynamicQuantizeLinear of a model into primitive ops;
  :func:`expand_file` does it file to file and returns the per-graph counts.
- :func:`dynamic_quantize_linear` is the NumPy reference.
- :func:`function_proto` gives the decomposition itself as a FunctionProto.
- :class:`ExpandDynamicQuantizeLinearPass` is the onnx_ir pass behind :func:`expand`.
- :func:`fuse` (and :func:`fuse_file`) turns decomposed DynamicQuantizeLinear back into single
  nodes and reports what it did; :mod:`dql_pass.fusion` gives its onnxscript rewriter rules.
- :func:`generate_suite` writes a conformance suite in ONNX's backend-test layout; :func:`run_suite` runs one.
- :func:`load_model` and :func:`save_model` read checked models and write them atomically.
- :func:`verify` checks a rewritten model against the original, bit for bit.
- :func:`lower` (and :func:`lower_file`) rewrites the quantization ops of a ``quantize_dynamic``
  model into float32 primitives, bit-exact, and reports the proof per node;
  :class:`LowerQuantizationPass` is its onnx_ir pass.

Fusion and the suites load when first used; no runtime loads until a model runs on it. So
expanding imports neither onnxscript nor a runtime.
"""

from __future__ import annotations

__all__ = [
    "__version__",
    "ExpandDynamicQuantizeLinearPass",
    "ExpandResult",
    "FuseDynamicQuantizeLinearPass",
    "FuseReport",
    "InputError",
    "LowerQuantizationPass",
    "LowerReport",
    "MODES",
    "VARIANTS",
    "VerifyReport",
    "ZERO_RANGE_POLICIES",
    "dynamic_quantize_linear",
    "expand",
    "expand_file",
    "find_sites",
    "function_proto",
    "fuse",
    "fuse_file",
    "generate_suite",
    "load_model",
    "lower",
    "lower_file",
    "run_suite",
    "save_model",
    "target_variant",
    "verify",
]

import importlib
import importlib.metadata
from typing import TYPE_CHECKING

try:
    __version__ = importlib.metadata.version("dql_pass")
except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "unknown"

from dql_pass.api import expand, expand_file, fuse, fuse_file, lower, lower_file, target_variant
from dql_pass.decomposition import function_proto
from dql_pass.errors import InputError
from dql_pass.expand import ExpandDynamicQuantizeLinearPass, ExpandResult
from dql_pass.lower import LowerQuantizationPass, LowerReport
from dql_pass.modelfiles import load_model, save_model
from dql_pass.op import MODES, VARIANTS, ZERO_RANGE_POLICIES
from dql_pass.reference import dynamic_quantize_linear
from dql_pass.verify import VerifyReport, verify  # eager: the submodule shares the function's name
from dql_pass.walk import find_sites

_LAZY = {
    "FuseDynamicQuantizeLinearPass": "dql_pass.fusion",
    "FuseReport": "dql_pass.fusion",
    "generate_suite": "dql_pass.suites",
    "run_suite": "dql_pass.suites",
}

if TYPE_CHECKING:
    from dql_pass.suites import generate_suite, run_suite
    from dql_pass.fusion import FuseDynamicQuantizeLinearPass, FuseReport


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'dql_pass' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
