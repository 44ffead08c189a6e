"""MatMulInteger and ConvInteger cases as data: shapes, type pairs, zero points and the sums' bounds.

The edges: K = 0, 1-D A and B, broadcast batches, zero points per tensor, per row of A, per column
of B and per output channel of W, zero points that wrap, sums past 2^24 (no longer exact in
float32) and past the int32 range (the spec's int32 accumulation wraps).
"""

from __future__ import annotations

__all__ = ["conv_integer_cases", "matmul_integer_cases"]

import itertools

import numpy as np

from dql_pass.lowering.rules import RULES
from dql_pass.suites.family_cases import Case

_SEED = 20261204
_TYPES = {"u8": np.uint8, "s8": np.int8}


def _values(rng: np.random.Generator, dtype: type, shape: tuple[int, ...], kind: str) -> np.ndarray:
    info = np.iinfo(dtype)
    if kind == "max":
        return np.full(shape, info.max, dtype)
    if kind == "min":
        return np.full(shape, info.min, dtype)
    return rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _matmul(
    name: str, a: np.ndarray, b: np.ndarray, a_zp: np.ndarray | None, b_zp: np.ndarray | None, description: str
) -> Case:
    y = RULES["MatMulInteger"].expected([a, b, a_zp, b_zp], {})
    return Case("MatMulInteger", name, description, 10, {"A": a, "B": b, "a_zero_point": a_zp, "b_zero_point": b_zp},
                frozenset({"B", "b_zero_point"}), {}, (y,))


# (A shape, B shape): K = 0, 1-D operands, broadcast batches.
_MATMUL_SHAPES = {
    "1x1x1": ((1, 1), (1, 1)), "2x3x4": ((2, 3), (3, 4)), "4x16x8": ((4, 16), (16, 8)), "k0": ((3, 0), (0, 5)),
    "a1d": ((6,), (6, 4)), "b1d": ((3, 6), (6,)), "batched": ((2, 3, 5), (5, 4)),
    "broadcast": ((2, 1, 3, 4), (5, 4, 2)),
}


def _matmul_zero_points(rng, a: np.ndarray, b: np.ndarray) -> dict[str, tuple]:
    m = a.shape[-2] if a.ndim > 1 else 1
    n = b.shape[-1] if b.ndim > 1 else 1
    row = _values(rng, a.dtype.type, (m,), "random") if a.ndim > 1 else None
    column = _values(rng, b.dtype.type, (n,), "random") if b.ndim > 1 else None
    found = {
        "nozp": (None, None),
        "zp_scalar": (_values(rng, a.dtype.type, (), "random"), _values(rng, b.dtype.type, (), "random")),
        "zp_wrap": (np.array(np.iinfo(a.dtype).max, a.dtype), np.array(np.iinfo(b.dtype).min, b.dtype)),
    }
    if row is not None and column is not None:
        found["zp_per_row_column"] = (row, column)
    return found


def matmul_integer_cases(size: str = "small") -> list[Case]:
    rng = np.random.default_rng(_SEED)
    cases = []
    for (a_t, b_t), (shape_name, (a_shape, b_shape)) in itertools.product(
            itertools.product(_TYPES, _TYPES), _MATMUL_SHAPES.items()):
        a = _values(rng, _TYPES[a_t], a_shape, "random")
        b = _values(rng, _TYPES[b_t], b_shape, "random")
        for zp_name, (a_zp, b_zp) in _matmul_zero_points(rng, a, b).items():
            cases.append(_matmul(f"{a_t}{b_t}_{shape_name}_{zp_name}", a, b, a_zp, b_zp,
                                 f"{a_t} A {list(a_shape)} times {b_t} B {list(b_shape)}, zero points {zp_name}"))
    # The bounds of the sums: every product the largest, K past 2^24 / 65025 and past 2^31 / 65025.
    for (a_t, b_t), k in itertools.product(itertools.product(_TYPES, _TYPES),
                                           (2, 64, 259, 33027 if size == "full" else 1100)):
        for kind in ("max", "min"):
            a = _values(rng, _TYPES[a_t], (2, k), kind)
            b = _values(rng, _TYPES[b_t], (k, 3), "max" if kind == "min" and b_t == "s8" else kind)
            a_zp = np.array(np.iinfo(a.dtype).min if kind == "max" else np.iinfo(a.dtype).max, a.dtype)
            b_zp = np.array(np.iinfo(b.dtype).min if kind == "max" else np.iinfo(b.dtype).max, b.dtype)
            for zp_name, zps in (("nozp", (None, None)), ("zp_far", (a_zp, b_zp))):
                cases.append(_matmul(f"{a_t}{b_t}_bound_k{k}_{kind}_{zp_name}", a, b, *zps,
                                     f"every product the extreme ({kind}) over K = {k}: sums past 2^24 or 2^31"))
    return cases


