"""What DynamicQuantizeLinear is checked on: the classes of inputs, the catalogue, and the inputs
built apart from it.

One vocabulary: :data:`CLASSES` names the classes of inputs, :func:`input_classes` says which ones
an input belongs to, and what a runtime's known differences, the verify report and run-tests say
about inputs draws from it (:func:`check_class` refuses a name outside it).

The catalogue that the evaluator, the property tests and the conformance suites all draw from.
Random inputs almost never hit the cases where implementations go wrong (a zero range, ±inf, an
underflowing scale, an exact .5 tie), so those are constructed here, deterministically:

- the ONNX conformance inputs and every row of ``docs/SEMANTICS.md``;
- exact ties of x/scale (even and odd), zero-point ties, and odd zero points combined with ties,
  which catch a zero point added before rounding;
- reciprocal traps: values whose quotient by the scale rounds differently from their product
  with the reciprocal of the scale;
- signs (all positive, all negative, mixed, constant), ranks 0 to 5, empty tensors;
- magnitudes from 1e-30 to 1e30, subnormal and underflowing scales, ±inf and overflowing ranges;
- seeded random inputs; on request one large tensor and NaN inputs (outside the contract).

Apart from the catalogue: :func:`large_cases`, its exact ties repeated to sizes where kernels
change paths, and :func:`independent_inputs`, seeded inputs of every kind at random magnitudes,
built without looking at the catalogue, for checking a runtime on inputs nobody picked.
"""

from __future__ import annotations

__all__ = [
    "CLASSES", "INDEPENDENT_SHAPES", "Case", "cases", "check_class", "describe", "independent_inputs", "input_classes",
    "large_cases",
]

import dataclasses
import math
from collections.abc import Callable, Iterable

import numpy as np

from dql_pass.reference import dynamic_quantize_linear

_F = np.float32

# The classes of inputs, as :func:`input_classes` computes them.
CLASSES: frozenset[str] = frozenset({
    "empty", "all zero", "zero range", "x/scale overflows to +inf", "subnormal", "reciprocal", "infinite", "tiny scale",
    "near tie", "range overflows", "rank above 4",
})


def describe(classes: Iterable[str]) -> str:
    """A set of classes in one label, for a report: sorted, or ``no class``."""
    return ", ".join(sorted(classes)) or "no class"


def check_class(name: str) -> str:
    """``name`` when it is one of :data:`CLASSES`; ValueError naming them otherwise."""
    if name not in CLASSES:
        raise ValueError(f"unknown input class {name!r}; the classes: {', '.join(sorted(CLASSES))}")
    return name


def _subnormal(values: np.ndarray) -> bool:
    values = np.abs(np.asarray(values, np.float32))
    return bool(np.any((values > 0) & (values < np.finfo(np.float32).tiny)))


def _reciprocal_changes(x: np.ndarray, scale: np.float32) -> bool:
    """Whether dividing through a float32 reciprocal (``a * (1 / b)``) changes a DQL output of ``x``."""
    finite = x[np.isfinite(x)]
    lo = min(np.float32(0), finite.min(initial=np.float32(0)))
    hi = max(np.float32(0), finite.max(initial=np.float32(0)))
    if hi - lo == 0 or not np.isfinite(scale) or scale == 0:
        return False
    inverse = np.float32(1) / scale
    if np.float32(hi - lo) * (np.float32(1) / np.float32(255)) != scale:
        return True
    saturated = np.float32(255)
    if np.round(min(np.float32(-lo * inverse), saturated)) != np.round(min(np.float32(-lo / scale), saturated)):
        return True
    return bool(np.any(np.round(finite * inverse) != np.round(finite / scale)))


def _near_tie(x: np.ndarray, scale: np.float32, zero_point: np.uint8) -> bool:
    """Whether a quotient a kernel rounds lies on k + 0.5 or within 4 float32 ulps of it: x/scale,
    the zero point's -lo/scale, or x/scale + zero_point summed in float32 (|q| < 2^22)."""
    finite = x[np.isfinite(x)]
    lo = min(np.float32(0), finite.min(initial=np.float32(0)))
    q = (finite / scale).astype(np.float32)
    candidates = np.concatenate([q, [np.float32(-lo / scale)], (q + np.float32(zero_point)).astype(np.float32)])
    candidates = candidates[np.isfinite(candidates) & (np.abs(candidates) < 2**22)]
    distance = np.abs(candidates - (np.floor(candidates) + np.float32(0.5)))
    return bool(np.any(distance <= 4 * np.spacing(np.abs(candidates))))


