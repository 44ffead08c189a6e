"""tools.runtimes when a runtime kills its measuring process: the step it died in (a form's load of a
rank, or the run of one input) is not taken again, it reads as a refusal, and the process starts
again, so that one crashing input costs that input, not the runtime's rows."""

from __future__ import annotations

import os
import signal

import numpy as np

from tools import runtimes as tool

_DEATH = "the process died (exit code -8)"


class _Told:
    """A pipe end that keeps what is sent."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, message) -> None:
        self.sent.append(message)


class _Echo:
    """A runtime whose sessions give x back, counting their runs."""

    def __init__(self) -> None:
        self.runs = 0

    def load(self, model):
        runtime = self

        class Session:
            def run(self, feeds):
                runtime.runs += 1
                return [feeds["x"]]

            def close(self):
                pass

        return Session()


def test_a_step_that_killed_a_process_is_not_taken_again_and_reads_as_a_refusal():
    runtime, told = _Echo(), _Told()
    arrays = [np.full(1, i, np.float32) for i in range(3)] + [np.zeros((1, 1), np.float32)]
    watch = tool.Watch(told, {("lean", 21, "run", 1): _DEATH, ("lean", 21, "load", 2): _DEATH})
    outcomes, _ = tool._run_by_rank(runtime, "lean", 21, arrays, watch)
    assert [o[0].item() for o in (outcomes[0], outcomes[2])] == [0, 2] and runtime.runs == 2
    assert outcomes[1] == f"does not run: {_DEATH}" and outcomes[3] == f"does not load: {_DEATH}"
    # Each step taken is told before it begins and when it ends; the skipped ones are not.
    assert told.sent == [("begin", ("lean", 21, "load", 1)), ("end", None),
                         ("begin", ("lean", 21, "run", 0)), ("end", None),
                         ("begin", ("lean", 21, "run", 2)), ("end", None)]


def _dying_child(name, config, transformer, send, deaths) -> None:
    """A measurement that dies (SIGFPE) running input 1, unless told it did before; its result's
    version names the steps it was told of."""
    watch = tool.Watch(send, deaths)
    for i in range(3):
        if watch.begin(("lean", 21, "run", i)) is None:
            if i == 1:
                os.kill(os.getpid(), signal.SIGFPE)
            watch.end()
    send.send(tool.RuntimeResult(name, repr(sorted(deaths.items())), "", "lean"))


def test_a_process_that_dies_in_a_step_starts_again_without_it():
    # Two processes are spawned (some seconds): what is tested is the restart between them.
    results = tool._in_processes(["onnxruntime"], tool.CONFIGS["quick"], None, 1, child=_dying_child)
    result = results["onnxruntime"]
    assert result.error is None
    assert result.version == repr([(("lean", 21, "run", 1), _DEATH)])
