"""The one exception type that the CLI turns into a one-line message and exit code 2."""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """The input cannot be processed: a bad file, an invalid model, an unknown choice or an unsupported DQL.

    A ValueError, so that API callers catch a bad argument the usual way.
    """