def input_classes(x: np.ndarray, policy: str) -> set[str]:
    """The classes of ``x`` that known differences are stated for:

    - ``empty``, ``all zero`` and ``zero range`` (either);
    - ``x/scale overflows to +inf``;
    - ``subnormal``: x, its range or its scale holds a subnormal float32 (runtimes that flush
      subnormals to zero compute another range, scale or quotient);
    - ``reciprocal``: dividing through a float32 reciprocal instead changes an output;
    - ``infinite``: x holds +inf or -inf;
    - ``range overflows``: x is finite, and its range (max(x, 0) - min(x, 0)) overflows to +inf,
      so the scale is +inf (runtimes that clamp inf to the largest float compute a finite one);
    - ``tiny scale``: the scale is below 2^-120, where remainders of the scale fall out of the
      normal range;
    - ``near tie``: a quotient that is rounded lies on a tie or within 4 ulps of one (runtimes
      that round ties away from zero, or add the zero point before rounding, differ there);
    - ``rank above 4``: x has 5 dimensions or more (converters that reshape such tensors to a
      lower rank, and runtimes that plan their buffers around those reshapes, differ there).
    """
    classes = {"rank above 4"} if x.ndim > 4 else set()
    with np.errstate(all="ignore"):
        if not x.size:
            classes |= {"empty", "zero range"}
        elif np.all(x == 0):
            classes |= {"all zero", "zero range"}
        if np.isinf(x).any():
            classes.add("infinite")
        if not np.isnan(x).any():
            _, scale, zero_point = dynamic_quantize_linear(x, policy)
            if np.isposinf(x / scale).any():
                classes.add("x/scale overflows to +inf")
            if x.size:
                value_range = np.float32(max(np.float32(0), x.max()) - min(np.float32(0), x.min()))
                if _subnormal(x) or _subnormal(value_range) or _subnormal(scale):
                    classes.add("subnormal")
                if np.isinf(value_range) and np.isfinite(x).all():
                    classes.add("range overflows")
            if 0 < scale < 2.0**-120:
                classes.add("tiny scale")
            if _reciprocal_changes(x.ravel(), scale):
                classes.add("reciprocal")
            if x.size and _near_tie(x.ravel(), scale, zero_point):
                classes.add("near tie")
    return classes


@dataclasses.dataclass(frozen=True)
class Case:
    """One input ``x`` with a stable name, the category it is listed under and a sentence on what it
    tests. The category orders the catalogue for a reader; what the input is, for a check, a report or
    a known difference, is :meth:`classes`."""

    name: str
    category: str
    x: np.ndarray
    description: str

    def classes(self, policy: str) -> set[str]:
        """The classes of :data:`CLASSES` that ``x`` belongs to under zero-range ``policy``."""
        return input_classes(self.x, policy)

    @property
    def policy_dependent(self) -> bool:
        """True when the expected outputs depend on the zero-range policy."""
        with np.errstate(invalid="ignore"):
            return not self.x.size or bool(np.all(self.x == 0))

    @property
    def comparable(self) -> bool:
        """False for NaN inputs, whose outputs the contract leaves unspecified."""
        return not np.isnan(self.x).any()


def _array(values, shape=None) -> np.ndarray:
    x = np.array(values, dtype=_F)
    return x.reshape(shape) if shape is not None else x


def _scale(lo: float, hi: float) -> np.float32:
    return _F(_F(hi) - _F(lo)) / _F(255)


