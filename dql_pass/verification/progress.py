"""How far verify has come, for whoever watches: a callback that verify's loops report to.

verify sets it for the length of one call (:func:`reporting`); each loop calls :func:`advance`
with its stage ("sites", "lowered ops", "input sets"), the steps done and the steps in all. A
context variable, not one more parameter threaded through every layer of the checks.
"""

from __future__ import annotations

__all__ = ["Callback", "advance", "reporting"]

import contextlib
import contextvars
from collections.abc import Callable, Iterator

Callback = Callable[[str, int, int], None]

_callback: contextvars.ContextVar[Callback | None] = contextvars.ContextVar("dql_pass_verify_progress", default=None)


@contextlib.contextmanager
def reporting(callback: Callback | None) -> Iterator[None]:
    token = _callback.set(callback)
    try:
        yield
    finally:
        _callback.reset(token)


def advance(stage: str, done: int, total: int) -> None:
    callback = _callback.get()
    if callback is not None:
        callback(stage, done, total)
