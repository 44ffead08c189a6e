"""The family's cases as data: the edges the project knows, crossed with types, layouts and zero points.

Each builder returns :class:`Case` records for one op; :mod:`dql_pass.suites.family` writes them
at every opset of the op that allows them (``since``), with expected outputs from
:mod:`dql_pass.reference`. Where onnxruntime knowingly gives other outputs than the spec,
:mod:`dql_pass.suites.family_ort` says so and gives ORT's answer; the case carries both.
"""

from __future__ import annotations

__all__ = ["SIZES", "Case", "dequantize_linear_cases", "quantize_linear_cases"]

import dataclasses
import itertools
from collections.abc import Mapping

import numpy as np
import onnx

from dql_pass.lowering.rules import RULES

SIZES = ("small", "full")  # full: larger sweeps and tensors, for a runtime's author rather than CI


@dataclasses.dataclass(frozen=True)
class Case:
    """One model of one node: its inputs in the node's order (None: an optional input left out), which of
    them are constants (initializers, as in a QDQ model), its attributes and its expected outputs."""

    op: str
    name: str
    description: str
    since: int  # the first opset whose schema allows the case
    inputs: Mapping[str, np.ndarray | None]
    constants: frozenset[str]
    attributes: Mapping[str, object]
    expected: tuple[np.ndarray, ...]
    comparable: bool = True  # False: the spec leaves the outputs undefined, the model must only run
    until: int | None = None  # the last opset whose schema means these outputs


_RNG_SEED = 20261203
_INT = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int16": np.int16, "int32": np.int32}
_SINCE_TYPE = {"uint8": 10, "int8": 10, "int32": 10, "uint16": 21, "int16": 21}


def _zero_points(dtype: str) -> dict[str, int | None]:
    """No zero point, the type's lowest, its middle and its highest: the last two make a shift wrap in the type."""
    info = np.iinfo(_INT[dtype])
    return {"nozp": None, "zpmin": int(info.min), "zpmid": int((int(info.min) + int(info.max) + 1) // 2),
            "zpmax": int(info.max)}


# --- QuantizeLinear ------------------------------------------------------------------------------

# Values in units of the scale, so that each set means the same at every scale.
def _q_values(size: str) -> dict[str, np.ndarray]:
    n = 300 if size == "small" else 70000
    ties = np.arange(-n, n, dtype=np.float32) + np.float32(0.5)
    rng = np.random.default_rng(_RNG_SEED)
    return {
        "ties": ties,
        "below_ties": np.nextafter(ties, np.float32(-np.inf)),
        "above_ties": np.nextafter(ties, np.float32(np.inf)),
        "integers": np.arange(-n, n, dtype=np.float32),
        "random": (rng.standard_normal(257 if size == "small" else 1 << 20) * 150).astype(np.float32),
        "specials": np.array([0.0, -0.0, np.inf, -np.inf, 3.4e38, -3.4e38, 1e-45, -1e-45, 2.0**24 + 2, -(2.0**24) - 2,
                              0.5, -0.5, 1.5, -1.5, 2.5, -2.5], np.float32),
    }


_Q_SCALES = {"s1": 1.0, "s0_5": 0.5, "s0_1": 0.1, "s3": 3.0, "s1e_30": 1e-30}


def _quantize(name: str, since: int, x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, description: str,
              attributes: Mapping[str, object] | None = None, dtype: str = "uint8", comparable: bool = True,
              precision: type | None = None, until: int | None = None) -> Case:
    attributes = dict(attributes or {})
    if zp is None and dtype != "uint8":
        attributes["output_dtype"] = _onnx_type(dtype)
    if precision is not None:
        attributes["precision"] = _onnx_type(precision)
    y = RULES["QuantizeLinear"].expected([x, scale, zp], attributes)
    return Case("QuantizeLinear", name, description, since, {"x": x, "y_scale": scale, "y_zero_point": zp},
                frozenset({"y_scale", "y_zero_point"}), attributes, (y,), comparable, until)


def quantize_linear_cases(size: str = "small") -> list[Case]:
    cases = []
    values = _q_values(size)
    for dtype in ("uint8", "int8", "uint16", "int16"):
        for (zp_name, zp), (v_name, v), (s_name, s) in itertools.product(
                _zero_points(dtype).items(), values.items(), _Q_SCALES.items()):
            if zp is None and dtype != "uint8" and _SINCE_TYPE[dtype] < 21:
                zp = 0  # before output_dtype (21) only the zero point's type names int8
            since = max(_SINCE_TYPE[dtype], 21 if zp is None and dtype != "uint8" else 10)
            if dtype in ("uint16", "int16") and (s_name not in ("s1", "s0_1") or zp_name == "zpmin"):
                continue  # the 16-bit types: fewer crossings, the same edges
            scale = np.array(s, np.float32)
            with np.errstate(over="ignore"):  # 3.4e38 times 3 is inf, an edge of its own
                x = (v * scale).astype(np.float32)
            cases.append(_quantize(
                f"{dtype}_{zp_name}_{v_name}_{s_name}", since, x, scale, _zp(zp, dtype),
                f"per-tensor {dtype} quantization of {v_name} (in units of the scale {s}), zero point {zp}",
                dtype=dtype))
    cases += _quantize_shapes(values)
    return cases


def _zp(value: int | None, dtype: str, shape: tuple[int, ...] = ()) -> np.ndarray | None:
    return None if value is None else np.full(shape, value, _INT[dtype])


def _onnx_type(dtype: str | type) -> int:
    return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(_INT.get(dtype, dtype))))


