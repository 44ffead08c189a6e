"""NumPy references: DynamicQuantizeLinear, bit-exact with ONNX Runtime's CPU kernel, and the
integer ops that ``quantize_dynamic`` puts around it, computed exactly.

It follows ``docs/SEMANTICS.md``:

1. ``lo = min(0, min(x))`` and ``hi = max(0, max(x))``.
2. ``scale = (hi - lo) / 255``, a float32 division; a zero range (all ±0, or empty) gives the
   policy's scale instead of 0/0.
3. ``zp = round_half_even(clamp(0 - lo / scale, 0, 255))``; a NaN zero point saturates to 255.
4. ``y = clamp(round_half_even(x / scale) + zp, 0, 255)``; a NaN quotient gives 0.

The integer ops follow their ONNX pages, as ORT's CPU kernels compute them:

- MatMulInteger: ``(a - a_zp) @ (b - b_zp)``; ``a_zp`` per tensor or per row, ``b_zp`` per tensor
  or per column; exact sums (in float64 where no partial sum can pass 2^53, else int64) cast to
  int32. (ORT's u8s8 kernels saturate on x86 without VNNI,
  ORT PR #12088; this is the exact result.)
- ConvInteger: the convolution of ``x - x_zp`` (padding adds zeros after the shift, as ORT pads
  with ``x_zp``) with ``w - w_zp``, ``w_zp`` per tensor or per output channel.
- QuantizeLinear: ``saturate(round_half_even(x / scale) + zp)``, a float32 division; NaN gives the
  type's minimum, as ORT's kernel does on x86.
- DequantizeLinear: ``float32(x - zp) * scale``, in the scale's type.

Per-axis scales and zero points lie along ``axis``; blocked ones (opset 21) cover ``block_size``
elements of ``axis`` each.
"""

from __future__ import annotations

__all__ = [
    "ZERO_RANGE_POLICIES", "centred", "conv_integer", "dequantize_linear", "dynamic_quantize_linear", "matmul_integer",
    "per_axis", "quantize_linear", "zero_range_scale",
]

import math

import numpy as np

from dql_pass.blocking import BLOCK_ELEMENTS
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
        # In place, in float32: round(x / scale) + zp, then NaN to 0 (fmax takes the number) and
        # clipped to [0, 255] (an infinity to its end), as np.clip(np.nan_to_num(...)) does.
        y = np.divide(x, scale, out=np.empty_like(x))
        np.round(y, out=y)
        y += zp
        np.fmin(np.fmax(y, zero, out=y), qmax, out=y)
    return y.astype(np.uint8), np.array(scale, np.float32), np.array(zp, np.uint8)


def centred(outputs: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``(y - y_zero_point, y_scale)`` in float32 from DynamicQuantizeLinear's outputs: what a site
    lower kept in float32 computes; integers in [-255, 255], exact."""
    y, scale, zero_point = outputs
    return y.astype(np.float32) - zero_point.astype(np.float32), scale


def per_axis(values: np.ndarray | None, rank: int, axis: int) -> np.ndarray:
    """A per-tensor or per-axis parameter, shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    values = np.asarray(0 if values is None else values)
    if values.size <= 1:
        return values.reshape(())
    return values.reshape([-1] + [1] * (rank - axis % rank - 1))


def matmul_integer(
    a: np.ndarray, b: np.ndarray, a_zero_point: np.ndarray | None = None, b_zero_point: np.ndarray | None = None
) -> np.ndarray:
    """MatMulInteger: int32 ``(a - a_zero_point) @ (b - b_zero_point)``, summed exactly."""
    terms = a.shape[-1]
    wide = _sum_type(a, b, terms)
    a_shifted = a.astype(wide) - per_axis(a_zero_point, max(a.ndim, 2), -2).astype(wide)  # per row of a
    b_point = np.asarray(0 if b_zero_point is None else b_zero_point).astype(wide)  # per column of b
    # B widened a block of its K rows at a time (whole, it would take 8 times its size); every
    # partial sum is exact, so their sum is too.
    step = max(1, BLOCK_ELEMENTS // max(b.size // max(terms, 1), 1))
    total = None
    for start in range(0, max(terms, 1), step):
        rows = slice(start, start + step)
        part = np.matmul(a_shifted[..., rows], (b[rows] if b.ndim == 1 else b[..., rows, :]).astype(wide) - b_point)
        total = part if total is None else total + part
    return total.astype(np.int64).astype(np.int32)


def _sum_type(a: np.ndarray, b: np.ndarray, terms: int) -> type:
    """float64 where no partial sum of ``terms`` products of the shifted ``a`` and ``b`` can pass
    2^53, whatever the order (BLAS sums them exactly, a hundred times faster), else int64."""
    # |v - zero_point| < 2^(8 * itemsize + 1) for each operand, so every product is below 2^bits and
    # any partial sum of ``terms`` of them below terms * 2^bits: an integer a float64 holds exactly.
    bits = 8 * (a.dtype.itemsize + b.dtype.itemsize) + 2
    return np.float64 if terms << bits <= 1 << 53 else np.int64


def conv_integer(
    x: np.ndarray,
    w: np.ndarray,
    x_zero_point: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    *,
    pads: tuple[int, ...] | None = None,
    strides: tuple[int, ...] | None = None,
    dilations: tuple[int, ...] | None = None,
    group: int = 1,
) -> np.ndarray:
    """ConvInteger on explicit ``pads`` (begins then ends): int32 sums of ``(x - x_zp) * (w - w_zp)``, exact in
    int64."""
    spatial = x.ndim - 2
    pads = pads or (0,) * 2 * spatial
    strides, dilations = strides or (1,) * spatial, dilations or (1,) * spatial
    wide = _sum_type(x, w, int(np.prod(w.shape[1:])))
    shifted = x.astype(wide) - np.asarray(0 if x_zero_point is None else x_zero_point).astype(wide)
    shifted = np.pad(shifted, [(0, 0), (0, 0), *zip(pads[:spatial], pads[spatial:])])  # zeros after the shift
    kernel = w.astype(wide) - per_axis(w_zero_point, w.ndim, 0).astype(wide)
    # Every window of the padded input, dilated, then strided: [N, C, *out, *kernel].
    extent = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], dilations)]
    windows = np.lib.stride_tricks.sliding_window_view(shifted, extent, axis=tuple(range(2, x.ndim)))
    windows = windows[(..., *(slice(None, None, d) for d in dilations))]
    windows = windows[(slice(None), slice(None), *(slice(None, None, s) for s in strides))]
    per_group = w.shape[0] // group
    outputs = [_correlate(windows[:, g * w.shape[1]:(g + 1) * w.shape[1]], kernel[g * per_group:(g + 1) * per_group])
               for g in range(group)]
    return np.concatenate(outputs, axis=1).astype(np.int64).astype(np.int32)


