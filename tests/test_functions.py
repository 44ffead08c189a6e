"""The onnxscript decomposition: it builds at every opset and matches ORT's kernel bit for bit."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import onnx.reference
import pytest
from helpers import assert_outputs_bits_equal, dql_model, newest_ort_opset, onnx_node_tests, run_cached, session
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dql_pass
from dql_pass.inputs import cases
from dql_pass import decomposition, runtimes
from dql_pass.decomposition import function_proto
from dql_pass.op import MAX_OPSET, MIN_OPSET, VARIANTS
from dql_pass.reference import dynamic_quantize_linear

F = np.float32
OPSETS = sorted({11, 13, 18, 21, newest_ort_opset()})


def test_the_default_variant_stamps_fewer_nodes_per_site_than_onnxs_own_body():
    # Our constants are shared by every site; the body's Constant and Identity nodes come with each.
    assert decomposition.variant("quantizelinear").nodes < len(
        onnx.defs.get_schema("DynamicQuantizeLinear").function_body.node)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("zero_range", dql_pass.ZERO_RANGE_POLICIES)
def test_builds_a_valid_function_at_every_opset(variant, zero_range):
    for opset in range(MIN_OPSET, MAX_OPSET + 1):
        proto = function_proto(variant, opset, zero_range)
        assert isinstance(proto, onnx.FunctionProto)
        assert [(o.domain, o.version) for o in proto.opset_import] == [("", opset)]
        assert list(proto.input) == ["x"] and list(proto.output) == ["y", "y_scale", "y_zero_point"]
        computing = [n.op_type for n in proto.node if n.op_type != "Constant"]
        assert len(computing) == decomposition.variant(variant, opset).nodes
        assert "Identity" not in computing
        if variant == "arithmetic":
            assert not {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"} & set(computing)
        # The checker validates each node against the opset's schema.
        onnx.checker.check_function(proto, onnx.checker.C.CheckerContext())


def test_rejects_opsets_without_the_operator():
    with pytest.raises(ValueError):
        function_proto("quantizelinear", 10)
    with pytest.raises(ValueError):
        function_proto("quantizelinear", MAX_OPSET + 1)


def _check_against_kernel(x: np.ndarray, opset: int, variant: str, mode: str = "inline") -> None:
    want = run_cached(x)  # ORT's own kernel
    got = run_cached(x, opset, variant, mode)
    assert_outputs_bits_equal(got, want)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", dql_pass.MODES)
def test_catalogue_matches_ort_kernel(opset, variant, mode):
    # ±inf included for the arithmetic variant too: its NaN quotients go through Clip and Cast,
    # which ONNX leaves open for NaN, and ORT's CPU lands them on the kernel's 0 (README).
    for case in cases():
        _check_against_kernel(case.x, opset, variant, mode)


@pytest.mark.parametrize("test", onnx_node_tests(), ids=lambda t: t.name)
@pytest.mark.parametrize("variant", VARIANTS)
def test_onnx_conformance_on_ort_and_onnx_reference(test, variant):
    (x,), expected = test.data_sets[0]
    expanded = dql_pass.expand(test.model, variant=variant)[0]
    assert not [n for n in expanded.graph.node if n.op_type == "DynamicQuantizeLinear"]
    assert_outputs_bits_equal(session(expanded).run({"x": x}), expected)
    assert_outputs_bits_equal(onnx.reference.ReferenceEvaluator(expanded).run(None, {"x": x}), expected)


def _finite_inputs():
    """Random shapes (rank 0 to 4) and magnitudes, with exact ties mixed in half of the time."""
    shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
    exponent = st.integers(-30, 30)
    mantissa = st.floats(-1, 1, width=32)

    @st.composite
    def build(draw):
        shape = draw(shapes)
        scale = F(10.0) ** F(draw(exponent)) if draw(st.booleans()) else F(1)
        x = draw(hnp.arrays(F, shape, elements=mantissa)) * scale
        if x.size and draw(st.booleans()):
            # Put exact .5 ties of x/scale in: k + 0.5 under the scale the input will get.
            lo, hi = min(F(0), x.min()), max(F(0), x.max())
            s = F(hi - lo) / F(255)
            if s > 0 and np.isfinite(s):
                k = draw(hnp.arrays(np.int32, x.shape, elements=st.integers(-255, 255)))
                ties = (k.astype(F) + F(0.5)) * s
                x = np.where((ties >= lo) & (ties <= hi) & draw(hnp.arrays(np.bool_, x.shape)), ties, x)
        return np.asarray(x, F)

    return build()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("opset", OPSETS)
@settings(max_examples=60, deadline=None)
@given(x=_finite_inputs())
def test_property_expanded_equals_kernel(variant, opset, x):
    _check_against_kernel(x, opset, variant)


@pytest.mark.skipif(MAX_OPSET <= newest_ort_opset(), reason="ORT runs every opset onnx knows")
@pytest.mark.parametrize("variant", VARIANTS)
@settings(max_examples=40, deadline=None)
@given(x=_finite_inputs())
def test_property_newer_opsets_on_onnx_reference(variant, x):
    # ORT cannot run these opsets yet; onnx.reference can, and agrees on every finite non-zero range.
    expected = dynamic_quantize_linear(x)
    # onnx.reference differs by design on a zero range, and sends x/0 = +inf to 0.
    assume(x.size and np.any(x) and 0 < expected[1] < np.inf)
    for opset in range(newest_ort_opset() + 1, MAX_OPSET + 1):
        model = dql_pass.expand(dql_model(opset, x.ndim), variant=variant, runtime="reference")[0]
        got = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})
        assert_outputs_bits_equal(got, expected)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_million_elements_match_the_kernel(variant):
    # Large enough for every vectorized loop and thread split of ORT's kernels.
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((1024, 1024)) * 3).astype(F)
    scale = dynamic_quantize_linear(x)[1]
    ties = (rng.integers(-200, 200, 4096).astype(F) + F(0.5)) * scale
    x.flat[rng.choice(x.size, ties.size, replace=False)] = np.clip(ties, x.min(), x.max())
    _check_against_kernel(x, 13, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("zero_range", dql_pass.ZERO_RANGE_POLICIES)
def test_the_shipped_bodies_are_what_the_onnxscript_functions_build(variant, zero_range):
    # If this fails after a change to dql_pass/onnxscript_bodies.py: python -m tools.make_bodies
    assert decomposition.body_path(variant, zero_range).read_bytes() == decomposition.build_body(variant, zero_range)


def test_expanding_imports_neither_onnxscript_nor_a_runtime():
    # Listing the targets and expanding for one reads the adapters' data, never their runtime.
    code = ("import sys, dql_pass; from dql_pass import runtimes; "
            "[dql_pass.expand(dql_pass.op.one_node_model(['n'], 13), target=name) for name in runtimes.RUNTIMES]; "
            "print(' '.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    # A runtime's module is what its adapter imports ("iree.runtime", "onnx.reference"), with its
    # submodules; the browser's adapter imports nothing of a runtime's (Chromium is a process).
    avoided = ["onnxscript"] + [runtime.module for runtime in runtimes.RUNTIMES.values()
                                if not runtime.module.startswith("dql_pass.")]
    assert [name for name in loaded if any(name == m or name.startswith(f"{m}.") for m in avoided)] == []
