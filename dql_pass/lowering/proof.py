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
  in int32, which is exact. Equal terms (the worst case) are planned in closed form, whatever the
  declared length; constant weights in one pass over their rows, in the weights' own small type.
- A reduction with a single term above 2^24, or one that needs more than :data:`MAX_CHUNKS`
  chunks, has no plan (:class:`Unplanned`).
"""

from __future__ import annotations

__all__ = ["LIMIT", "MAX_CHUNKS", "Proof", "Unplanned", "plan", "plan_uniform", "span"]

import dataclasses

import numpy as np

LIMIT = 1 << 24  # every integer of at most this magnitude is a float32
MAX_CHUNKS = 1024  # each chunk is a Slice, a product, a Cast and an Add: beyond this the graph is the problem


class Unplanned(ValueError):
    """No chunk plan proves the reduction exact (the message says why)."""


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


def plan(magnitudes: np.ndarray, scale: int, weights: str) -> Proof:
    """The proof for terms ``scale * magnitudes[k, o]``, the bound of the reduction's term ``k`` for
    output ``o``. ``magnitudes`` is read in its own (small integer) type, row by row, never widened whole."""
    total = int(magnitudes.sum(axis=0, dtype=np.int64).max(initial=0)) * scale
    if total <= LIMIT:
        return Proof(total, ((0, len(magnitudes)),), weights)
    largest = int(magnitudes.max(initial=0)) * scale
    if largest > LIMIT:
        raise Unplanned(f"a single term's bound {largest:,} exceeds 2^24")
    chunks, start, running = [], 0, np.zeros(magnitudes.shape[1:], np.int64)
    for k, row in enumerate(magnitudes):
        terms = row.astype(np.int64) * scale
        if (running + terms).max(initial=0) > LIMIT:
            chunks.append((start, k))
            start, running = k, np.zeros_like(running)
            if len(chunks) == MAX_CHUNKS:  # and at least one more to come
                raise Unplanned(f"the bound {total:,} needs more than {MAX_CHUNKS:,} float32 parts")
        running += terms
    chunks.append((start, len(magnitudes)))
    return Proof(total, tuple(chunks), weights)


def plan_uniform(depth: int, term: int, weights: str) -> Proof:
    """The proof for ``depth`` terms of bound ``term`` each (the worst case of the types), in closed form."""
    total = depth * term
    if total <= LIMIT:
        return Proof(total, ((0, depth),), weights)
    if term > LIMIT:
        raise Unplanned(f"a single term's bound {term:,} exceeds 2^24")
    size = LIMIT // term
    count = -(-depth // size)
    if count > MAX_CHUNKS:
        raise Unplanned(f"the bound {total:,} needs {count:,} float32 parts, more than {MAX_CHUNKS:,}")
    return Proof(total, tuple((start, min(start + size, depth)) for start in range(0, depth, size)), weights)
