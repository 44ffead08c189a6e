"""Alibaba's MNN on the CPU: ONNX converted to a ``.mnn`` file by the converter inside the ``MNN``
wheel, then run through MNN's Python module API, both in processes of their own
(:mod:`dql_pass.runtimes.mnn_worker`, run by :mod:`dql_pass.runtimes.worker`).

Rules:

- The converter is called through the wheel's extension module (``_tools.mnnconvert``), never
  through the ``mnnconvert`` console script nor anything under ``MNN.tools``: importing
  ``MNN.tools`` runs ``MNN/tools/utils/log.py``, which ``pip install``s a logging SDK into the first
  Python on PATH and then uploads usage logs (model size, arguments, machine id). Nothing else in
  MNN's Python sources (3.6.1) opens a connection or starts a process.
- The converter and the run worker are kept apart as LiteRT's converter is
  (:mod:`dql_pass.runtimes.isolated`): no network where the system allows a namespace of their
  own, and the temporary folder as their home and scratch folder.
- The converter gets a private copy of the model in a temporary folder, writes beside it, and
  runs in a fresh process with a timeout: it crashes on some models (a QuantizeLinear with a
  run-time scale, a Cast of a graph input), which is then a :class:`RuntimeFailure` with its
  reason. It keeps subnormal constants (by default it flushes them to 0), Erf, and MatMul as
  written (by default a MatMul by a constant becomes a 1x1 Conv, which is not exact on integers).
- A session is a worker process that loads the ``.mnn`` file once and runs each feed: MNN
  crashes on some inputs (an empty tensor into a reduction), which fails that run with the reason;
  the next run starts a new worker, as after any failed run, which can leave MNN's module giving
  no outputs. An empty output is built from the shape and type MNN gives: its ``read`` fails on
  one of shape [2, 0].
- MNN has no bool and computes int64 in int32: such outputs come back as the declared type.
- ``threads`` > 0 is MNN's ``thread_num`` (default 1); ``optimize`` is ignored: the converter
  always optimizes an ONNX graph (its level 0 is for MNN sources only). MNN runs in float32
  (``PrecisionMode.High``).
"""

from __future__ import annotations

__all__ = ["CONVERT_SECONDS", "RUN_SECONDS", "Mnn", "start_worker", "worker_command"]

import contextlib
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dql_pass.op import OUTPUTS
from dql_pass.runtimes import isolated, worker
from dql_pass.runtimes.base import (
    TIMEOUT_OPTION, InexactProduct, KnownDifference, Lack, Runtime, RuntimeFailure, RuntimeTimeout, Session,
    dequantizes_otherwise, quantizes_otherwise,
)
from dql_pass.runtimes.sessions import as_file, conform, fed_inputs, hold, output_types
from dql_pass.runtimes.worker import Worker

CONVERT_SECONDS = 600.0  # a MiniLM converts in seconds; a hung converter is stopped
RUN_SECONDS = 600.0


def worker_command(*arguments: str) -> list[str]:
    """The command that runs MNN's worker (:mod:`dql_pass.runtimes.mnn_worker`) with ``arguments``."""
    return worker.command("mnn", *arguments)


def _why(output: str) -> str:
    """The converter's complaint in one line: its lines that name an error or an unsupported op."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    words = ("error", "not support", "don't support", "fail")
    telling = [line for line in lines if any(word in line.lower() for word in words)]
    return "; ".join(dict.fromkeys(telling or lines[-1:]))[:400]


def convert(source: Path, target: Path, timeout: float = CONVERT_SECONDS) -> None:
    """ONNX file ``source`` converted into MNN file ``target`` by a process working in ``target``'s
    folder; :class:`RuntimeFailure` with the reason when the converter refuses, crashes or hangs."""
    try:
        done = subprocess.run(isolated.command(worker_command("convert", str(source), str(target))),
                              cwd=target.parent, env=isolated.worker_environ(target.parent), timeout=timeout,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace")
    except subprocess.TimeoutExpired as error:
        raise RuntimeTimeout(f"a timeout: MNN's converter did not finish in {timeout:g} s; {TIMEOUT_OPTION} gives it "
                             "longer") from error
    output = done.stdout + done.stderr
    if done.returncode < 0:
        raise RuntimeFailure(f"MNN's converter crashed ({worker.crash(done.returncode)}) on this model: {_why(output)}")
    if done.returncode or not target.is_file():
        raise RuntimeFailure(f"MNN's converter refused the model: {_why(output)}")


def start_worker(model: Path, threads: int, inputs: Sequence[str], outputs: Sequence[str], seconds: float) -> Worker:
    """A worker that has loaded the MNN file ``model``; RuntimeFailure with the reason."""
    started = Worker("MNN", worker_command("serve"), model.parent)
    try:
        started.ask("load", str(model), threads, list(inputs), list(outputs), seconds=seconds,
                    doing="loading the model")
    except RuntimeFailure:
        started.stop()
        raise
    return started


def _widened(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """MNN's int32 where the model declares bool or int64, as the declared type: the same values."""
    if array.dtype == np.int32 and dtype == np.bool_ and np.isin(array, (0, 1)).all():
        return array.astype(np.bool_)
    if array.dtype == np.int32 and dtype == np.int64:
        return array.astype(np.int64)
    return array


