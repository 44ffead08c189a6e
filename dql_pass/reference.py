"""NumPy reference for DynamicQuantizeLinear, bit-exact with ONNX Runtime's CPU kernel.

It follows ``docs/SEMANTICS.md``:

1. ``lo = min(0, min(x))`` and ``hi = max(0, max(x))``.
2. ``scale = (hi - lo) / 255``, a float32 division; a zero range (all ±0, or empty) gives the
   policy's scale instead of 0/0.
3. ``zp = round_half_even(clamp(0 - lo / scale, 0, 255))``; a NaN zero point saturates to 255.
4. ``y = clamp(round_half_even(x / scale) + zp, 0, 255)``; a NaN quotient gives 0.
"""

from __future__ import annotations

__all__ = ["ZERO_RANGE_POLICIES", "dynamic_quantize_linear", "zero_range_scale"]

import numpy as np

from dql_pass.op import ZERO_RANGE_POLICIES, check_choice


def zero_range_scale(policy: str = "onnxruntime") -> np.float32:
    """The scale a zero range gets: ORT's kernel says 1.0, ``onnx.reference`` says 1/255."""
    if check_choice("zero-range policy", policy) == "onnxruntime":
        return np.float32(1)
    return np.float32(1) / np.float32(255)


def dynamic_quantize_linear(
    x: np.ndarray, zero_range: str = "onnxruntime"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(y, y_scale, y_zero_point)`` for float32 ``x`` of any shape, rank 0 and empty included."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"DynamicQuantizeLinear takes float32, got {x.dtype}")
    zero, qmax = np.float32(0), np.float32(255)
    with np.errstate(all="ignore"):
        # np.minimum/np.maximum keep a NaN, as onnx.reference does (NaN is outside the contract).
        lo = np.minimum(zero, x.min()) if x.size else zero
        hi = np.maximum(zero, x.max()) if x.size else zero
        value_range = np.float32(hi - lo)
        scale = zero_range_scale(zero_range) if value_range == 0 else np.float32(value_range / qmax)
        zp_float = np.float32(zero - lo / scale)
        # `not zp < qmax` is True for NaN as well: ORT saturates a NaN zero point to 255.
        zp = np.float32(np.round(zp_float)) if zp_float < qmax else qmax
        quotient = np.round(x / scale)
        y = np.clip(np.nan_to_num(quotient + zp, nan=0.0), 0, qmax)
    return np.asarray(y).astype(np.uint8), np.array(scale, np.float32), np.array(zp, np.uint8)
