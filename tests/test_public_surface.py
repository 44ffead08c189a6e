"""The public surface of dql_pass: what ``__all__`` names, each importable and documented, and every
type a public function returns exported with it; each report the API returns formats itself."""

from __future__ import annotations

import inspect
import re

import pytest

import dql_pass

PUBLIC = [
    "Advice", "ExpandDynamicQuantizeLinearPass", "ExpandReport", "ExpandResult", "FuseDynamicQuantizeLinearPass",
    "FuseReport", "FuseResult", "GeneratedSuite", "InputError", "LowerQuantizationPass", "LowerReport",
    "LowerResult", "MODES", "Outcome", "RunReport", "TargetCheck", "VARIANTS", "VerifyReport", "ZERO_RANGE_POLICIES",
    "__version__", "advise", "check_target", "dynamic_quantize_linear", "expand", "expand_file", "find_sites",
    "function_proto", "fuse", "fuse_file", "generate_suite", "load_model", "lower", "lower_file", "run_suite",
    "save_model", "target_variant", "verify",
]
# The reports the API returns: what the command line prints (format) and writes with --json (to_dict).
REPORTS = ["Advice", "ExpandReport", "ExpandResult", "FuseReport", "FuseResult", "GeneratedSuite", "LowerReport",
           "LowerResult", "RunReport", "TargetCheck", "VerifyReport"]


def test_all_lists_the_public_names():
    assert sorted(dql_pass.__all__) == sorted(PUBLIC)
    assert set(dir(dql_pass)) >= set(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_name_imports_and_is_documented(name):
    value = getattr(dql_pass, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        doc = value.__doc__ or ""
        # A dataclass without a docstring gets its signature as one.
        assert doc.strip() and not doc.startswith(f"{name}("), f"{name} has no docstring"
        assert value.__module__.startswith("dql_pass."), value.__module__


def _named_types(annotation: str) -> set[str]:
    """The bare class names in a return annotation: ``tuple[onnx.ModelProto, ExpandReport]`` names ExpandReport."""
    return set(re.findall(r"(?<![.\w])([A-Z]\w*)", annotation)) - {"None"}


def test_named_types_reads_bare_names_only():
    assert _named_types("tuple[onnx.ModelProto | ir.Model, ExpandReport]") == {"ExpandReport"}
    assert _named_types("dict[str, list[ir.Node]] | None") == set()


@pytest.mark.parametrize("name", [n for n in PUBLIC if inspect.isfunction(getattr(dql_pass, n, None))])
def test_each_type_a_public_function_returns_is_exported(name):
    annotation = inspect.signature(getattr(dql_pass, name)).return_annotation
    assert annotation is not inspect.Signature.empty, f"{name} has no return annotation"
    assert _named_types(str(annotation)) <= set(dql_pass.__all__), annotation


@pytest.mark.parametrize("name", REPORTS)
def test_each_report_formats_itself(name):
    report = getattr(dql_pass, name)
    assert callable(getattr(report, "format", None)) and callable(getattr(report, "to_dict", None)), name