def _quantize_shapes(values: Mapping[str, np.ndarray]) -> list[Case]:
    """Rank 0, empty, per-axis (13), float16 (19), blocked (21) and NaN (unspecified for integers)."""
    rng = np.random.default_rng(_RNG_SEED + 1)
    grid = (rng.standard_normal((3, 4, 10)) * 100).astype(np.float32)
    grid[0, 0, :4] = [0.5, 1.5, -0.5, np.inf]
    cases = [
        _quantize("rank0", 10, np.array(2.5, np.float32), np.array(1, np.float32), np.array(128, np.uint8),
                  "rank-0 x, a tie"),
        _quantize("rank0_int8", 10, np.array(-3.5, np.float32), np.array(1, np.float32), np.array(0, np.int8),
                  "rank-0 x, a tie"),
        _quantize("empty", 10, np.zeros((0, 3), np.float32), np.array(1, np.float32), np.array(3, np.uint8),
                  "an empty x"),
        _quantize("nan_uint8", 10, np.array([np.nan, 1, -np.nan], np.float32), np.array(1, np.float32),
                  np.array(5, np.uint8), "NaN to uint8: the spec leaves it undefined", comparable=False),
        _quantize("nan_int8", 10, np.array([np.nan, 1, -np.nan], np.float32), np.array(1, np.float32),
                  np.array(5, np.int8), "NaN to int8: the spec leaves it undefined", dtype="int8", comparable=False),
    ]
    scales = np.array([0.5, 0.1, 3.0, 1e-30], np.float32)
    for axis in (0, 1, 2, -1):
        n = grid.shape[axis]
        scale = scales[np.arange(n) % 4]
        for dtype in ("uint8", "int8"):
            zp = np.array([_zero_points(dtype)[k] for k in ("zpmin", "zpmid", "zpmax")], _INT[dtype])[np.arange(n) % 3]
            cases.append(_quantize(f"per_axis{axis}_{dtype}".replace("-", "m"), 13, grid, scale, zp,
                                   f"per-axis scales and zero points along axis {axis}", {"axis": axis}, dtype))
    half = values["ties"][:200].astype(np.float16)
    for s_name, s in (("s1", 1.0), ("s0_5", 0.5), ("s0_1", 0.1)):
        for dtype in ("uint8", "int8"):
            # From opset 23 the division rounds to the precision attribute's type (float16 here, also the default);
            # before, the quotient is the exact one's.
            for since, until, precision in ((19, 22, None), (23, None, np.float16)):
                cases.append(_quantize(f"float16_{dtype}_{s_name}{'_precision16' if precision else ''}", since,
                                       (half * np.float16(s)).astype(np.float16), np.array(s, np.float16),
                                       _zp(_zero_points(dtype)["zpmid"], dtype), "float16 x and scale, ties",
                                       dtype=dtype, precision=precision, until=until))
    for shape, axis, block in (((2, 12), 1, 4), ((2, 10), 1, 3), ((8, 3), 0, 2), ((7,), 0, 2), ((32,), 0, 32),
                               ((33,), 0, 16)):
        x = (rng.standard_normal(shape) * 200).astype(np.float32)
        blocks = list(shape)
        blocks[axis] = -(-shape[axis] // block)
        scale = rng.choice(scales[:3], blocks).astype(np.float32)
        for dtype in ("uint8", "int8"):
            zp = rng.integers(np.iinfo(_INT[dtype]).min, np.iinfo(_INT[dtype]).max, blocks,
                              endpoint=True).astype(_INT[dtype])
            cases.append(_quantize(f"blocked_{'x'.join(map(str, shape))}_axis{axis}_block{block}_{dtype}", 21, x, scale,
                                   zp, f"blocked scales: blocks of {block} along axis {axis}",
                                   {"axis": axis, "block_size": block}, dtype))
    return cases


# --- DequantizeLinear ----------------------------------------------------------------------------

def _d_scales(size: str) -> dict[str, float]:
    """Scales of every kind: exact powers of two, inexact decimals, 1/255, tiny and huge; 25 in the full size."""
    rng = np.random.default_rng(_RNG_SEED + 2)
    chosen = {"s1": 1.0, "s0_5": 0.5, "s0_1": 0.1, "s1_255": float(np.float32(1) / np.float32(255)),
              "s0_0123": 0.0123, "s3_3": 3.3, "s1e_38": 1e-38, "s1e30": 1e30}
    random = (rng.uniform(1e-4, 1, 25 - len(chosen) if size == "full" else 4)).astype(np.float32)
    return {**chosen, **{f"srandom{i}": float(s) for i, s in enumerate(random)}}


def _dequantize(name: str, since: int, x: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, description: str,
                attributes: Mapping[str, object] | None = None) -> Case:
    attributes = dict(attributes or {})
    y = RULES["DequantizeLinear"].expected([x, scale, zp], attributes)
    return Case("DequantizeLinear", name, description, since, {"x": x, "x_scale": scale, "x_zero_point": zp},
                frozenset({"x_scale", "x_zero_point"}), attributes, (y,))


def _every_value(dtype: str, size: str) -> np.ndarray:
    info = np.iinfo(_INT[dtype])
    if dtype == "int32":
        edges = [info.min, info.min + 1, -(2**24) - 1, -(2**24), -1, 0, 1, 2**24, 2**24 + 1, 2**24 + 3, info.max - 1,
                 info.max]
        return np.array(edges, np.int32)
    if info.bits == 16 and size == "small":
        return np.concatenate([np.arange(info.min, info.min + 300), np.arange(-300, 300),
                               np.arange(info.max - 299, info.max + 1)]).astype(_INT[dtype])
    return np.arange(info.min, int(info.max) + 1).astype(_INT[dtype])


def dequantize_linear_cases(size: str = "small") -> list[Case]:
    cases = []
    scales = _d_scales(size)
    for dtype in ("uint8", "int8", "int32", "uint16", "int16"):
        x = _every_value(dtype, size)
        zps = {"nozp": None, "zp0": 0} if dtype == "int32" else _zero_points(dtype)
        for (zp_name, zp), (s_name, s) in itertools.product(zps.items(), scales.items()):
            if dtype in ("uint16", "int16", "int32") and not (
                    s_name in ("s0_1", "s1_255", "s1e30") or s_name == "srandom0"):
                continue
            cases.append(_dequantize(f"{dtype}_{zp_name}_{s_name}", _SINCE_TYPE[dtype], x, np.array(s, np.float32),
                                     _zp(zp, dtype),
                                     f"every {dtype} value (or its edges), per-tensor scale {s}, zero point {zp}"))
    return cases + _dequantize_shapes(scales)


def _dequantize_shapes(scales: Mapping[str, float]) -> list[Case]:
    """Rank 0, empty, per-axis grids (13), float16 scales and outputs (19), blocked scales (21)."""
    rng = np.random.default_rng(_RNG_SEED + 3)
    grid_scales = np.array(list(scales.values()), np.float32)
    cases = [
        _dequantize("rank0", 10, np.array(7, np.uint8), np.array(0.1, np.float32), np.array(255, np.uint8),
                    "rank-0 x, wrapping zero point"),
        _dequantize("empty", 10, np.zeros((0, 4), np.int8), np.array(0.1, np.float32), np.array(-3, np.int8),
                    "an empty x"),
    ]
    for dtype in ("uint8", "int8"):
        values = _every_value(dtype, "small")
        for axis, rows in ((0, len(grid_scales)), (1, 16), (-1, 16)):
            # Every value under every scale: rows (or columns) of one scale and zero point each.
            grid = np.tile(values, (rows, 1)) if axis == 0 else np.tile(values[:, None], (1, rows))
            scale = grid_scales[np.arange(rows) % len(grid_scales)]
            zp = rng.integers(np.iinfo(_INT[dtype]).min, np.iinfo(_INT[dtype]).max, rows,
                              endpoint=True).astype(_INT[dtype])
            cases.append(_dequantize(f"per_axis{axis}_every_{dtype}".replace("-", "m"), 13, grid, scale, zp,
                                     f"every {dtype} value under {rows} scales and zero points along axis {axis}",
                                     {"axis": axis}))
        for s_name, s in (("s1", 1.0), ("s0_1", 0.1), ("s1e_3", 0.001), ("s65504", 65504.0), ("s6e_8", 6e-8)):
            cases.append(_dequantize(f"float16_{dtype}_{s_name}", 19, values, np.array(s, np.float16),
                                     _zp(_zero_points(dtype)["zpmid"], dtype),
                                     "a float16 scale: float16 outputs, overflow to inf"))
        for shape, axis, block in (((64,), 0, 2), ((64,), 0, 16), ((64,), 0, 32), ((33,), 0, 8), ((256,), 0, 64),
                                   ((4, 64), 1, 16), ((4, 33), 1, 8), ((64, 4), 0, 32)):
            x = rng.integers(np.iinfo(_INT[dtype]).min, np.iinfo(_INT[dtype]).max, shape,
                             endpoint=True).astype(_INT[dtype])
            blocks = list(shape)
            blocks[axis] = -(-shape[axis] // block)
            scale = rng.choice(grid_scales[:6], blocks).astype(np.float32)
            for zp_name in ("nozp", "zp"):
                zp = None if zp_name == "nozp" else rng.integers(
                    np.iinfo(_INT[dtype]).min, np.iinfo(_INT[dtype]).max, blocks, endpoint=True).astype(_INT[dtype])
                cases.append(_dequantize(f"blocked_{'x'.join(map(str, shape))}_axis{axis}_block{block}_{dtype}"
                                         f"_{zp_name}", 21, x, scale, zp,
                                         f"blocked scales: blocks of {block} along axis {axis}",
                                         {"axis": axis, "block_size": block}))
    return cases
