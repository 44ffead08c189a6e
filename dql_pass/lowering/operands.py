"""The operands each lowering rule is checked on: made from what ORIGINAL says of the op (its
inputs' names, the arrays of its constant inputs, the types and static shapes of the others, its
attributes), one generator per rule, which its record in :mod:`dql_pass.lowering.rules` names.

- products (MatMulInteger, ConvInteger, A of any rank, weights stored or synthesized): all zero,
  all at the type's maximum and minimum, zero points at both ends, random; rows (for ConvInteger,
  windows of the image that do not overlap) that drive output columns to both ends of their
  reachable sums; and for every column whose end is past 2^24, the sums nearest its ends that no
  float32 holds (one term moved off its end, in separate rows: the smallest such move, and the
  first and last term that can make one in every stride of the fewest consecutive terms a chunk
  past 2^24 holds): no order of float32 additions gives those, so a product that is not cut into
  exact chunks fails, wherever its inexact chunk lies;
- QuantizeLinear and DequantizeLinear: :mod:`dql_pass.lowering.qdq_operands`;
- a constant operand is what the replacement reads: it is checked on its stored value only;
- what no operands can be made for raises :class:`Unsynthesizable` with the reason.
"""

from __future__ import annotations

__all__ = ["Cases", "Site", "Unsynthesizable", "conv_integer", "integers", "known_shape", "matmul_integer", "same_pads"]

import hashlib
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

import numpy as np
import onnx_ir as ir

from dql_pass import reference
from dql_pass.blocking import BLOCK_ELEMENTS
from dql_pass.lowering.proof import LIMIT

Cases = Iterator[tuple[str, str, list[np.ndarray | None]]]  # name, class, one array per input (None: absent)


class Site(Protocol):
    """What the operands are made from: the op's input names (None: absent), the arrays of its
    constant inputs, the types and static shapes of the others, and its attributes."""

    @property
    def inputs(self) -> tuple[str | None, ...]: ...
    @property
    def constants(self) -> tuple[np.ndarray | None, ...]: ...
    @property
    def types(self) -> tuple[ir.DataType | None, ...]: ...
    @property
    def shapes(self) -> tuple[tuple[int, ...] | None, ...]: ...
    @property
    def attributes(self) -> Mapping[str, object]: ...


class Unsynthesizable(Exception):
    """Operands for the site cannot be made."""


def matmul_integer(site: Site, rng: np.random.Generator) -> Cases:
    return _product_cases(site, rng, conv=False)


def conv_integer(site: Site, rng: np.random.Generator) -> Cases:
    return _product_cases(site, rng, conv=True)


def integers(
    dtype: ir.DataType, shape: Sequence[int], rng: np.random.Generator
) -> dict[str, Callable[[], np.ndarray]]:
    """All zero, all at the type's ends, and random, each made when called: the random one is drawn
    now (the generator's order stays), the others are not held between cases."""
    np_type = dtype.numpy()
    info = np.iinfo(np_type)
    random = np.empty(math.prod(shape), np_type)
    for start in range(0, random.size, BLOCK_ELEMENTS):  # the same draws as one call, without its int64 array
        count = min(BLOCK_ELEMENTS, random.size - start)
        random[start:start + count] = rng.integers(info.min, int(info.max) + 1, count)
    random = random.reshape(shape)
    return {"zero": lambda: np.zeros(shape, np_type), "max": lambda: np.full(shape, info.max, np_type),
            "min": lambda: np.full(shape, info.min, np_type), "random": lambda: random}


def _zero_points(dtype: ir.DataType, rng: np.random.Generator) -> list[np.ndarray]:
    info = np.iinfo(dtype.numpy())
    return [np.array(v, dtype.numpy()) for v in (info.min, info.max, rng.integers(info.min, int(info.max) + 1))]