class _MnnSession(Session):
    def __init__(self, model: Path, threads: int, inputs: Sequence[str], outputs: Sequence[str],
                 types: Sequence[np.dtype], seconds: float) -> None:
        super().__init__(inputs, outputs)
        self._start = lambda: start_worker(model, threads, inputs, outputs, seconds)
        self._worker = self._start()
        self._types = list(types)
        self._seconds = seconds

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        if not self._worker.alive():  # the last run failed
            self._worker = self._start()
        arrays = [np.require(array, requirements="C") for array in self.fed(feeds)]
        try:
            got = self._worker.ask("run", arrays, seconds=self._seconds, doing="on this input")
        except RuntimeFailure:
            self._worker.stop()  # a failed run can leave MNN's module giving no outputs to the next ones (measured)
            raise
        return self.chosen([conform(_widened(a, t), t) for a, t in zip(got, self._types)], outputs)


class Mnn(Runtime):
    name = "mnn"
    module = "MNN"
    distribution = "MNN"
    extra = "mnn"
    # No Round, Div by a constant, float64, empty reduction, or Less that an int32 compare of the bits gets wrong
    # (lean has such Less: 127 of 1,256 inputs exact).
    variant = "portable"
    # lower's default, float: MNN's converter folds integer weights' Cast and Sub into float32
    # constants, so the .mnn file an app ships is as large either way (lowered MLP: 161,040 bytes
    # from integer weights, 161,136 from float), and both give ORT's bits.
    lacks = (
        Lack("mnn", "DynamicQuantizeLinear", 11, "3.6.1",
             "MNN's DynamicQuantizeLinear is its own int8 scheme: y as int8, the zero point as a float32 minus 128, "
             "the scale of shape [1], and 0 left out of the range ([0.1, 0.2, 0.3] gives scale 0.00078, not 0.00118)"),
        Lack("mnn", "QuantizeLinear", 10, "3.6.1",
             "MNN's converter crashes (SIGSEGV) on a QuantizeLinear whose scale is computed at run time",
             unless_constant=(1, 2)),
        *(Lack("mnn", op_type, 10, "3.6.1", f"MNN's converter: These Op Not Support: ONNX::{op_type}")
          for op_type in ("ConvInteger", "MatMulInteger")),
    )
    _ROUNDING = ("arithmetic", "float64", "residual")
    computed_otherwise = (
        dequantizes_otherwise("mnn", "3.6.1", 192),
        quantizes_otherwise("mnn", "3.6.1", 128),
    )
    known_differences = (
        KnownDifference(_ROUNDING, "near tie", "measured: MNN's Round rounds half away from zero (2.5 to 3)",
                        outputs=("y", "y_zero_point")),
        KnownDifference(_ROUNDING, "reciprocal",
                        "measured: MNN's converter folds Div by the constant 255 into a Mul by float32(1/255), and MNN "
                        "computes float64 as float32, so the scale is the range times that reciprocal",
                        outputs=OUTPUTS),
        KnownDifference(_ROUNDING, "x/scale overflows to +inf",
                        "measured: where the scale underflows to 0, MNN gives the zero point 0; the contract saturates "
                        "it to 255", outputs=("y", "y_zero_point")),
        KnownDifference(_ROUNDING, "infinite",
                        "measured: with +inf in x, MNN gives y 255 for the NaN quotient inf/inf (the contract: 0); "
                        "with -inf, the zero point 0 for inf/inf (the contract saturates it to 255)",
                        outputs=("y", "y_zero_point")),
        KnownDifference(("arithmetic",), "empty", "measured: MNN crashes (SIGSEGV) reducing an empty tensor",
                        outputs=OUTPUTS),
        KnownDifference(("residual", "lean"), None,
                        "measured: MNN's Less compares float bits as int32, wrong when both operands are negative "
                        "(a one-node Less: -2 < -1 false, -0 < 0 true), as the residual variant's test of its rounded "
                        "scale and lean's thresholds have them (on inputs of any class)",
                        outputs=OUTPUTS),
    )

    inexact_products = (
        InexactProduct("mnn", "ConvInteger", "3.6.1",
                       "MNN's float32 Conv of integer values is not their integer sum (a 3x3 Conv of 16 to 32 channels "
                       "over 32x32: 1,072 of 28,800 outputs exact, up to 271 off on sums below 2^20): its Winograd "
                       "kernels, which MNN uses unless the app sets the hint WINOGRAD_MEMORY_LEVEL to 0 or 1"),
    )

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        import onnx

        with contextlib.ExitStack() as files:
            # A private copy in a temporary folder of its own: the converter writes beside it.
            path = files.enter_context(as_file(model))
            proto = onnx.load(path, load_external_data=False)
            target = path.with_name("model.mnn")
            convert(path, target, self.timeout or CONVERT_SECONDS)
            session = _MnnSession(target, threads, [v.name for v in fed_inputs(proto)],
                                  [v.name for v in proto.graph.output], output_types(proto),
                                  self.timeout or RUN_SECONDS)
            kept = files.pop_all()
        # A new worker reads the file again: the folder lives as long as the session.
        hold(session, kept.close)
        return session
