"""tract (Sonos' Rust engine): reads ONNX files, and needs every input's shape and type fixed
before it analyses and optimizes a model, so a model compiles once per input shape.

tract runs in a worker process (:mod:`dql_pass.runtimes.tract_worker`), one for every session of the
command: a panic in its Rust code aborts the process it runs in (a model that asks for a tensor too large
to allocate, measured), which is then that run's failure with the panic's message, and the next run starts
a new worker. ``threads`` and ``optimize`` are ignored: the Python bindings have no thread setting, and
``into_runnable`` always optimizes.
"""

from __future__ import annotations

__all__ = ["RUN_SECONDS", "Tract"]

import contextlib
import itertools
import re
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dql_pass.op import OUTPUTS
from dql_pass.runtimes import worker
from dql_pass.runtimes.base import KnownDifference, Lack, Runtime, Session
from dql_pass.runtimes.sessions import as_file, conform, fed_inputs, hold, output_types

RUN_SECONDS = 600.0  # to load a model, or to compile and run it once: a hung worker is stopped
_KEYS = itertools.count()
_PANIC = re.compile(r"panicked at [^\n]*:\n(.+)")


def _panic(stderr: str) -> str | None:
    """The message of the panic that ended tract's worker."""
    found = _PANIC.search(stderr)
    return found.group(1).strip() if found else None


def _drop(worker_ref: weakref.ref[worker.Worker], key: int) -> None:
    """Tell the worker, if it is still there, that the model of ``key`` is no longer needed."""
    current = worker_ref()
    if current is not None:
        current.drop(key)


class _TractSession(Session):
    """A model loaded in the runtime's worker, loaded again in a new one after a crash."""

    def __init__(self, runtime: Tract, path: Path, inputs: Sequence[str], outputs: Sequence[str],
                 types: Sequence[np.dtype | None]) -> None:
        super().__init__(inputs, outputs)
        self._runtime, self._path, self._types = runtime, path, list(types)
        self._key = next(_KEYS)
        self._worker: weakref.ref[worker.Worker] | None = None
        self._loaded()  # a model tract cannot read fails here, not at its first run

    def _loaded(self) -> worker.Worker:
        current = self._runtime.worker()
        if self._worker is None or current is not self._worker():
            current.ask("load", self._key, str(self._path), seconds=self._runtime.seconds(), doing="loading the model")
            self._worker = weakref.ref(current)  # a worker replaced is not kept, nor its folder
            weakref.finalize(self, _drop, self._worker, self._key)
        return current

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        arrays = [np.asarray(array) for array in self.fed(feeds)]
        results = self._loaded().ask("run", self._key, arrays, seconds=self._runtime.seconds(), doing="on this input")
        return self.chosen([conform(r, t) for r, t in zip(results, self._types)], outputs)


class Tract(Runtime):
    name = "tract"
    module = "tract"
    distribution = "tract"
    extra = "tract"
    variant = "float64"
    lacks = (
        Lack("tract", "QuantizeLinear", 10, "0.23.9",
             "tract refuses QuantizeLinear whose scale is not a constant: 'y_scale must be a const'",
             unless_constant=(1, 2)),
    )
    known_differences = (
        KnownDifference(("native",), "zero range",
                        "measured: tract's DynamicQuantizeLinear gives a zero range (all zero, or empty) the scale 0",
                        outputs=("y_scale",)),
        KnownDifference(("native",), "x/scale overflows to +inf",
                        "measured: where the scale underflows to 0, tract's DynamicQuantizeLinear gives the zero "
                        "point 0 for 0/0 and y 0 for x/0 = +inf; the contract saturates both to 255",
                        outputs=("y", "y_zero_point")),
        KnownDifference(("native",), "infinite",
                        "measured: with -inf in x, tract's DynamicQuantizeLinear gives the zero point 0 for "
                        "inf/inf and y 0 everywhere; the contract saturates that zero point to 255",
                        outputs=("y", "y_zero_point")),
        KnownDifference(("arithmetic",), "reciprocal",
                        "measured: tract computes every float32 Div as a multiplication by the reciprocal",
                        outputs=OUTPUTS),
        KnownDifference(("residual",), "tiny scale",
                        "measured: with a scale near 1.5e-38 the residual variant's remainders fall out of the "
                        "normal float32 range, where tract loses their low bits (1 of 1,256 inputs)",
                        outputs=("y_scale",)),
    )

    _worker: worker.Worker | None = None

    def seconds(self) -> float:
        """How long one request to the worker may take: --runtime-timeout's, or :data:`RUN_SECONDS`."""
        return self.timeout or RUN_SECONDS

    def worker(self) -> worker.Worker:
        """The worker every session runs in: a new one where the last has crashed or was killed."""
        if self._worker is None or not self._worker.alive():
            if self._worker is not None:
                self._worker.stop()  # dead between requests (the OOM killer): its pipes and stderr closed now
            folder = tempfile.TemporaryDirectory(prefix="dql_pass.")  # its home and scratch folder
            self._worker = worker.Worker("tract", worker.command("tract", "serve"), Path(folder.name), why=_panic)
            hold(self._worker, folder.cleanup)
        return self._worker

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        import onnx  # here: listing the runtimes needs no graph library

        with contextlib.ExitStack() as files:
            # A copy of our own, even of a file: its shapes are about to go.
            path = files.enter_context(as_file(model))
            proto = onnx.load(path, load_external_data=False)
            # tract fails to unify the symbolic dims of value_info and graph outputs ("batch") with the
            # input facts set per run (2): without them it infers every shape from the facts.
            del proto.graph.value_info[:]
            for output in proto.graph.output:
                output.type.tensor_type.ClearField("shape")
            onnx.save(proto, path)
            # Names from the file: tract's output_name gives a multi-output node's first output for each.
            session = _TractSession(self, path, [value.name for value in fed_inputs(proto)],
                                    [value.name for value in proto.graph.output], output_types(proto))
            kept = files.pop_all()  # the worker reads the file again for each new input shape, and after a crash
        hold(session, kept.close)
        return session