def _correlate(windows: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """``sum(windows[n, c, o..., k...] * kernel[m, c, k...])`` over c and k: [N, M, *out], in the
    type of both. The windows become the rows of a matrix multiplied by the kernel's (whole images
    at a time, or a slab of one image's first output axis, so that about a block of them is copied):
    in float64, where :func:`_sum_type` chose it because no partial sum can pass 2^53, one BLAS
    product exact in any order of its sums."""
    spatial = kernel.ndim - 2
    if not spatial:
        return windows @ kernel.T
    terms = kernel.reshape(kernel.shape[0], math.prod(kernel.shape[1:])).T  # [C * prod(k), M]; not -1: M may be 0
    out = windows.shape[2:2 + spatial]
    result = np.empty((windows.shape[0], kernel.shape[0], *out), kernel.dtype)
    per_row = terms.shape[0] * math.prod(out[1:])  # elements copied per position of the first output axis
    images = max(1, BLOCK_ELEMENTS // max(per_row * out[0], 1))
    step = out[0] if per_row * out[0] <= BLOCK_ELEMENTS else max(1, BLOCK_ELEMENTS // max(per_row, 1))
    order = (0, *range(2, spatial + 2), 1, *range(spatial + 2, 2 * spatial + 2))  # [n, o..., c, k...]
    for n in range(0, windows.shape[0], images):
        for start in range(0, out[0], step):
            slab = windows[n:n + images, :, start:start + step].transpose(order)
            rows = slab.reshape(math.prod(slab.shape[:spatial + 1]), terms.shape[0]) @ terms
            result[n:n + images, :, start:start + step] = np.moveaxis(
                rows.reshape(*slab.shape[:spatial + 1], -1), -1, 1)
    return result


def _expanded(values: np.ndarray | None, x: np.ndarray, axis: int, block_size: int) -> np.ndarray:
    """A scale or zero point shaped to broadcast over ``x``: per tensor, per ``axis``, or in blocks of
    ``block_size`` along ``axis`` (each value repeated over its block, the last block cut short)."""
    if not block_size or values is None:
        return per_axis(values, x.ndim, axis)
    axis %= x.ndim
    return np.repeat(np.asarray(values), block_size, axis=axis)[(slice(None),) * axis + (slice(0, x.shape[axis]),)]


def quantize_linear(
    x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None, *, axis: int = 1,
    dtype: np.dtype = np.uint8, block_size: int = 0, precision: np.dtype | None = None,
) -> np.ndarray:
    """QuantizeLinear: ``saturate(round_half_even(x / scale) + zero_point)``, in the zero point's type (else ``dtype``).

    The quotient is a float32 division rounded to ``precision`` (opset 23's attribute, whose default is the
    scale's type: a float16 quotient is rounded to float16 before it is rounded to an integer); ±inf saturates;
    NaN gives the type's minimum, as ORT's kernel does on x86 (the spec leaves it undefined for integer types).
    """
    dtype = np.dtype(dtype if zero_point is None else np.asarray(zero_point).dtype)
    info = np.iinfo(dtype)
    scale = np.asarray(scale)
    with np.errstate(all="ignore"):
        quotient = np.asarray(x, np.float32) / _expanded(scale, x, axis, block_size).astype(np.float32)
        quotient = quotient.astype(precision or np.float32)
        q = np.round(quotient.astype(np.float32)) + _expanded(zero_point, x, axis, block_size).astype(np.float32)
        return np.clip(np.nan_to_num(q, nan=info.min), info.min, info.max).astype(dtype)


def dequantize_linear(
    x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None = None, *, axis: int = 1, block_size: int = 0,
) -> np.ndarray:
    """DequantizeLinear: ``float32(x - zero_point) * scale`` in the scale's type, the difference exact in int64
    (a zero point never wraps), the product rounded once (float32 products are exact for 8- and 16-bit ``x``)."""
    scale = np.asarray(scale)
    shifted = x.astype(np.int64) - _expanded(zero_point, x, axis, block_size).astype(np.int64)
    with np.errstate(over="ignore"):  # a product past the scale type's range is ±inf
        product = shifted.astype(np.float32) * _expanded(scale, x, axis, block_size).astype(np.float32)
        return product.astype(scale.dtype)
