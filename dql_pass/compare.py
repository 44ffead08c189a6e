"""Bit-for-bit comparison: the one place that says whether two arrays are the same.

Floats compare through their bits, so -0.0 differs from 0.0 and a scale one ulp off is a
difference; dtype and shape must match first.
"""

from __future__ import annotations

__all__ = ["WORST", "BitDifference", "SiteDifference", "bit_difference", "compare_site", "same_bits"]

import dataclasses
from collections.abc import Sequence

import numpy as np

from dql_pass.op import OUTPUTS


WORST = (9, 0)  # the severity of a site that cannot run at all


@dataclasses.dataclass(frozen=True)
class SiteDifference:
    """What differs between actual and expected outputs for one input; larger ``severity`` is worse."""

    severity: tuple[int, int]
    detail: str
    outputs: tuple[str, ...] = OUTPUTS  # those that differ; all of them where the site did not run


@dataclasses.dataclass(frozen=True)
class BitDifference:
    """How an array differs from the expected one: ``elements`` that differ (None when the dtype or
    shape differs) and one sentence on the first difference."""

    elements: int | None
    text: str


def same_bits(actual: np.ndarray, expected: np.ndarray, *, any_nan: bool = False) -> np.ndarray:
    """Element-wise bit equality of two arrays of one dtype and shape, so -0.0 differs from 0.0.

    With ``any_nan``, NaN equals NaN whatever its payload.
    """
    if actual.dtype.kind != "f":
        return actual == expected
    same = actual.view(f"u{actual.itemsize}") == expected.view(f"u{expected.itemsize}")
    if any_nan:
        same |= np.isnan(actual) & np.isnan(expected)
    return same


def bit_difference(
    name: str, actual: np.ndarray, expected: np.ndarray, *, any_nan: bool = False
) -> BitDifference | None:
    """None when ``actual`` (called ``name``) equals ``expected`` in dtype, shape and every bit (see
    :func:`same_bits`)."""
    actual = np.asarray(actual)
    if actual.dtype != expected.dtype:
        return BitDifference(None, f"{name} has dtype {actual.dtype}, expected {expected.dtype}")
    if actual.shape != expected.shape:
        return BitDifference(None, f"{name} has shape {list(actual.shape)}, expected {list(expected.shape)}")
    differs = ~same_bits(actual, expected, any_nan=any_nan)
    if not differs.any():
        return None
    count = int(differs.sum())
    if not differs.ndim:
        return BitDifference(count, f"{name} differs: got {actual[()]}, expected {expected[()]}")
    where = tuple(int(i) for i in np.argwhere(differs)[0])
    return BitDifference(count, (
        f"{name} differs in {count} of {differs.size} elements, first at {list(where)}: "
        f"got {actual[where]}, expected {expected[where]}"
    ))


def compare_site(
    actual: Sequence[np.ndarray], expected: Sequence[np.ndarray], names: Sequence[str] = OUTPUTS
) -> SiteDifference | None:
    """Compare a site's outputs, called ``names`` (the whole tensor first), with the reference's;
    None when every bit agrees."""
    problems, differing, scalars, elements = [], [], 0, 0
    for name, a, e in zip(names, actual, expected, strict=True):
        difference = bit_difference(name, a, e, any_nan=True)
        if difference is None:
            continue
        problems.append(difference.text)
        differing.append(name)
        # Worse is a wrong scalar or type before more wrong elements of y.
        if name == names[0] and difference.elements is not None:
            elements = difference.elements
        else:
            scalars += 1
    return SiteDifference((scalars, elements), "; ".join(problems), tuple(differing)) if problems else None
