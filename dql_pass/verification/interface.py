"""The graph inputs: what a caller may feed ORIGINAL, REWRITTEN must take, of the same type, and read.

Rules: every input a caller may feed ORIGINAL (a graph input; from IR version 4 on, an initializer
that is also a graph input, which a caller may override) is a graph input of REWRITTEN, of the same
element type and rank and the same size wherever both fix one (an overridable initializer may stay an
initializer only, as ORT's remove_initializer_from_input leaves it: the kept nodes compare its value);
one that ORIGINAL's live nodes read (or a graph output) REWRITTEN's live nodes read too. The model
level feeds the same sets to both models and holds some inputs fixed or nearly (an overridable
initializer at its stored value, token types at 0, ids below 16), so an input that REWRITTEN drops or
no longer reads would pass there; no rewrite of a DQL changes what a model takes.
"""

from __future__ import annotations

__all__ = ["input_differences"]

from collections.abc import Set

import onnx_ir as ir

_OVERRIDABLE_SINCE = 4  # IR version: before it, every initializer is listed among the inputs, and none is fed


def _fed(model: ir.Model) -> list[ir.Value]:
    """The graph inputs a caller may feed."""
    overridable = (model.ir_version or 0) >= _OVERRIDABLE_SINCE
    return [value for value in model.graph.inputs if overridable or value.const_value is None]


def _read(value: ir.Value, model: ir.Model, alive: Set[ir.Node]) -> bool:
    return value in model.graph.outputs or any(use.node in alive for use in value.uses())


def _shape(value: ir.Value) -> str:
    return "unknown" if value.shape is None else f"[{', '.join(map(str, value.shape))}]"


def _difference(original: ir.Value, rewritten: ir.Value) -> str | None:
    if original.dtype != rewritten.dtype:
        return f"of type {original.dtype} in ORIGINAL and {rewritten.dtype} in REWRITTEN"
    before, after = original.shape, rewritten.shape
    if before is None or after is None:
        return None
    fixed = [(a, b) for a, b in zip(before, after) if isinstance(a, int) and isinstance(b, int)]
    if len(before) != len(after) or any(a != b for a, b in fixed):
        return f"of shape {_shape(original)} in ORIGINAL and {_shape(rewritten)} in REWRITTEN"
    return None


def input_differences(
    original: ir.Model, rewritten: ir.Model, original_live: Set[ir.Node], rewritten_live: Set[ir.Node]
) -> list[str]:
    """How REWRITTEN takes the inputs a caller may feed ORIGINAL otherwise (see the module docstring), one
    line each; ``original_live``, ``rewritten_live``: each model's live nodes (:func:`~dql_pass.graph.walk.live`)."""
    taken = {value.name: value for value in rewritten.graph.inputs}
    found = []
    for value in _fed(original):
        twin = taken.get(value.name)
        overridable = " (an initializer a caller may override)" if value.const_value is not None else ""
        if twin is None and overridable and value.name in rewritten.graph.initializers:
            continue  # moved out of the inputs, as ORT's remove_initializer_from_input does: its value is compared
        if twin is None:
            found.append(f"{value.name!r}{overridable}: REWRITTEN does not take it")
        elif difference := _difference(value, twin):
            found.append(f"{value.name!r}: {difference}")
        elif _read(value, original, original_live) and not _read(twin, rewritten, rewritten_live):
            found.append(f"{value.name!r}{overridable}: ORIGINAL reads it, REWRITTEN takes it but does not read it")
    return found
