"""The portable variant: every op has a WebGPU kernel, and it stays bit-exact where a GPU or a phone
runtime may compute otherwise than ORT's CPU: Div up to 3 ulp off, products fused into sums,
subnormals flushed, comparisons of float bits as int32.

The freedoms are emulated by tools.gpu_divider on onnx.reference; the same check fails for
quantizelinear and residual, so it can fail.
"""

from __future__ import annotations

import fractions

import numpy as np
import onnx
import pytest
from helpers import assert_bits_equal, assert_outputs_bits_equal, independent_inputs, session

import dql_pass
from dql_pass import decomposition
from dql_pass.inputs import cases, large_cases
from dql_pass.inputs import independent_inputs as built_apart
from dql_pass.decomposition import function_proto
from dql_pass.op import one_node_model
from dql_pass.reference import dynamic_quantize_linear
from tools import gpu_divider

F = np.float32
WORST = {"moves": 3}
FUSED = {"moves": 3, "fused": True}
FLUSHED = {"moves": 3, "fused": True, "flush": True}

# Ops the WebGPU execution provider of onnxruntime-web runs (docs/RUNTIME-FACTS.md), beside the
# shape ops whose inputs are constants.
WEBGPU_OPS = frozenset({
    "Abs", "Add", "Cast", "Clip", "Concat", "Div", "Floor", "Less", "Max", "Min", "Mul", "ReduceMax", "ReduceMin",
    "Reshape", "Sub", "Where",
})


def inputs() -> list[np.ndarray]:
    """The catalogue's comparable inputs, verify's large cases and the inputs built apart."""
    catalogue = [c for c in cases() if c.comparable]
    return [c.x for c in catalogue + large_cases()] + independent_inputs()


@pytest.fixture(scope="module")
def all_inputs() -> list[np.ndarray]:
    return inputs()


@pytest.mark.parametrize("freedoms", [WORST, FUSED, FLUSHED], ids=["div 3 ulp", "fused", "flushed"])
@pytest.mark.parametrize("zero_range", dql_pass.ZERO_RANGE_POLICIES)
def test_portable_is_exact_under_the_worst_case_gpu_divider(all_inputs, freedoms, zero_range):
    exact, wrong = gpu_divider.exact_inputs("portable", all_inputs, zero_range, **freedoms)
    assert wrong == []
    flushed_out = sum(map(gpu_divider.subnormal_input, all_inputs)) if freedoms.get("flush") else 0
    assert exact == len(all_inputs) - flushed_out


def test_portable_only_floors_its_element_quotients_so_far_worse_dividers_keep_it_exact(all_inputs):
    """Each quotient only feeds Floor, and the exact residual decides: a Div 4,096 ulp off (up to
    1/16 at |x / scale| near 255) changes nothing. The scale is never divided."""
    assert gpu_divider.exact_inputs("portable", all_inputs, moves=4096, fused=True)[1] == []


@pytest.mark.parametrize("freedoms", [FUSED, FLUSHED], ids=["fused", "flushed"])
def test_portable_is_exact_under_the_worst_case_gpu_divider_on_a_thousand_more_inputs_built_apart(freedoms):
    more = [x for _, x in built_apart(1050, seed=2027)]
    assert len(more) > 1000
    assert gpu_divider.exact_inputs("portable", more, **freedoms)[1] == []


@pytest.mark.parametrize("variant", ["quantizelinear", "residual"])
def test_the_same_check_fails_for_quantizelinear_and_residual(all_inputs, variant):
    """The check can fail: the variants that are exact on ORT's CPU are not under the worst divider."""
    # With an exact Div, only onnx.reference's QuantizeLinear with a scale of 0 is off (x / 0).
    _, wrong_exact = gpu_divider.exact_inputs(variant, all_inputs)
    assert all(dynamic_quantize_linear(all_inputs[i])[1] == 0 for i in wrong_exact)
    exact, wrong = gpu_divider.exact_inputs(variant, all_inputs, **WORST)
    assert set(wrong_exact) < set(wrong) and exact < len(all_inputs) * 0.9


def test_the_flush_leaves_out_only_subnormal_inputs(all_inputs):
    """What the flushed run leaves out is a known-difference class, and a small one (the inputs
    built apart aim at the bottom of the normal range on purpose, hence some 17%)."""
    left_out = [x for x in all_inputs if gpu_divider.subnormal_input(x)]
    assert 0 < len(left_out) < len(all_inputs) // 4
    tiny = F(2.0**-126)
    for x in left_out:
        scale = dynamic_quantize_linear(x)[1]
        assert np.any((x != 0) & (np.abs(x) < tiny)) or 0 < scale < tiny


