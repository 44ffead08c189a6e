"""The signals that stop a command, in one place: Ctrl-C (SIGINT), SIGTERM and SIGHUP (a closed
terminal or ssh session). Each unwinds the command as Ctrl-C does, so that every write undoes
itself on the way out, and ends it with one line and exit code 128 + the signal's number.

A leaf that imports nothing heavy: the entry point installs it before the command line loads.
"""

from __future__ import annotations

__all__ = ["SIGNALS", "Interrupted", "cause", "install", "report"]

import signal
import sys

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Interrupted(KeyboardInterrupt):
    """A signal other than SIGINT (which Python raises as KeyboardInterrupt), raised like it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def install() -> None:
    """From here on each of :data:`SIGNALS` raises a KeyboardInterrupt; one the process was
    started with ignored (``nohup``, a background job's SIGINT) stays ignored."""
    for sig in SIGNALS:
        if sig != signal.SIGINT and signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _raise)


def cause(error: BaseException) -> KeyboardInterrupt | None:
    """The interrupt ``error`` was raised from, if any: Python 3.11 wraps one raised inside a class
    definition (a dataclass field's ``__set_name__``, in a lazy import) in a RuntimeError."""
    while error is not None and not isinstance(error, KeyboardInterrupt):
        error = error.__cause__
    return error


def report(interrupt: KeyboardInterrupt) -> int:
    """Say that the command was interrupted; the exit code that says by what."""
    print("dql-pass: interrupted", file=sys.stderr)
    return 128 + (interrupt.signum if isinstance(interrupt, Interrupted) else signal.SIGINT)
