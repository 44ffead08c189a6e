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
- :func:`check_target` says what still keeps a written model from running on a runtime.
- :func:`advise` says, per runtime, what a model needs there and the command that gives it.
- :func:`lower` (and :func:`lower_file`) rewrites the quantization ops of a ``quantize_dynamic``
  model into float32 primitives, bit-exact, and reports the proof per node;
  :class:`LowerQuantizationPass` is its onnx_ir pass.

Each name loads its module when first used; no runtime loads until a model runs on it.
"""

from __future__ import annotations

__all__ = [
    "__version__",
    "Advice",
    "ExpandDynamicQuantizeLinearPass",
    "ExpandReport",
    "ExpandResult",
    "FuseDynamicQuantizeLinearPass",
    "FuseReport",
    "FuseResult",
    "GeneratedSuite",
    "InputError",
    "LowerQuantizationPass",
    "LowerReport",
    "LowerResult",
    "MODES",
    "Outcome",
    "RunReport",
    "TargetCheck",
    "VARIANTS",
    "VerifyReport",
    "ZERO_RANGE_POLICIES",
    "advise",
    "check_target",
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

from dql_pass.lazy import exports

TYPE_CHECKING = False  # typing's own costs an import before the command line handles Ctrl-C

# Every name loads its module when first used, so that importing dql_pass (and the command line's
# --help) costs no graph library, and expanding loads neither onnxscript nor a runtime. No module
# of the package is named like a function here: an import of it would replace the function.
_LAZY = {
    "Advice": "advice",
    "advise": "advice",
    "check_target": "deployment",
    "__version__": "metadata",
    "ExpandDynamicQuantizeLinearPass": "expansion",
    "ExpandReport": "expansion",
    "ExpandResult": "expansion",
    "FuseDynamicQuantizeLinearPass": "fusion",
    "FuseReport": "fusion",
    "FuseResult": "fusion",
    "GeneratedSuite": "suites",
    "InputError": "errors",
    "LowerQuantizationPass": "lowering",
    "LowerReport": "lowering",
    "LowerResult": "lowering",
    "MODES": "variants",
    "Outcome": "suites",
    "RunReport": "suites",
    "TargetCheck": "deployment",
    "VARIANTS": "op",
    "VerifyReport": "verification",
    "ZERO_RANGE_POLICIES": "variants",
    "dynamic_quantize_linear": "reference",
    "expand": "api",
    "expand_file": "api",
    "find_sites": "graph.walk",
    "function_proto": "decomposition",
    "fuse": "api",
    "fuse_file": "api",
    "generate_suite": "suites",
    "load_model": "files",
    "lower": "api",
    "lower_file": "api",
    "run_suite": "suites",
    "save_model": "files",
    "target_variant": "api",
    "verify": "verification",
}

if TYPE_CHECKING:
    from dql_pass.advice import Advice, advise
    from dql_pass.api import expand, expand_file, fuse, fuse_file, lower, lower_file, target_variant
    from dql_pass.decomposition import function_proto
    from dql_pass.deployment import TargetCheck, check_target
    from dql_pass.errors import InputError
    from dql_pass.expansion import ExpandDynamicQuantizeLinearPass, ExpandReport, ExpandResult
    from dql_pass.fusion import FuseDynamicQuantizeLinearPass, FuseReport, FuseResult
    from dql_pass.lowering import LowerQuantizationPass, LowerReport, LowerResult
    from dql_pass.metadata import __version__
    from dql_pass.files import load_model, save_model
    from dql_pass.op import VARIANTS
    from dql_pass.reference import dynamic_quantize_linear
    from dql_pass.suites import GeneratedSuite, Outcome, RunReport, generate_suite, run_suite
    from dql_pass.variants import MODES, ZERO_RANGE_POLICIES
    from dql_pass.verification import VerifyReport, verify
    from dql_pass.graph.walk import find_sites


__getattr__, __dir__ = exports(__name__, _LAZY)
