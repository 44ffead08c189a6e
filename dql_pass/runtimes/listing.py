"""The runtimes as ``--list-targets`` shows them: one line per target, then the runtimes without an adapter."""

from __future__ import annotations

__all__ = ["format_targets"]

from collections.abc import Sequence

from dql_pass import variants


def format_targets(verbose: bool = False) -> str:
    """One line per target: its variant, lower's weights, whether it is installed, the ops it lacks and
    the inputs where its variant still differs; then the runtimes without an adapter and their command.
    ``verbose``: each lack and difference with its measured reason, under its target."""
    from dql_pass import runtimes

    rows = [("target", "variant", "weights", "installed", "lacks", "still differs on")]
    details = []
    for name, runtime in runtimes.RUNTIMES.items():
        differs = [d for d in runtime.known_differences if runtime.variant in d.forms]
        version = runtime.version()
        rows.append((name, runtime.variant, runtime.weights, version or _clipped(f"no: {runtime.install_hint()}"),
                     _some([lack.op_type for lack in runtime.lacks]),
                     ", ".join(sorted({d.inputs or "any" for d in differs})) or "-"))
        details.append(f"{name}:")
        if not version:
            details.append(f"  not installed: {runtime.install_hint()}")
        if runtime.blocks:
            details.append("  lower drops the Cast pair after each lowered product" + (
                " and keeps y - y_zero_point in float32 where only lowered products read it (blocks)"
                if variants.BY_NAME[runtime.variant].float_y
                else f" (blocks; variant {runtime.variant} keeps y in uint8)"))
        details += [f"  differs on {d.inputs or 'any'} inputs: {d.reason}" for d in differs]
        details += [f"  lacks {lack.op_type}-{lack.since_version}: {lack.reason}" for lack in runtime.lacks]
        details += [f"  lower leaves {p.op_type} alone: {p.reason}" for p in runtime.inexact_products]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] for row in rows]
    lines += ["", "without an adapter (not a --target; for them run `dql-pass lower INPUT -o OUTPUT`, no --target):"]
    lines += [f"  {name:<{widths[0]}}  {other.title}: lacks {', '.join(other.lacks)} ({other.source})"
              for name, other in runtimes.ELSEWHERE.items()]
    if verbose:
        lines += ["", *details]
    return "\n".join(lines)


def _clipped(text: str, most: int = 64) -> str:
    """``text`` cut to ``most`` characters: an install hint naming a long cache path would widen every row;
    ``-v`` gives it whole."""
    return text if len(text) <= most else text[:most - 3] + "..."


def _some(items: Sequence[str], most: int = 4) -> str:
    """``items`` joined, the first ``most`` of them named, or "-"."""
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more if items else "-"
