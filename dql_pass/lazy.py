"""Names a package exports but loads only when first used, so that importing it costs nothing."""

from __future__ import annotations

__all__ = ["exports"]

import importlib
import sys
from collections.abc import Callable, Mapping


def exports(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``, which loads each name of ``table``
    from its module (relative to ``package``) when first asked for, and keeps it."""

    def __getattr__(name: str) -> object:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{table[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *table})

    return __getattr__, __dir__
