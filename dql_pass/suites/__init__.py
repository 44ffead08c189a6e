"""Conformance suites for DynamicQuantizeLinear in ONNX's backend-test layout, written and run.

- :mod:`~dql_pass.suites.layout`: the folder layout, its names, the manifest, and reading a suite's
  files with bounds (a suite may come from anywhere).
- :mod:`~dql_pass.suites.generate`: :func:`generate_suite` writes one test folder per (input,
  form, opset), with expected outputs from :mod:`dql_pass.reference`, and puts the suite in place
  in one step.
- :mod:`~dql_pass.suites.run`: :func:`run_suite` runs any suite in the layout on a runtime of
  :mod:`dql_pass.runtimes` and compares every output bit for bit.

onnx's ``load_model_tests(data_dir=PARENT, kind=NAME)`` and ORT's onnx_test_runner read the
suites too.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_OPSETS",
    "FORMS",
    "MANIFEST",
    "GeneratedSuite",
    "LeftOut",
    "Outcome",
    "RunReport",
    "SuiteEntry",
    "generate_suite",
    "run_suite",
]

from typing import TYPE_CHECKING

from dql_pass.lazy import exports
from dql_pass.suites.defaults import DEFAULT_OPSETS, FORMS

# Loaded when first used: writing or running a suite needs the runtimes, reading its defaults does not.
_LAZY = {
    "GeneratedSuite": "generate", "generate_suite": "generate", "MANIFEST": "layout", "LeftOut": "layout",
    "SuiteEntry": "layout", "Outcome": "run", "RunReport": "run", "run_suite": "run",
}

if TYPE_CHECKING:
    from dql_pass.suites.generate import GeneratedSuite, generate_suite
    from dql_pass.suites.layout import MANIFEST, LeftOut, SuiteEntry
    from dql_pass.suites.run import Outcome, RunReport, run_suite


__getattr__, __dir__ = exports(__name__, _LAZY)
