"""The graph outputs of the two models compared, over every input set: position by position, the
same names, no extra one, the same structure, types and shapes, then the same bits (NaN equals NaN),
sequences and maps element by element.
"""

from __future__ import annotations

__all__ = ["Sets", "compare_output", "compare_outputs", "size"]

from collections.abc import Mapping, Sequence

import numpy as np
import onnx_ir as ir

from dql_pass.compare import same_bits
from dql_pass.verification.report import OutputResult

Sets = Mapping[str, Mapping[str, object]]  # by input set's label, values by name


def _leaves(value: object, where: str = "") -> list[tuple[str, np.ndarray | None]]:
    """The arrays of an output value with where they sit: a tensor is one, a sequence or map has one
    per element (``[i]``), an absent optional is None."""
    if isinstance(value, (list, tuple)):
        found = [leaf for i, item in enumerate(value) for leaf in _leaves(item, f"{where}[{i}]")]
        return found or [(f"{where}[]", None)]
    if isinstance(value, dict):
        found = [leaf for key in sorted(value) for leaf in _leaves(value[key], f"{where}[{key!r}]")]
        return found or [(f"{where}{{}}", None)]
    return [(where, None if value is None else np.asarray(value))]


def _describe(leaves: Sequence[tuple[str, np.ndarray | None]]) -> str:
    shown = [f"{where}{'none' if a is None else f'{a.dtype}{list(a.shape)}'}".strip() for where, a in leaves[:4]]
    return ", ".join(shown) + (", ..." if len(leaves) > 4 else "")


def size(value: object) -> int:
    return sum(0 if a is None else a.size for _, a in _leaves(value))


def compare_output(name: str, original: Sequence[object], rewritten: Sequence[object]) -> OutputResult:
    """One graph output over every input set: structure, dtypes and shapes, then bits."""
    differing, max_abs, max_rel, total = 0, 0.0, 0.0, 0
    for a_value, b_value in zip(original, rewritten, strict=True):
        a_leaves, b_leaves = _leaves(a_value), _leaves(b_value)
        same_kind = len(a_leaves) == len(b_leaves) and all(
            wa == wb and (a is None) == (b is None) and (a is None or (a.dtype == b.dtype and a.shape == b.shape))
            for (wa, a), (wb, b) in zip(a_leaves, b_leaves)
        )
        if not same_kind:
            return OutputResult(name, False, detail=f"{_describe(b_leaves)} instead of {_describe(a_leaves)}")
        for (_, a), (_, b) in zip(a_leaves, b_leaves):
            if a is None:
                continue
            total += a.size
            bad = ~same_bits(a, b, any_nan=True)
            differing += int(bad.sum())
            if bad.any() and a.dtype.kind in "fiub":
                with np.errstate(all="ignore"):
                    x, y = a[bad].astype(np.float64), b[bad].astype(np.float64)
                    delta = np.nan_to_num(np.abs(x - y), nan=np.inf)  # NaN against a number: infinitely far
                    max_abs = max(max_abs, float(delta.max()))
                    relative = np.nan_to_num(delta / np.maximum(np.abs(x), np.finfo(np.float64).tiny), nan=np.inf)
                    max_rel = max(max_rel, float(relative.max()))
    if differing:
        detail = f"{differing} of {total} elements differ; max abs {max_abs:.6g}, max rel {max_rel:.6g}"
        return OutputResult(name, False, differing, max_abs, max_rel, detail)
    return OutputResult(name, True)


def compare_outputs(
    original: ir.Model, rewritten: ir.Model, expected_runs: Sets, actual_runs: Sets | None
) -> list[OutputResult]:
    """The graph outputs position by position: same names, no extra one, the same bits (``actual_runs``
    None: REWRITTEN did not run)."""
    final = [v.name for v in original.graph.outputs]
    got = [v.name for v in rewritten.graph.outputs]
    results = []
    for i, name in enumerate(final):
        if i >= len(got):
            results.append(OutputResult(name, False, detail=f"REWRITTEN has no output {i}"))
        elif got[i] != name:
            results.append(OutputResult(name, False, detail=f"REWRITTEN has {got[i]!r} as output {i}"))
        elif actual_runs is None:
            results.append(OutputResult(name, False, detail="REWRITTEN did not run"))
        else:
            expected, actual = [r[name] for r in expected_runs.values()], [r[name] for r in actual_runs.values()]
            results.append(compare_output(name, expected, actual))
    results += [
        OutputResult(name, False, detail=f"an output that ORIGINAL does not have (output {i})")
        for i, name in enumerate(got) if i >= len(final)
    ]
    return results
