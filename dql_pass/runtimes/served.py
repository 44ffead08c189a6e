"""A runtime whose sessions share one worker process (:mod:`dql_pass.runtimes.worker`), for a runtime that can
end the process it runs in: tract (a panic in its Rust code aborts) and OpenVINO (its CPU plugin dies with
SIGSEGV or SIGFPE compiling some models). Each session's model is loaded in the worker under a key of its
own, and loaded again in a new worker after a crash, which fails only the request it ended.

The worker module ``RUNTIME_worker.py`` answers ``load(KEY, PATH, *arguments)``, ``run(KEY, arrays)`` (the
outputs in the graph's order) and ``drop(KEY)``.
"""

from __future__ import annotations

__all__ = ["RUN_SECONDS", "ServedRuntime"]

import contextlib
import itertools
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dql_pass.runtimes import worker
from dql_pass.runtimes.base import Runtime, Session
from dql_pass.runtimes.sessions import as_file, conform, fed_inputs, hold, output_types

RUN_SECONDS = 600.0  # to load a model, or to compile and run it once: a hung worker is stopped
_KEYS = itertools.count()


def _drop(worker_ref: weakref.ref[worker.Worker], key: int) -> None:
    """Tell the worker, if it is still there, that the model of ``key`` is no longer needed."""
    current = worker_ref()
    if current is not None:
        current.drop(key)


class _ServedSession(Session):
    """A model loaded in the runtime's worker, loaded again in a new one after a crash."""

    def __init__(self, runtime: ServedRuntime, path: Path, arguments: Sequence[object], inputs: Sequence[str],
                 outputs: Sequence[str], types: Sequence[np.dtype | None]) -> None:
        super().__init__(inputs, outputs)
        self._runtime, self._path, self._arguments, self._types = runtime, path, tuple(arguments), list(types)
        self._key = next(_KEYS)
        self._worker: weakref.ref[worker.Worker] | None = None
        self._loaded()  # a model the runtime cannot read fails here, not at its first run

    def _loaded(self) -> worker.Worker:
        current = self._runtime.worker()
        if self._worker is None or current is not self._worker():
            current.ask("load", self._key, str(self._path), *self._arguments, seconds=self._runtime.seconds(),
                        doing="loading the model")
            self._worker = weakref.ref(current)  # a worker replaced is not kept, nor its folder
            weakref.finalize(self, _drop, self._worker, self._key)
        return current

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        arrays = [np.require(array, requirements="C") for array in self.fed(feeds)]
        results = self._loaded().ask("run", self._key, arrays, seconds=self._runtime.seconds(), doing="on this input")
        return self.chosen([conform(r, t) for r, t in zip(results, self._types)], outputs)


class ServedRuntime(Runtime):
    """A runtime run in one worker that every session of it shares: its worker module is ``NAME_worker.py``."""

    _worker: worker.Worker | None = None

    def why(self, stderr: str) -> str | None:
        """The reason of a crash, found in the end of the worker's stderr (None: not said)."""
        return None

    def seconds(self) -> float:
        """How long one request to the worker may take: --runtime-timeout's, or :data:`RUN_SECONDS`."""
        return self.timeout or RUN_SECONDS

    def worker(self) -> worker.Worker:
        """The worker every session runs in: a new one where the last has crashed or was killed."""
        if self._worker is None or not self._worker.alive():
            if self._worker is not None:
                self._worker.stop()  # dead between requests (the OOM killer): its pipes and stderr closed now
            folder = tempfile.TemporaryDirectory(prefix="dql_pass.")  # its home and scratch folder
            self._worker = worker.Worker(self.name, worker.command(self.name, "serve"), Path(folder.name), why=self.why)
            hold(self._worker, folder.cleanup)
        return self._worker

    def prepare(self, proto) -> None:
        """Edit ``proto``, the model file's copy, before the worker reads it (nothing by default)."""

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        import onnx  # here: listing the runtimes needs no graph library

        with contextlib.ExitStack() as files:
            path = files.enter_context(as_file(model))  # a copy of our own, even of a file: it is edited
            proto = onnx.load(path, load_external_data=False)
            self.prepare(proto)
            onnx.save(proto, path)
            # Names from the file, outputs by position: a runtime may name a port otherwise than the graph.
            session = _ServedSession(self, path, self.load_arguments(threads=threads),
                                     [value.name for value in fed_inputs(proto)],
                                     [value.name for value in proto.graph.output], output_types(proto))
            kept = files.pop_all()  # the worker reads the file again for each new input shape, and after a crash
        hold(session, kept.close)
        return session

    def load_arguments(self, *, threads: int) -> tuple[object, ...]:
        """What the worker's ``load`` takes after the key and the path (nothing by default)."""
        return ()