def test_the_divider_moves_each_quotient_by_at_most_three_ulp_deterministically():
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(20000) * 10.0 ** rng.integers(-30, 30, 20000)).astype(F)
    b = np.abs(rng.standard_normal(20000) * 10.0 ** rng.integers(-30, 30, 20000)).astype(F)
    with np.errstate(all="ignore"):
        exact = a / b
    moved = gpu_divider.Div.__dict__["_run"](None, a, b, moves=3)[0]
    again = gpu_divider.Div.__dict__["_run"](None, a, b, moves=3)[0]
    assert np.array_equal(moved.view(np.uint32), again.view(np.uint32))
    finite = np.isfinite(exact)
    assert np.isfinite(moved[finite]).all()
    # The distance in ulp, counted on floats in order as integers.
    ordered = lambda v: np.where(v.view(np.int32) < 0, -(v.view(np.int32) & 0x7FFFFFFF),  # noqa: E731
                                 v.view(np.int32)).astype(np.int64)
    distance = ordered(moved[finite]) - ordered(exact[finite])
    assert set(np.unique(distance)) == set(range(-3, 4))


def test_the_fused_sum_is_rounded_once():
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(2000).astype(F) for _ in range(3))
    a[:5], b[:5], c[:5] = F(1 + 2.0**-12), F(1 - 2.0**-12), F(-1)  # a*b + c = -2^-24 exactly: lost when rounded twice
    fused = gpu_divider.Fused.__dict__["_run"](None, a, b, c, sign=1, negate_c=0)[0]
    exact = [F(fractions.Fraction(float(p)) * fractions.Fraction(float(q)) + fractions.Fraction(float(r)))
             for p, q, r in zip(a, b, c)]
    assert_bits_equal(fused, np.array(exact, F))  # -0.0 is not 0.0
    assert not np.array_equal(fused, a * b + c)


def test_the_freed_model_fuses_flushes_and_moves():
    model = dql_pass.expand(one_node_model([3], 21), variant="portable")[0]
    freed = gpu_divider.freed(model, moves=3, fused=True, flush=True)
    kinds = [n.op_type for n in freed.graph.node if n.domain == "gpu_divider"]
    assert kinds.count("Div") == 2 and kinds.count("Fused") > 10 and "Flush" in kinds
    assert not [n for n in freed.graph.node if n.op_type in ("Add", "Sub") and n.domain == ""
                and any(i in {m.output[0] for m in freed.graph.node if m.op_type == "Mul"} for i in n.input)]


def _producers(proto: onnx.FunctionProto) -> dict[str, onnx.NodeProto]:
    return {o: n for n in proto.node for o in n.output}


def _constant(node: onnx.NodeProto | None) -> np.ndarray | None:
    if node is None or node.op_type != "Constant":
        return None
    return onnx.numpy_helper.to_array(node.attribute[0].t)


@pytest.mark.parametrize("zero_range", dql_pass.ZERO_RANGE_POLICIES)
def test_every_op_has_a_webgpu_kernel_and_no_comparison_needs_float_order(zero_range):
    proto = function_proto("portable", zero_range=zero_range)
    producers = _producers(proto)
    computing = [n for n in proto.node if n.op_type != "Constant"]
    assert {n.op_type for n in computing} <= WEBGPU_OPS
    for node in computing:
        if node.op_type == "Cast":  # to uint8 only: no float64, no bool
            assert node.attribute[0].i == onnx.TensorProto.UINT8
        if node.op_type == "Div":  # never by a constant, which converters turn into a reciprocal
            assert _constant(producers.get(node.input[1])) is None
        if node.op_type in ("ReduceMin", "ReduceMax"):  # never an empty tensor
            assert producers[node.input[0]].op_type == "Concat"
        if node.op_type == "Less":
            # Right under an int32 compare of the bits (MNN), -0 included: +0 or a non-negative
            # value first (sign bit clear), or a positive constant second.
            first, second = (producers.get(i) for i in node.input)
            low, high = _constant(first), _constant(second)
            clear_first = (low is not None and not np.signbit(low)) or (first is not None and first.op_type == "Abs")
            assert clear_first or (high is not None and high > 0), node


def test_it_is_cheaper_than_residual():
    assert decomposition.variant("portable").nodes < decomposition.variant("residual").nodes


def test_portable_is_bit_exact_on_ort_on_the_inputs_built_apart(all_inputs):
    sessions = {}
    for x in all_inputs:
        if x.ndim not in sessions:
            model = dql_pass.expand(one_node_model([f"d{i}" for i in range(x.ndim)], 21), variant="portable")[0]
            sessions[x.ndim] = session(model)
        assert_outputs_bits_equal(sessions[x.ndim].run({"x": x}), dynamic_quantize_linear(x))
