"""The one exception type that the CLI turns into a one-line message and exit code 2."""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(Exception):
    """The input cannot be processed: a bad file, an invalid model or an unsupported DQL."""
