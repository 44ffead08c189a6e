"""The installed dql_pass version: a leaf, so that ``--version`` loads no graph library."""

from __future__ import annotations

__all__ = ["VERSION", "__version__"]

import importlib.metadata

try:
    VERSION = importlib.metadata.version("dql_pass")
except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
    VERSION = "unknown"

__version__ = VERSION
