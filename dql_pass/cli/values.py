"""The values of options, checked as argparse types or when the command runs: one line on a bad one."""

from __future__ import annotations

__all__ = ["dims", "opsets", "pairs", "runtime_name", "seconds", "whole_number"]

import argparse
import math
from collections.abc import Sequence

from dql_pass.errors import InputError


def pairs(items: Sequence[str], option: str) -> dict[str, str]:
    """``NAME=VALUE`` items of a repeatable option, by name."""
    found = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise InputError(f"{option} {item!r}: expected NAME=VALUE")
        if name in found and found[name] != value:
            raise InputError(f"{option} {name} is given twice ({found[name]} and {value}); give it once")
        found[name] = value
    return found


def dims(args: argparse.Namespace) -> dict[str, int]:
    """--dim NAME=SIZE, by name."""
    sizes = {}
    for name, size in pairs(args.dim, "--dim").items():
        if not _is_whole_number(size):
            raise InputError(f"--dim {name}: the size must be a whole number, 0 or more, not {size!r}")
        sizes[name] = int(size)
    return sizes


def _is_whole_number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit alone accepts "²", which int() refuses


def whole_number(text: str) -> int:
    if not _is_whole_number(text):
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, not {text!r}")
    return int(text)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, not {text!r}")
    return value


def opsets(text: str) -> list[int]:
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected opsets like 11,13,21, not {text!r}") from None


def runtime_name(text: str) -> str:
    # Checked against the registry when the command runs: the parser imports no runtime.
    return text
