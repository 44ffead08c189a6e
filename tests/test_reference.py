"""The NumPy reference against SEMANTICS.md, ONNX's conformance tests and ORT's kernel."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_bits_equal, assert_outputs_bits_equal, onnx_node_tests, run_cached

from dql_pass.inputs import cases
from dql_pass import reference
from dql_pass.reference import conv_integer, dynamic_quantize_linear

F = np.float32
INF = np.inf

# SEMANTICS.md's table of known values (ORT kernel): x, y, y_scale as an exact float32 expression, zp.
SEMANTICS_ROWS = [
    ([0, 2, -3, -2.5, 1.34, 0.5], [153, 255, 0, 26, 221, 179], F(5) / F(255), 153),
    ([-1, -2.1, -1.3, -2.5, -3.34, -4], [191, 121, 172, 96, 42, 0], F(4) / F(255), 255),
    ([0, 0, 0], [0, 0, 0], F(1), 0),
    ([-0.0], [0], F(1), 0),
    ([], [], F(1), 0),
    ([-127, 128, 0.5], [0, 255, 127], F(1), 127),
    ([5, INF], [0, 0], F(INF), 0),
    ([-INF, -5], [0, 255], F(INF), 255),
    ([INF, -INF, 1], [0, 0, 255], F(INF), 255),
    ([0, 1, -INF, -1], [255, 255, 0, 255], F(INF), 255),
    ([3e38, -3e38], [0, 0], F(INF), 0),
    ([1e-45], [255], F(0), 255),
    ([-1e-45, 1e-45], [0, 255], F(0), 255),
    ([1e-38, 2e-38], [128, 255], F(2e-38) / F(255), 0),
    ([0.5, 1e-45], [255, 0], F(0.5) / F(255), 0),
    (3.0, 255, F(3) / F(255), 0),
]


@pytest.mark.parametrize("x, y, scale, zp", SEMANTICS_ROWS, ids=range(len(SEMANTICS_ROWS)))
def test_semantics_table(x, y, scale, zp):
    got = dynamic_quantize_linear(np.array(x, F))
    assert_bits_equal(got[0], np.array(y, np.uint8))
    assert_bits_equal(got[1], np.array(scale, F))
    assert_bits_equal(got[2], np.array(zp, np.uint8))


def test_semantics_table_subnormal_scale_is_subnormal():
    scale = dynamic_quantize_linear(np.array([1e-38, 2e-38], F))[1]
    assert 0 < scale < np.finfo(F).tiny


@pytest.mark.parametrize("x", [[0, 0], [-0.0, 0.0], []])
def test_onnx_reference_policy_gives_one_over_255(x):
    y, scale, zp = dynamic_quantize_linear(np.array(x, F), zero_range="onnx-reference")
    assert_bits_equal(scale, np.array(F(1) / F(255)))
    assert zp == 0 and not y.any()


def test_rejects_other_dtypes_and_policies():
    with pytest.raises(TypeError):
        dynamic_quantize_linear(np.zeros(3, np.float64))
    with pytest.raises(ValueError):
        dynamic_quantize_linear(np.zeros(3, F), zero_range="zero")


def test_nan_gives_what_onnx_reference_gives():
    # Outside the contract; the reference follows onnx.reference: NaN scale, zero point 255, y 0.
    y, scale, zp = dynamic_quantize_linear(np.array([1.0, np.nan, -2.0], F))
    assert np.isnan(scale) and scale.dtype == F
    assert_bits_equal(zp, np.array(255, np.uint8))
    assert_bits_equal(y, np.zeros(3, np.uint8))


@pytest.mark.parametrize("test", onnx_node_tests(), ids=lambda t: t.name)
def test_onnx_conformance_cases(test):
    x, expected = test.data_sets[0]
    assert_outputs_bits_equal(dynamic_quantize_linear(x[0]), expected)


def test_matches_ort_kernel_on_the_whole_catalogue():
    for case in cases(random_count=40):
        got = dynamic_quantize_linear(case.x)
        want = run_cached(case.x)
        assert_outputs_bits_equal(got, want)


def _conv_by_offsets(x, w, x_zero_point, w_zero_point, pads, strides, dilations, group):
    """ConvInteger summed one kernel offset at a time in int64: another way to the same sums."""
    shifted = np.pad(x.astype(np.int64) - int(x_zero_point), [(0, 0), (0, 0), *zip(pads[:2], pads[2:])])
    kernel = w.astype(np.int64) - w_zero_point.astype(np.int64).reshape(-1, 1, 1, 1)
    out = [(shifted.shape[2 + a] - (w.shape[2 + a] - 1) * dilations[a] - 1) // strides[a] + 1 for a in range(2)]
    y = np.zeros((x.shape[0], w.shape[0], *out), np.int64)
    channels, per_group = w.shape[1], w.shape[0] // group
    for g in range(group):
        for i in range(w.shape[2]):
            for j in range(w.shape[3]):
                rows = slice(i * dilations[0], i * dilations[0] + (out[0] - 1) * strides[0] + 1, strides[0])
                columns = slice(j * dilations[1], j * dilations[1] + (out[1] - 1) * strides[1] + 1, strides[1])
                patch = shifted[:, g * channels:(g + 1) * channels, rows, columns]
                y[:, g * per_group:(g + 1) * per_group] += np.einsum(
                    "ncij,mc->nmij", patch, kernel[g * per_group:(g + 1) * per_group, :, i, j])
    return y.astype(np.int32)


@pytest.mark.parametrize("x_shape, w_shape, pads, strides, dilations, group", [
    ((1, 16, 100, 100), (8, 16, 3, 3), (1, 1, 1, 1), (1, 1), (1, 1), 1),  # windows past a block: several slabs
    ((5, 4, 9, 7), (6, 2, 3, 2), (2, 0, 1, 1), (2, 1), (2, 3), 2),  # several images a slab, groups, dilations
    ((5, 8, 64, 64), (4, 8, 3, 3), (1, 1, 1, 1), (1, 1), (1, 1), 1),  # 3 images a slab: the last slab holds 2
])
@pytest.mark.parametrize("summed_in", ["float64", "int64"])  # float64 where no sum can pass 2^53, as chosen
def test_conv_integer_is_exact_slab_by_slab(x_shape, w_shape, pads, strides, dilations, group, summed_in, monkeypatch):
    if summed_in == "int64":  # the type chosen for sums that could pass 2^53, forced on these
        monkeypatch.setattr(reference, "_sum_type", lambda *_: np.int64)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, x_shape).astype(np.uint8)
    w = rng.integers(-128, 128, w_shape).astype(np.int8)
    x_zero_point, w_zero_point = np.uint8(131), rng.integers(-128, 128, w_shape[0]).astype(np.int8)
    expected = _conv_by_offsets(x, w, x_zero_point, w_zero_point, pads, strides, dilations, group)
    got = conv_integer(x, w, x_zero_point, w_zero_point, pads=pads, strides=strides, dilations=dilations, group=group)
    assert_bits_equal(got, expected)
