"""What a command prints and writes: its own lines on stdout (none under ``-q``), and its ``--json``
report, with every non-finite float spelled as a string (JSON has no inf or NaN)."""

from __future__ import annotations

__all__ = ["note", "say", "write_json"]

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any


def say(args: argparse.Namespace, text: str = "") -> None:
    """A line of the command's own output: stdout, unless -q."""
    if not args.quiet:
        print(text)


def note(text: str | None) -> None:
    """Lines for stderr, when there are any."""
    if text:
        print(text, file=sys.stderr)


def write_json(path: Path, report: dict) -> None:
    """Write ``report`` at ``path``, checked before the command ran (:mod:`dql_pass.files.report_path`)."""
    from dql_pass.files.report_path import write_report

    write_report(path, json.dumps(_finite(report), indent=2, default=_jsonable, allow_nan=False) + "\n")


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float spelled as a string: JSON has no inf or NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
