"""The exception types that the CLI turns into a one-line message and exit code 2."""

from __future__ import annotations

__all__ = ["InputError", "MissingDependency", "one_line"]


class InputError(ValueError):
    """The input cannot be processed: a bad file, an invalid model, an unknown choice or an unsupported DQL.

    A ValueError, so that API callers catch a bad argument the usual way.
    """


class MissingDependency(ImportError):
    """A library or runtime that a command needs is missing or of a version it does not support.

    The CLI prints it as one line with exit code 2, like bad input: the message says what to install.
    """


def one_line(error: BaseException) -> str:
    """An exception's message on one line, whole: a runtime's reason often names its cause last."""
    return " ".join(str(error).split())
