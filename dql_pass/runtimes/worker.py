"""A runtime run in a process of its own, a worker, for a runtime whose failure can end the process it runs in
(MNN's segfaults, OpenVINO's CPU plugin dying as it compiles, a panic in tract's Rust code, which aborts): a
crash or a hang fails the one request with its reason, and the next request starts a new worker.

The worker is :mod:`dql_pass.runtimes.worker_main` running the module ``RUNTIME_worker.py`` beside it, kept
apart as every third-party tool is (:mod:`dql_pass.runtimes.isolated`): no network, its folder as its home and
scratch folder. Each request is a pickled ``(function, arguments, dropped)`` on its stdin, the call of that
function of the module; its answer a pickled ``("ok", value)``, ``("error", message)`` (the runtime's refusal:
:class:`RuntimeFailure`) or ``("bug", traceback)`` (:class:`WorkerBug`) on its stdout.
"""

from __future__ import annotations

__all__ = ["Worker", "WorkerBug", "command", "crash"]

import contextlib
import os
import pickle
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from dql_pass.runtimes import isolated
from dql_pass.runtimes.base import TIMEOUT_OPTION, RuntimeFailure, RuntimeTimeout
from dql_pass.runtimes.worker_main import PARENT

_MAIN = Path(__file__).with_name("worker_main.py")
_STDERR_TAIL = 1 << 16  # what a crash's reason is looked for in: the end of the worker's stderr
# The pipes' capacity (Linux's default limit for a process without privileges): at the default 64 KiB, a 4 MiB
# array crossed in 64 wake-ups each way, and OpenVINO's threads made each one slow.
_PIPE_BYTES = 1 << 20


def command(runtime: str, *arguments: str) -> list[str]:
    """The command that runs the worker module of ``runtime`` (``RUNTIME_worker.py``): ``serve`` answers
    requests; any other first argument calls that function of the module once (MNN's ``convert``)."""
    return [sys.executable, str(_MAIN), runtime, *arguments]


def crash(returncode: int) -> str:
    """How a process ended, in words: the signal that killed it, or its exit status."""
    return signal.Signals(-returncode).name if returncode < 0 else f"exit status {returncode}"


class WorkerBug(RuntimeError):
    """An exception in the worker that is not the runtime's refusal: a bug of ours, with the worker's traceback."""


class Worker:
    """A process that answers requests until it crashes or is stopped. ``name`` is the runtime as messages
    name it; ``why`` finds the reason of a crash in the end of the worker's stderr (None: not said)."""

    def __init__(
        self, name: str, arguments: Sequence[str], folder: Path, why: Callable[[str], str | None] = lambda _: None
    ) -> None:
        self.name = name
        self._why = why
        self._stderr = tempfile.TemporaryFile(dir=folder)
        environ = {**isolated.worker_environ(folder), PARENT: str(os.getpid())}  # it ends when this process does
        self._process = subprocess.Popen(isolated.command(arguments), cwd=folder, env=environ,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
        self._stop = weakref.finalize(self, _stop, self._process, self._stderr)
        for pipe in (self._process.stdin, self._process.stdout):
            _widen(pipe)
        self._dropped: list[object] = []
        self._lock = threading.Lock()  # one request and its answer at a time, whatever thread asks

    def ask(self, function: str, *arguments: object, seconds: float, doing: str) -> object:
        """The value of the worker module's ``function(*arguments)``; RuntimeFailure with the reason, or
        RuntimeTimeout after ``seconds``. ``doing`` says what the request does, for those messages."""
        with self._lock:
            dropped, self._dropped = self._dropped, []  # a finalizer may add more meanwhile: the next request's
            try:
                pickle.dump((function, arguments, dropped), self._process.stdin)
                self._process.stdin.flush()
                status, answer = _answer(self._process, seconds)
            except (EOFError, BrokenPipeError) as error:
                raise self._crashed(doing) from error
            except subprocess.TimeoutExpired:
                self.stop()
                raise RuntimeTimeout(f"a timeout: {self.name} did not answer within {seconds:g} s {doing}; "
                                     f"{TIMEOUT_OPTION} gives it longer") from None
            except BaseException:  # Ctrl-C between the request and its answer: that answer would be the next one's
                self._process.kill()
                self.stop()
                raise
        if status == "bug":
            raise WorkerBug(f"in {self.name}'s worker:\n{answer}")
        if status != "ok":
            raise RuntimeFailure(answer)
        return answer

    def _crashed(self, doing: str) -> RuntimeFailure:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5)  # all it said before it ended
        why = self._why(self._tail())
        self.stop()
        return RuntimeFailure(f"{self.name} crashed ({crash(self._process.returncode)}) {doing}"
                              + (f": {why}" if why else ""))

    def drop(self, key: object) -> None:
        """Tell the worker, with the next request, that ``key`` is no longer needed; safe in a finalizer."""
        self._dropped.append(key)

    def alive(self) -> bool:
        """Whether it still answers: not stopped, and not dead (a crash, or the system's OOM killer)."""
        return self._stop.alive and self._process.poll() is None

    def stop(self) -> None:
        """End the worker: at the end of its input, or killed when it does not end by itself."""
        self._stop()

    def _tail(self) -> str:
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - _STDERR_TAIL))
        return self._stderr.read().decode(errors="replace")


def _widen(pipe: IO[bytes]) -> None:
    """``pipe`` at :data:`_PIPE_BYTES`, where the system allows it (Linux, within its limit)."""
    try:
        import fcntl

        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (ImportError, AttributeError, OSError):  # another system, or a lower limit: the default capacity
        pass


def _answer(process: subprocess.Popen, seconds: float) -> tuple[str, object]:
    """The worker's next answer, within ``seconds``; EOFError when it died."""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(seconds):
            raise subprocess.TimeoutExpired(process.args, seconds)
    return pickle.load(process.stdout)


def _stop(process: subprocess.Popen, stderr: IO[bytes]) -> None:
    with contextlib.suppress(OSError):
        process.stdin.close()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    process.stdout.close()
    stderr.close()
