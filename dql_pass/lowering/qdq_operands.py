"""The operands the QuantizeLinear and DequantizeLinear rules are checked on, made from what ORIGINAL
says of the op (:class:`~dql_pass.lowering.operands.Site`), with its constant scale and zero point:

- QuantizeLinear: on every channel with its own scale and zero point, the ties of x / scale inside
  the type's range and a few past its ends, and the x near them where x * (1 / scale) rounds
  otherwise, packed into as many cases as the shape takes (any size, one element too); specials,
  random, zero;
- DequantizeLinear: every value of the type on every channel (a sample of 16-bit ones), the type's
  ends, random, zero;
- a constant x is what the replacement reads: it is checked on its stored value only; what no
  operands can be made for raises :class:`~dql_pass.lowering.operands.Unsynthesizable`.
"""

from __future__ import annotations

__all__ = ["dequantize_linear", "quantize_linear"]

import math
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir

from dql_pass.lowering.operands import Cases, Site, Unsynthesizable, integers, known_shape


def quantize_linear(site: Site, rng: np.random.Generator) -> Cases:
    return _quantization_cases(site, rng, dequantize=False)


def dequantize_linear(site: Site, rng: np.random.Generator) -> Cases:
    return _quantization_cases(site, rng, dequantize=True)


def _per_channel(shape: Sequence[int], axis: int, values: list[np.ndarray], dtype: np.dtype) -> list[np.ndarray]:
    """Arrays of ``shape`` whose elements on channel ``c`` of ``axis`` take ``values[c]`` in turn,
    as many arrays as the longest list needs (one list: every element is on its channel)."""
    size, longest = math.prod(shape), max(len(v) for v in values)
    if not size or not longest:
        return []
    moved = (shape[axis], *shape[:axis], *shape[axis + 1:]) if len(values) > 1 else (1, size)
    per = size // len(values)
    arrays = []
    for case in range(-(-longest // per)):
        taken = [v[(case * per + np.arange(per)) % len(v)] if len(v) else np.zeros(per) for v in values]
        array = np.stack(taken).astype(dtype).reshape(moved)
        arrays.append(np.moveaxis(array, 0, axis).reshape(shape) if len(values) > 1 else array.reshape(shape))
    return arrays


def _ties(scale: np.float32, halves: np.ndarray) -> np.ndarray:
    """Float32 ``x`` with ``x / scale`` exactly ``halves`` (a float32 division), where one is near
    ``halves * scale``."""
    near = (halves * np.float64(scale)).astype(np.float32)
    found, ties = np.zeros(near.shape, bool), near.copy()
    for ulps in (0, 1, -1, 2, -2):
        candidate = (near.view(np.int32) + ulps).view(np.float32)
        exact = ~found & (candidate / scale == halves.astype(np.float32))
        ties[exact], found = candidate[exact], found | exact
    return ties[found]


def _levels(low: int, high: int, rng: np.random.Generator) -> np.ndarray:
    """The integers from ``low`` to ``high``: every one in a small range, else both ends and a sample."""
    if high - low < 4096:
        return np.arange(low, high + 1)
    return np.unique(np.concatenate([np.arange(low, low + 256), np.arange(high - 255, high + 1),
                                     np.arange(-128, 128).clip(low, high), rng.integers(low, high + 1, 512)]))


def _quantization_cases(site: Site, rng: np.random.Generator, dequantize: bool) -> Cases:
    """QuantizeLinear and DequantizeLinear (``dequantize``): x, with ORIGINAL's constant scale and zero point."""
    scale = site.constants[1]
    if scale is None or (len(site.inputs) > 2 and site.inputs[2] is not None and site.constants[2] is None):
        raise Unsynthesizable("its scale or zero point is not constant in ORIGINAL")
    if site.attributes.get("block_size"):
        raise Unsynthesizable("blocked quantization (block_size) has no reference here")
    params = [scale, *site.constants[2:]]
    if site.constants[0] is not None:  # what the replacement reads, and all that matters
        yield "the stored constant", "constant", [site.constants[0], *params]
        return
    zero_point = site.constants[2] if len(site.constants) > 2 else None
    if dequantize:
        dtype = None if site.types[0] is None else site.types[0].numpy()
    elif site.types[0] != ir.DataType.FLOAT:
        raise Unsynthesizable(f"x is {'of unknown type' if site.types[0] is None else site.types[0].name.lower()}; "
                               "float32 operands are made")
    else:
        dtype = np.dtype(ir.DataType(site.attributes.get("output_dtype") or ir.DataType.UINT8).numpy()
                         if zero_point is None else zero_point.dtype)
    if dtype is None or not np.issubdtype(dtype, np.integer):
        raise Unsynthesizable(f"no operands are made for its {dtype or 'unknown'} values")
    info = np.iinfo(dtype)
    axis = int(site.attributes.get("axis", 1))
    per_axis = scale.size > 1
    shape = known_shape(site, 0,
                        lambda: (3, scale.size, 5) if per_axis and axis in (1, -2) else None if per_axis else (64,))
    if per_axis and (not shape or shape[axis % len(shape)] != scale.size):
        raise Unsynthesizable(f"its {scale.size} scales do not lie along axis {axis} of x {list(shape)}")
    axis = axis % len(shape) if shape else 0
    scales = scale.reshape(-1).astype(np.float32)
    if dequantize:
        for label, x in integers(site.types[0], shape, rng).items():
            yield label, label, [x(), *params]
        # Every value of the type on every channel (a sample of 16-bit ones): a folded or
        # reordered multiply differs on a few of them only.
        every = _levels(int(info.min), int(info.max), rng)
        for k, x in enumerate(_per_channel(shape, axis, [every] * scales.size, dtype)):
            yield f"every value {k}", "every value", [x, *params]
        return
    points = np.broadcast_to(np.asarray(0 if zero_point is None else zero_point, np.int64).reshape(-1), scales.shape)
    ties, reciprocal = [], []
    with np.errstate(all="ignore"):
        for s, z in zip(scales, points):
            # Each channel's own ties of x / scale inside its range (both neighbours representable)
            # and a few past each end; then where x * (1 / scale) rounds otherwise than x / scale.
            halves = np.concatenate([_levels(int(info.min) - z, int(info.max) - z - 1, rng),
                                     np.arange(-3, 0) + int(info.min) - z, int(info.max) - z + np.arange(3)]) + 0.5
            exact = _ties(s, halves)
            near = np.concatenate([(exact.view(np.int32) + ulps).view(np.float32) for ulps in (-2, -1, 0, 1, 2)])
            ties.append(exact)
            reciprocal.append(near[np.round(near / s) != np.round(near * (np.float32(1) / s))])
    for label, values in (("ties", ties), ("reciprocal", reciprocal)):
        for k, x in enumerate(_per_channel(shape, axis, values, np.float32)):
            yield f"{label} {k}", label, [x, *params]
    size = math.prod(shape)
    specials = np.array([0, -0.0, np.nan, np.inf, -np.inf, 1e30, -1e30, 1e-40], np.float32)
    for label, x in {"specials": np.resize(specials, size),
                     "random": rng.standard_normal(size).astype(np.float32) * 100,
                     "zero": np.zeros(size, np.float32)}.items():
        yield label, label, [x.astype(np.float32).reshape(shape), *params]