def _conv(name: str, x: np.ndarray, w: np.ndarray, x_zp: np.ndarray | None, w_zp: np.ndarray | None,
          attributes: dict, description: str) -> Case:
    y = RULES["ConvInteger"].expected([x, w, x_zp, w_zp], attributes)
    return Case("ConvInteger", name, description, 10, {"x": x, "w": w, "x_zero_point": x_zp, "w_zero_point": w_zp},
                frozenset({"w", "w_zero_point"}), attributes, (y,))


# (x shape, w shape, attributes)
_CONV_LAYOUTS = {
    "1d": ((1, 2, 9), (3, 2, 3), {}),
    "1d_pads_strides": ((2, 2, 9), (3, 2, 3), {"pads": [1, 2], "strides": [2]}),
    "2d": ((1, 3, 5, 5), (4, 3, 3, 3), {}),
    "2d_pads": ((1, 3, 5, 5), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    "2d_asymmetric_pads": ((1, 2, 6, 5), (2, 2, 3, 2), {"pads": [0, 1, 2, 0]}),
    "2d_strides_dilations": ((2, 2, 9, 9), (3, 2, 3, 3), {"strides": [2, 1], "dilations": [2, 2]}),
    "2d_group2": ((1, 4, 5, 5), (4, 2, 3, 3), {"group": 2}),
    "2d_depthwise": ((1, 3, 6, 6), (3, 1, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
    "2d_1x1": ((1, 8, 4, 4), (5, 8, 1, 1), {}),
    "3d": ((1, 2, 4, 5, 5), (2, 2, 2, 3, 3), {"pads": [1, 0, 1, 1, 0, 1]}),
}


def conv_integer_cases(size: str = "small") -> list[Case]:
    rng = np.random.default_rng(_SEED + 1)
    cases = []
    layouts = dict(_CONV_LAYOUTS)
    # Sums past 2^24: 259 channels of extreme products (past 2^31 in the full size).
    layouts["2d_wide_sum"] = ((1, 259 if size == "small" else 33027, 2, 2),
                              (1, 259 if size == "small" else 33027, 2, 1), {})
    for (x_t, w_t), (name, (x_shape, w_shape, attributes)) in itertools.product(
            itertools.product(_TYPES, _TYPES), layouts.items()):
        kind = "max" if name == "2d_wide_sum" else "random"
        x = _values(rng, _TYPES[x_t], x_shape, kind)
        w = _values(rng, _TYPES[w_t], w_shape, kind)
        zps = {
            "nozp": (None, None),
            "zp_scalar": (_values(rng, x.dtype.type, (), "random"), _values(rng, w.dtype.type, (), "random")),
            "zp_wrap": (np.array(np.iinfo(x.dtype).max, x.dtype), np.array(np.iinfo(w.dtype).min, w.dtype)),
            "zp_per_channel": (_values(rng, x.dtype.type, (), "random"),
                               _values(rng, w.dtype.type, (w_shape[0],), "random")),
        }
        for zp_name, (x_zp, w_zp) in zps.items():
            cases.append(_conv(f"{x_t}{w_t}_{name}_{zp_name}", x, w, x_zp, w_zp, attributes,
                               f"{x_t} x {list(x_shape)}, {w_t} w {list(w_shape)}, {attributes or 'no attributes'}, "
                               f"zero points {zp_name}"))
    return cases