def _reciprocal_traps(lo: float, hi: float, count: int = 16) -> np.ndarray:
    """Values in [lo, hi] whose x/scale rounds differently from x*(1/scale), plus lo and hi."""
    scale = _scale(lo, hi)
    inverse = _F(1) / scale
    found = []
    for k in range(int(np.floor(lo / scale)), int(np.ceil(hi / scale))):
        centre = _F((k + 0.5) * scale)
        for x in (np.nextafter(centre, _F(-np.inf)), centre, np.nextafter(centre, _F(np.inf))):
            if lo <= x <= hi and np.round(x / scale) != np.round(x * inverse):
                found.append(x)
        if len(found) >= count:
            break
    return _array([lo, hi, *found])


def _exact_ties(lo: float, hi: float) -> np.ndarray:
    """Values whose quotient by the scale is exactly k + 0.5, for even and odd k."""
    scale = _scale(lo, hi)
    ties = []
    for k in range(int(np.floor(lo / scale)), int(np.ceil(hi / scale))):
        x = _F(_F(k + 0.5) * scale)
        if lo <= x <= hi and _F(x / scale) == _F(k + 0.5):
            ties.append(x)
    return _array([lo, hi, *ties])


def _constructed() -> list[Case]:
    inf = np.inf
    c = Case
    return [
        # The three ONNX conformance inputs.
        c("spec_example", "conformance", _array([0, 2, -3, -2.5, 1.34, 0.5]), "the operator page's first example"),
        c("spec_max_adjusted", "conformance", _array([-1, -2.1, -1.3, -2.5, -3.34, -4]),
          "all negative: the range is stretched up to 0"),
        c("spec_min_adjusted", "conformance",
          _array([[1, 2.1, 1.3, 2.5], [3.34, 4, 1.5, 2.6], [3.9, 4, 3, 2.345]]),
          "all positive, rank 2: the range is stretched down to 0"),
        # Exact ties, rounded half to even; scale 1 makes every x + 0.5 a tie.
        c("tie_unit_scale", "tie", _array([0, 255, 0.5, 1.5, 2.5, 3.5, 100.5, 101.5, 253.5, 254.5]),
          "x/scale is exactly k + 0.5 for even and odd k: ties go to even"),
        c("tie_exact_fractional_scale", "tie", _exact_ties(-0.7, 1.3),
          "exact ties of x/scale under a scale that is not a power of two"),
        c("tie_reciprocal_trap", "tie", _reciprocal_traps(-1.0, 1.0),
          "values near ties where x * (1/scale) rounds differently from x / scale"),
        c("tie_reciprocal_trap_positive", "tie", _reciprocal_traps(0.0, 3.7),
          "reciprocal traps with zero point 0"),
        c("tie_zero_point_even", "zero point", _array([-2.5, 252.5, 0, 1]),
          "the zero point is exactly 2.5 and rounds to 2"),
        c("tie_zero_point_odd", "zero point", _array([-3.5, 251.5, 0, 1]),
          "the zero point is exactly 3.5 and rounds to 4"),
        c("odd_zero_point_with_ties", "zero point", _array([-3, 252, 0.5, 1.5, 2.5, -0.5, -1.5, 100.5]),
          "zero point 3 with ties: adding it before rounding changes y"),
        c("odd_zero_point_random", "zero point", _array([-0.3, 0.11, 0.7, 0.42, -0.07, 0.0]),
          "an odd zero point under a fractional scale"),
        # Signs and constants.
        c("all_positive", "sign", _array([0.1, 0.2, 7.5, 3.25, 1e-3]), "all positive: zero point 0"),
        c("all_negative", "sign", _array([-0.1, -0.2, -7.5, -3.25, -1e-3]), "all negative: zero point 255"),
        c("mixed_signs", "sign", _array([-5.5, 4.25, 0.0, -0.0, 3.0, -1.0]), "mixed signs and both zeros"),
        c("constant_positive", "sign", _array([2.5, 2.5, 2.5]), "a constant positive input"),
        c("constant_negative", "sign", _array([-2.5, -2.5]), "a constant negative input"),
        c("single_element", "sign", _array([3.0]), "a single element"),
        # Zero range: the ORT kernel says scale 1, ONNX's function body computes 0/0.
        c("zeros", "zero range", _array([0, 0, 0]), "an all-zero input: a zero range"),
        c("negative_zero", "zero range", _array([-0.0]), "only -0.0: a zero range"),
        c("signed_zeros", "zero range", _array([0.0, -0.0, 0.0, -0.0], (2, 2)), "±0 only, rank 2"),
        c("empty", "empty", _array([]), "an empty tensor: a zero range with no elements"),
        c("empty_rank_3", "empty", np.zeros((2, 0, 3), _F), "an empty tensor of rank 3"),
        # Ranks.
        c("rank_0", "rank", _array(3.0), "a rank-0 tensor"),
        c("rank_0_negative", "rank", _array(-0.75), "a rank-0 negative tensor"),
        c("rank_3", "rank", _array(np.linspace(-2, 5, 24), (2, 3, 4)), "a rank-3 tensor"),
        c("rank_4", "rank", _array(np.linspace(-1, 1, 48), (1, 2, 4, 6)), "a rank-4 tensor, NCHW-like"),
        c("rank_5", "rank", _array(np.linspace(-3, 1, 32), (2, 2, 2, 2, 2)), "a rank-5 tensor"),
        c("rank_5_batch_1", "rank", _array(np.linspace(-3, 1, 120), (1, 2, 3, 4, 5)),
          "a rank-5 tensor of batch 1, which converters reshape to a lower rank"),
        # Magnitudes.
        c("magnitude_1e-30", "magnitude", _array([1e-30, -3e-30, 2.5e-30]), "tiny but normal values"),
        c("magnitude_1e-10", "magnitude", _array([1e-10, -7e-11, 3.3e-10]), "small values"),
        c("magnitude_1e10", "magnitude", _array([1e10, -7e9, 3.3e10]), "large values"),
        c("magnitude_1e30", "magnitude", _array([1e30, -3e30, 2.5e30]), "huge but finite values"),
        c("magnitude_mixed", "magnitude", _array([1e30, 1e-30, -1e-30, 1.0]), "tiny values next to huge ones"),
        # Scales at the bottom of float32.
        c("subnormal_scale", "subnormal scale", _array([1e-38, 2e-38]), "the scale is subnormal (7.8e-41)"),
        c("underflow_scale", "underflow", _array([1e-45]), "range/255 underflows to 0: zero point 255"),
        c("underflow_scale_signed", "underflow", _array([-1e-45, 1e-45]), "an underflowing scale with both signs"),
        c("tiny_next_to_normal", "underflow", _array([0.5, 1e-45]), "a subnormal x next to a normal range"),
        c("subnormal_inputs", "subnormal scale", _array([-2e-39, 3e-39, 1e-40]), "subnormal inputs"),
        # Infinities and overflow.
        c("positive_inf", "inf", _array([5, inf]), "+inf: the scale is inf and inf/inf gives y 0"),
        c("negative_inf", "inf", _array([-inf, -5]), "-inf: the zero point is NaN and saturates to 255"),
        c("both_inf", "inf", _array([inf, -inf, 1]), "both infinities"),
        c("negative_inf_mixed", "inf", _array([0, 1, -inf, -1]), "-inf among finite values"),
        c("range_overflow", "overflow", _array([3e38, -3e38]), "a finite input whose range overflows to inf"),
        c("range_overflow_mixed", "overflow", _array([3.4e38, -1e38, 1.0, -0.5]),
          "an overflowing range with small values"),
        c("semantics_saturation", "semantics", _array([-127, 128, 0.5]), "scale 1, zero point 127, both ends saturate"),
    ]


