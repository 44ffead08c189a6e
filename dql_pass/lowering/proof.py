"""The exactness proof of an integer matrix product or convolution computed in float32.

Rules:

- Each term of the reduction is ``(a - a_zp) * (w - w_zp)``, an integer. A float32 sum of integers
  is exact while every partial sum stays at most 2^24 in magnitude, whatever the order of the
  additions; kernels add in blocks, in any order, so only a bound that holds for every order counts:
  the sum of the terms' magnitudes, ``Σ span_a · |w - w_zp|`` per output column or channel.
- ``span_a`` is the largest ``|a - a_zp|`` the activation's type and zero point allow: 255 when
  the zero point comes at run time (from DynamicQuantizeLinear), less for a known one.
- Constant weights give the bound from their actual values; other weights get their type's worst
  case, ``span_a · span_w`` per term.
- When the whole reduction's bound exceeds 2^24, it is cut, in order, into the fewest consecutive
  chunks whose bounds each hold; each chunk is one exact float32 product, and the chunks are added
  in int32, which is exact.
"""

from __future__ import annotations

__all__ = ["LIMIT", "Proof", "plan", "span"]

import dataclasses

import numpy as np

LIMIT = 1 << 24  # every integer of at most this magnitude is a float32


@dataclasses.dataclass(frozen=True)
class Proof:
    """Why a lowered product is exact: the bound of the whole reduction, and the chunks it is cut into."""

    bound: int  # the largest per-output bound over the whole reduction
    chunks: tuple[tuple[int, int], ...]  # [start, stop) ranges of the reduction axis
    weights: str  # "constant" (bound from the values) or "worst case of the types"

    def describe(self) -> str:
        if len(self.chunks) == 1:
            return f"single float32 (bound {self.bound:,} <= 2^24, {self.weights})"
        largest = max(stop - start for start, stop in self.chunks)
        return (f"chunked into {len(self.chunks)} float32 parts of at most {largest} summed in int32 "
                f"(bound {self.bound:,} > 2^24, {self.weights})")


def span(dtype: np.dtype, zero_point: np.ndarray | None, known: bool) -> int:
    """The largest ``|v - zero_point|`` for ``v`` of integer ``dtype``; ``known`` False: a zero point
    that comes at run time, anywhere in the type's range."""
    info = np.iinfo(dtype)
    if not known:
        return int(info.max) - int(info.min)
    points = np.zeros(1, np.int64) if zero_point is None else np.asarray(zero_point, np.int64).ravel()
    return int(max(np.abs(points - info.min).max(), np.abs(points - info.max).max()))


def plan(terms: np.ndarray, weights: str) -> Proof:
    """The proof for ``terms[k, o]``, the bound of the reduction's term ``k`` for output ``o``."""
    terms = np.asarray(terms, np.int64)
    total = int(terms.sum(axis=0).max(initial=0))
    if total <= LIMIT:
        return Proof(total, ((0, len(terms)),), weights)
    chunks, start, running = [], 0, np.zeros(terms.shape[1:], np.int64)
    for k, row in enumerate(terms):
        # A single term is at most 255 * 255 < 2^24, so every chunk holds at least one.
        if (running + row).max(initial=0) > LIMIT:
            chunks.append((start, k))
            start, running = k, np.zeros_like(running)
        running += row
    chunks.append((start, len(terms)))
    return Proof(total, tuple(chunks), weights)