def known_shape(site: Site, index: int, fallback: Callable[[], tuple[int, ...] | None]) -> tuple[int, ...]:
    """The shape of input ``index``: its constant's, else its static one, else ``fallback``'s."""
    shape = site.shapes[index] if site.constants[index] is None else site.constants[index].shape
    shape = fallback() if shape is None else shape  # () is rank 0, known
    if shape is None:
        raise Unsynthesizable(f"the shape of {site.inputs[index]!r} is unknown")
    return shape


def _product_cases(site: Site, rng: np.random.Generator, conv: bool) -> Cases:
    """MatMulInteger and ConvInteger (``conv``): inputs (activation, weight, activation zero point,
    weight zero point)."""
    a_type, w_type = site.types[:2]
    if a_type is None or w_type is None:
        raise Unsynthesizable("an operand's type is unknown")
    weights = site.constants[1]
    if conv:
        w_shape = known_shape(site, 1, lambda: None)
        group = int(site.attributes.get("group", 1))
        side = [2 * k + 1 for k in w_shape[2:]]
        a_shape = known_shape(site, 0, lambda: (2, w_shape[1] * group, *side))
    else:
        per_row = site.constants[2] if len(site.constants) > 2 and site.constants[2] is not None else np.zeros(1)
        # A zero point per row: that many rows; else an odd number, where rows regrouped in pairs fail.
        rows = per_row.size if per_row.size > 1 else 3
        # B [K] or [..., K, N]: A takes its K.
        a_shape = known_shape(site, 0, lambda: None if site.shapes[1] is None and weights is None
                         else (rows, (weights.shape if weights is not None else site.shapes[1])[-2:][0]))
        w_shape = known_shape(site, 1, lambda: (a_shape[-1], 5))
    names, constants = [*site.inputs, None, None][:4], [*site.constants, None, None][:4]
    # A constant operand is what the replacement reads: it is checked on its stored value only.
    activations = ({"constant": lambda a=constants[0]: a} if constants[0] is not None
                   else integers(a_type, a_shape, rng))
    weight_sets = {"constant": lambda w=weights: w} if weights is not None else integers(w_type, w_shape, rng)

    def points(index: int, dtype: ir.DataType) -> list[np.ndarray | None]:
        """A zero point's values: absent, ORIGINAL's constant, or both ends of the type and a random one."""
        if names[index] is None or constants[index] is not None:
            return [constants[index]]
        return _zero_points(dtype, rng)

    a_points, w_points = points(2, a_type), points(3, w_type)
    count = max(len(activations), len(weight_sets))  # every set of each, the other's in turn
    for (a_class, a), (w_class, w) in zip(_cycle(activations, count), _cycle(weight_sets, count)):
        for k, a_zp in enumerate(a_points):
            w_zp = w_points[k % len(w_points)]
            operands = [a(), w(), a_zp, w_zp][: len(site.inputs)]
            yield f"{a_class} activations, zero point {a_zp}, {w_class} weights", a_class, operands
    activations = weight_sets = a = w = None  # not held while the driven cases run
    if constants[0] is not None and (conv or constants[1] is not None or constants[0].ndim > 2):
        return  # nothing to drive (a constant image against synthesized kernels is not driven)
    if weights is None:  # both ends of the type in turn, so every term is as large as the type allows, of either sign
        info = np.iinfo(w_type.numpy())
        size = math.prod(w_shape)  # np.resize would hold a reference per element
        weights = np.tile(np.array([info.max, info.min], w_type.numpy()), -(-size // 2))[:size].reshape(w_shape)
    for k, a_zp in enumerate(a_points):
        w_zp = w_points[k % len(w_points)]
        if constants[0] is not None:  # A stored, B synthesized: B's columns are driven by A's rows, as in B^T A^T
            fixed = np.atleast_2d(constants[0]).T
            for label, b in _driven(site, conv, fixed, a_zp, w_type, w_zp, (w_shape[-1], w_shape[0]), False):
                yield f"{label}, zero point {w_zp}", label, [constants[0], b.T, a_zp, w_zp][: len(site.inputs)]
            continue
        if not conv and weights.ndim > 2:
            span = int(np.iinfo(a_type.numpy()).max) - int(np.iinfo(a_type.numpy()).min)
            centred = np.abs(weights.astype(np.int64) - np.asarray(0 if w_zp is None else w_zp, np.int64))
            if span * centred.sum(axis=-2).max(initial=0) > LIMIT:
                raise Unsynthesizable("B has batch axes, for which no operands driving each column past 2^24 are made")
            continue
        free = site.shapes[0] is None  # A's shape is unknown: the cases take as many rows (or images) as they need
        for label, a in _driven(site, conv, weights, w_zp, a_type, a_zp, a_shape, free):
            yield f"{label}, zero point {a_zp}", label, [a, weights, a_zp, w_zp][: len(site.inputs)]


def _cycle(items: dict[str, Callable[[], np.ndarray]], count: int) -> list[tuple[str, Callable[[], np.ndarray]]]:
    pairs = list(items.items())
    return [pairs[i % len(pairs)] for i in range(count)]


Probe = tuple[int, int, bool] | None  # terms [start, stop), the last usable one (else the first); None: all


def _drive(
    terms: np.ndarray, lo: np.ndarray, hi: np.ndarray, sign: int, past: bool, probe: Probe = None
) -> np.ndarray | None:
    """Shifted activations, each in [lo, hi] (lo <= 0 <= hi), that drive ``sum(terms * v)`` to its
    reachable end of ``sign`` (1: the largest sum, -1: the smallest); ``past``: instead to the sum
    nearest that end, moving one term (the first or last usable one of ``probe``'s terms), that is
    past 2^24 and that no float32 holds (None: none is). No order of float32 additions gives such a
    sum; an unchunked product past the bound cannot."""
    toward = terms * sign
    v = np.where(toward > 0, hi, np.where(toward < 0, lo, 0))
    if not past:
        return v
    magnitude = int(sign * (terms * v).sum())
    start, stop, last = (0, terms.size, False) if probe is None else probe
    span = np.abs(terms[start:stop])
    sizes = np.unique(span[span != 0])
    if not sizes.size or magnitude <= LIMIT or not _float32_holds(np.array(magnitude)):
        return None  # nothing past the bound, or the end itself is such a sum (the bound case)
    steps = np.arange(1, int(hi - lo) + 1)
    removed = np.outer(sizes, steps)
    sums = magnitude - removed
    usable = (sums > LIMIT) & ~_float32_holds(sums)
    if not usable.any():
        return None
    if probe is None:  # the smallest move of any term
        size, step = np.unravel_index(np.where(usable, removed, removed.max() + 1).argmin(), removed.shape)
        k = np.flatnonzero(span == sizes[size])[0]
    else:  # the first (last) term that some move makes such a sum, by its smallest move
        candidates = np.flatnonzero(np.isin(span, sizes[usable.any(axis=1)]))
        k = candidates[-1 if last else 0]
        size = int(np.flatnonzero(sizes == span[k])[0])
        step = int(usable[size].argmax())
    k += start
    v[k] += -steps[step] if v[k] == hi else steps[step]
    return v


def _probes(terms: np.ndarray, widest: int) -> list[Probe]:
    """Where to move a term so that every chunk a lowering may cut whose float32 sum can pass 2^24
    holds one: such a chunk holds at least ``LIMIT // (largest term * widest) + 1`` consecutive terms,
    so it covers a stride of that many from one of its usable terms to that stride's first or last
    usable one. Besides the smallest move of all (None)."""
    largest = int(np.abs(terms).max(initial=0)) * widest
    if not largest or terms.shape[0] * largest <= LIMIT:
        return [None]
    stride = LIMIT // largest + 1
    starts = range(0, terms.shape[0], stride)
    return [None, *((start, start + stride, last) for start in starts for last in (False, True))]


def _float32_holds(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float32).astype(np.int64) == values


_ROWS = 256  # at most this many rows (windows) per case where A's shape is free: a case's cost grows with them


def _driven(site: Site, conv: bool, weights: np.ndarray, w_zp: np.ndarray | None, a_type: ir.DataType,
            a_zp: np.ndarray | None, a_shape: Sequence[int], free: bool) -> Iterator[tuple[str, np.ndarray]]:
    """Activations in which output columns (output channels, through a window of the image each)
    are driven to both ends of their reachable sums: in one case as far as its rows go ("bound"),
    and every column whose end is past 2^24 to the sums nearest its ends that no float32 holds
    ("past 2^24"), in as many cases as their rows take."""
    info = np.iinfo(a_type.numpy())
    if conv:
        centred = weights.astype(np.int64) - reference.per_axis(w_zp, weights.ndim, 0).astype(np.int64)
        per_group = centred.shape[0] // int(site.attributes.get("group", 1))
        columns = np.arange(centred.shape[0])
        terms = centred.reshape(centred.shape[0], math.prod(centred.shape[1:])).T
    else:
        centred = _centred(np.atleast_2d(weights.T).T, w_zp)
        columns = _distinct_columns(centred)  # equal columns are driven alike
        terms = centred
    zp = np.asarray(0 if a_zp is None else a_zp, np.int64).ravel()
    lo, hi = np.int64(info.min) - zp, np.int64(info.max) - zp
    # The ends of each column's reachable sums (with the widest range of a zero point per row).
    positive, negative = _signed_sums(terms)
    reach = {1: positive * hi.max() + negative * lo.min(), -1: -negative * hi.max() - positive * lo.min()}
    for label, past in (("bound", False), ("past 2^24", True)):
        widest = int(max(hi.max(), -lo.min()))
        jobs = [(int(c), sign, probe) for c in columns for sign in (1, -1) if not past or reach[sign][c] > LIMIT
                for probe in (_probes(terms[:, c].astype(np.int64), widest) if past else [None])]
        if not jobs:
            continue
        if not free:
            slots, shape = _windows(site, weights.shape, a_shape) if conv else (
                list(range(math.prod(a_shape[:-1]))), tuple(a_shape))
        elif conv:
            slots, shape = _windows(site, weights.shape, a_shape, min(len(jobs), _ROWS))
        else:  # rows, or with a zero point per row, that many rows as often as they take
            rows = min(len(jobs), _ROWS)
            shape = (rows, a_shape[-1]) if zp.size == 1 else (-(-rows // zp.size), zp.size, a_shape[-1])
            slots = list(range(math.prod(shape[:-1])))
        # Below 2^24 one float32 product is exact in any order: the bound takes one case.
        cases = -(-len(jobs) // len(slots)) if slots else 0
        for case in range(cases if past else min(cases, 1)):
            shifted, driven = np.zeros(shape, np.int64), False
            for s, slot in enumerate(slots):
                column, sign, probe = jobs[(case * len(slots) + s) % len(jobs)]
                row = 0 if conv else slot % zp.size  # a per-row zero point: that row's
                if conv:
                    n, image, kernel = slot
                    window = centred[column][np.ix_(range(centred.shape[1]), *kernel)]
                    v = _drive(window.ravel(), lo[row], hi[row], sign, past, probe)
                    if v is not None:
                        first = column // per_group * centred.shape[1]
                        channels = range(first, first + centred.shape[1])
                        shifted[n][np.ix_(channels, *image)] = v.reshape(window.shape)
                else:
                    v = _drive(centred[:, column].astype(np.int64), lo[row], hi[row], sign, past, probe)
                    if v is not None:
                        shifted.reshape(math.prod(shape[:-1]), shape[-1])[slot] = v  # not -1: K may be 0
                driven |= v is not None
            if driven:
                points = zp.reshape(-1, 1) if zp.size > 1 and not conv else zp[0]
                yield label, (shifted + points).astype(a_type.numpy())


def _centred(values: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    """``values - zero_point``, in int16 where both are 8-bit (any difference of two fits), else int64."""
    point = np.asarray(0 if zero_point is None else zero_point)
    narrow = values.dtype.itemsize == 1 and (zero_point is None or point.dtype.itemsize == 1)
    wide = np.int16 if narrow else np.int64
    return values.astype(wide) - point.astype(wide)


def _row_blocks(terms: np.ndarray) -> Iterator[np.ndarray]:
    """``terms`` [K, N] a block of rows at a time, in int64."""
    rows = max(1, BLOCK_ELEMENTS // max(terms.shape[1], 1))
    for start in range(0, terms.shape[0], rows):
        yield terms[start:start + rows].astype(np.int64)


def _distinct_columns(terms: np.ndarray) -> np.ndarray:
    """The first of each set of equal columns of ``terms`` [K, N], in order, told by a digest of
    each column's values (a dict of their bytes would hold a copy of the operand)."""
    digests = [hashlib.blake2b(digest_size=32) for _ in range(terms.shape[1])]
    for block in _row_blocks(terms):
        for digest, column in zip(digests, np.ascontiguousarray(block.T)):
            digest.update(column.tobytes())
    first = {digest.digest(): c for c, digest in reversed(list(enumerate(digests)))}
    return np.sort(list(first.values()))


def _signed_sums(terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sums of each column's positive and of its negative terms (``terms`` [K, N]), in int64."""
    positive, negative = np.zeros(terms.shape[1], np.int64), np.zeros(terms.shape[1], np.int64)
    for block in _row_blocks(terms):
        positive += np.where(block > 0, block, 0).sum(axis=0)
        negative += np.where(block < 0, block, 0).sum(axis=0)
    return positive, negative


def _windows(site: Site, w_shape: Sequence[int], a_shape: Sequence[int],
             jobs: int | None = None) -> tuple[list[tuple[int, tuple, tuple]], tuple[int, ...]]:
    """ConvInteger: windows of the image that do not overlap, each one output position's, as
    (image, the input's indices per spatial axis, the kernel's indices they meet); the whole window
    where one fits, else the part of it that is not padding. ``jobs``: as many images as that many
    windows take, else A's own count."""
    attributes, spatial = site.attributes, len(w_shape) - 2
    sizes = a_shape[2:]
    strides = attributes.get("strides") or [1] * spatial
    dilations = attributes.get("dilations") or [1] * spatial
    pads = attributes.get("pads") or [0] * 2 * spatial
    if attributes.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        pads = same_pads(sizes, w_shape[2:], attributes, attributes["auto_pad"])
    per_axis = []
    for size, k, s, d, begin, end in zip(sizes, w_shape[2:], strides, dilations, pads[:spatial], pads[spatial:]):
        extent = (k - 1) * d + 1
        outputs = (size + begin + end - extent) // s + 1
        first = -(-begin // s)
        inside = [p for p in range(first, outputs, -(-extent // s)) if p * s - begin + extent <= size]
        windows = []
        for p in inside or ([min(first, outputs - 1)] if outputs > 0 else []):
            index = p * s - begin + np.arange(k) * d
            valid = (index >= 0) & (index < size)
            windows.append((index[valid], np.flatnonzero(valid)))
        per_axis.append(windows)
    per_image = list(itertools.product(*per_axis))
    images = a_shape[0] if jobs is None else max(1, -(-jobs // max(len(per_image), 1)))
    slots = [(n, tuple(w[0] for w in combo), tuple(w[1] for w in combo)) for n in range(images) for combo in per_image]
    return slots, (images, *a_shape[1:])


def same_pads(sizes, kernel, attributes, mode: str) -> list[int]:
    """Explicit pads of auto_pad SAME_UPPER / SAME_LOWER, as ONNX defines them."""
    strides = attributes.get("strides") or [1] * len(sizes)
    dilations = attributes.get("dilations") or [1] * len(sizes)
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else large)
        ends.append(large if mode == "SAME_UPPER" else small)
    return begins + ends