def _random(rng: np.random.Generator, count: int) -> list[Case]:
    shapes = [(7,), (3, 5), (2, 3, 4), (1, 2, 3, 4), (64,), (16, 16)]
    out = []
    for i in range(count):
        shape = shapes[i % len(shapes)]
        magnitude = 10.0 ** rng.integers(-6, 7)
        x = (rng.standard_normal(shape) * magnitude).astype(_F)
        if i % 3 == 1:
            x = np.abs(x)
        elif i % 3 == 2:
            x = -np.abs(x)
        out.append(Case(f"random_{i}", "random", x, f"seeded random input of shape {shape}, magnitude {magnitude:g}"))
    return out


def cases(
    *, seed: int = 0, random_count: int = 12, include_large: bool = False, include_nan: bool = False
) -> list[Case]:
    """The catalogue: constructed cases, then ``random_count`` seeded random ones.

    ``include_large`` adds one tensor of about a million elements; ``include_nan`` adds NaN inputs,
    whose outputs are outside the contract (``Case.comparable`` is False for them).
    """
    rng = np.random.default_rng(seed)
    out = _constructed() + _random(rng, random_count)
    if include_large:
        out.append(Case("large_1m", "large", rng.standard_normal((1024, 1024)).astype(_F) * _F(3),
                        "about a million elements, to exercise vectorized kernels"))
    if include_nan:
        out += [
            Case("nan_only", "nan", _array([np.nan]), "NaN only: outside the contract"),
            Case("nan_mixed", "nan", _array([1.0, np.nan, -2.0]), "NaN among finite values: outside the contract"),
        ]
    return out


def _slot_boundaries(lo: float, hi: float) -> np.ndarray:
    """lo, hi, and for every k the range reaches the two floats where round(x / scale) goes from k to
    k + 1: a decomposition that rounds through a table of per-slot thresholds (lean) is wrong at
    one of them wherever one threshold is."""
    scale = _scale(lo, hi)

    def rounded(v: np.float32) -> np.float32:
        return np.round(_F(v) / scale)  # half to even, after a correctly rounded quotient

    found = []
    for k in range(int(np.floor(lo / scale)), int(np.ceil(hi / scale))):
        below = _F((k + 0.5) * scale)
        while rounded(below) > k:
            below = np.nextafter(below, _F(-np.inf))
        while rounded(np.nextafter(below, _F(np.inf))) <= k:
            below = np.nextafter(below, _F(np.inf))
        found += [x for x in (below, np.nextafter(below, _F(np.inf))) if lo <= x <= hi]
    return _array([lo, hi, *found])


def large_cases() -> list[Case]:
    """Cases beyond the catalogue's few hundred elements, where kernels change paths.

    The catalogue's exact ties of ``tie_exact_fractional_scale``, repeated, with the two ends of
    their range last: a reduction that reads a prefix, or a scale that changes with the size, gets
    them wrong. And the two floats around every rounding boundary, for ranges below and above 0
    (255 boundaries each: every quantized step on either side of the zero point), at six scales each.
    """
    ties = _exact_ties(-0.7, 1.3)
    ends, inner = ties[:2], ties[2:]  # the case starts with the ends of its range
    found = []
    for shape in ((4, 32, 33), (2, 200, 201)):
        x = np.resize(inner, math.prod(shape))
        x[-2:] = ends
        found.append(Case(f"large_ties_{x.size}", "large", x.reshape(shape),
                          f"{x.size} exact ties, the range's ends last"))
    # Ranges below and above 0, of scales whose products with a slot's constant round differently: a
    # wrong threshold that equals the right one at one scale shows at another. Six a side, chosen so
    # that a threshold off by one float, or a tie sent the wrong way, at any one of lean's 510 slots
    # that matter shows at one of them (four a side missed about one slot in fifteen).
    for lo, hi in ((-0.7, 0.0), (-0.31, 0.0), (-1.9, 0.0), (-5.3, 0.0), (-2.1, 0.0), (-0.69, 0.0), (0.0, 1.3),
                   (0.0, 0.47), (0.0, 3.7), (0.0, 9.1), (0.0, 0.53), (0.0, 0.27)):
        x = _slot_boundaries(lo, hi)
        found.append(Case(f"boundaries_{lo or hi}", "large", x, f"the floats on both sides of each of the "
                          f"{(x.size - 2) // 2} rounding boundaries of [{lo}, {hi}]"))
    return found


# A few shapes, so that a compiler builds each form a few times only.
INDEPENDENT_SHAPES: tuple[tuple[int, ...], ...] = ((16,), (4, 8), (2, 3, 5), (1, 97), (257,), (1, 1000, 1))


def _span(rng: np.random.Generator, low: float = -30.0, high: float = 30.0) -> tuple[np.float32, np.float32]:
    """A random range [lo, hi] around 0 at a random magnitude (the range always holds 0)."""
    magnitude = 10.0 ** rng.uniform(low, high)
    lo, hi = -rng.uniform(0, 1) * magnitude, rng.uniform(0, 1) * magnitude
    return _F(lo), _F(max(hi, np.finfo(_F).smallest_subnormal))


def _with_ends(x: np.ndarray, lo: np.float32, hi: np.float32, rng: np.random.Generator) -> np.ndarray:
    """``x`` holding ``lo`` and ``hi`` at random places, so they are its extremes."""
    flat = x.ravel().astype(_F)
    at = rng.choice(flat.size, size=min(2, flat.size), replace=False)
    flat[at[0]] = lo
    if flat.size > 1:
        flat[at[1]] = hi
    return flat.reshape(x.shape)


def _any_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Normal or uniform values at a random scale, of one sign or both."""
    magnitude = 10.0 ** rng.uniform(-30, 30)
    x = rng.standard_normal(shape) if rng.integers(2) else rng.uniform(-1, 1, shape)
    sign = rng.integers(3)
    x = np.abs(x) if sign == 1 else -np.abs(x) if sign == 2 else x
    return (x * magnitude).astype(_F)


def _quotients(
    rng: np.random.Generator, shape: tuple[int, ...], offset: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """Values ``offset((k + 0.5) * scale)`` for random k in a random range: ties and their neighbours."""
    lo, hi = _span(rng)
    scale = _scale(lo, hi)
    k = rng.integers(int(np.floor(lo / scale)), int(np.ceil(hi / scale)), size=shape)
    x = offset(((k + 0.5) * scale).astype(_F))
    return _with_ends(np.clip(x, lo, hi), lo, hi, rng)


def _ties(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Exact (or nearly exact, where float32 cannot hold the tie) ties of x/scale."""
    return _quotients(rng, shape, lambda x: x)


def _near_ties(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """One ulp either side of a tie: where dividing through a reciprocal rounds the other way."""
    return _quotients(
        rng, shape, lambda x: np.nextafter(x, np.where(rng.integers(2, size=x.shape), np.inf, -np.inf).astype(_F)))


def _symmetric(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """[-t, t]: the zero point is exactly 127.5 before rounding."""
    t = _F(10.0 ** rng.uniform(-30, 30))
    return _with_ends(rng.uniform(-t, t, shape).astype(_F), -t, t, rng)


def _subnormal_range(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A range below 255 * 2**-126: the scale (and often x) is subnormal or underflows."""
    lo, hi = _span(rng, -45.5, -35.5)
    return _with_ends(rng.uniform(lo, hi, shape).astype(_F), lo, hi, rng)


def _tiny_scale(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A normal scale at the bottom of the normal range (2^-126 to 2^-123), where its remainders leave it."""
    value_range = _F(255 * 2.0**-126 * rng.uniform(1, 8))
    lo = _F(-value_range * _F(rng.uniform(0, 1)))
    hi = _F(lo + value_range)
    return _with_ends((lo + value_range * rng.uniform(0, 1, shape)).astype(_F), lo, hi, rng)


_KINDS: tuple[tuple[str, Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]], ...] = (
    ("random", _any_values), ("ties", _ties), ("near_ties", _near_ties), ("symmetric", _symmetric),
    ("subnormal", _subnormal_range), ("tiny_scale", _tiny_scale),
)


def independent_inputs(count: int, seed: int = 11) -> list[tuple[str, np.ndarray]]:
    """``count`` seeded inputs built apart from the catalogue, named by their kind, in :data:`INDEPENDENT_SHAPES`:
    each kind in turn, and each shape in turn for a kind."""
    rng = np.random.default_rng(seed)
    out = []
    with np.errstate(all="ignore"):
        for i in range(count):
            kind, make = _KINDS[i % len(_KINDS)]
            shape = INDEPENDENT_SHAPES[(i // len(_KINDS)) % len(INDEPENDENT_SHAPES)]
            out.append((f"{kind}_{i}", make(rng, shape)))
    return out
