"""The process that runs MNN for :mod:`dql_pass.runtimes.mnn`, started by path so that it needs
numpy and MNN only (not dql_pass, nor the caller's ``__main__``).

``convert SOURCE TARGET``: the ONNX file SOURCE converted into the MNN file TARGET through the
converter's extension module ``_tools``; exit status 1 when it refuses. Never ``MNN.tools``, whose
import installs a logging SDK and uploads usage logs (see :mod:`dql_pass.runtimes.mnn`).

``serve MODEL THREADS INPUTS OUTPUTS``: MODEL loaded once (the names as JSON lists), then one
pickled list of input arrays read from stdin per run, answered on the original stdout with a
pickled ``("ok", arrays)`` or ``("error", message)``; the process ends at the end of stdin. MNN's
own prints go to stderr, so that they never mix with the answers.
"""

import json
import os
import pickle
import sys

if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # this folder: its torch.py and tvm.py would stand for the real ones

import numpy as np  # noqa: E402


def convert(source: str, target: str) -> int:
    import _tools

    arguments = ["mnnconvert", "-f", "ONNX", "--modelFile", source, "--MNNModel", target, "--bizCode", "dql_pass",
                 # Subnormal constants kept (by default they become 0), Erf not approximated, and MatMul
                 # kept: the 1x1 Conv it becomes by default is 1 off on integer sums near 2^24.
                 "--alignDenormalizedValue", "0", "--useGeluApproximation", "0", "--convertMatmulToConv", "0"]
    return 0 if _tools.mnnconvert(arguments) else 1


def _read(result, to_numpy) -> np.ndarray:
    # An empty output from its shape and type: MNN's read fails on one of shape [2, 0].
    return np.empty(result.shape, to_numpy[result.dtype]) if 0 in result.shape else np.array(result.read())


def serve(model: str, threads: int, inputs: list[str], outputs: list[str]) -> int:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    import MNN.expr as expr
    import MNN.nn as nn

    pairs = [(np.dtype(numpy_type), mnn_type) for numpy_type, mnn_type in (
        (np.float32, expr.float), (np.float64, expr.double), (np.int32, expr.int), (np.int64, expr.int64),
        (np.uint8, expr.uint8), (np.int8, expr.int8))]
    to_mnn, to_numpy = dict(pairs), {mnn_type: numpy_type for numpy_type, mnn_type in pairs}
    config = {"precision_mode": expr.PrecisionMode.High}  # Normal may pick float16 where the CPU has it
    if threads > 0:
        config["thread_num"] = threads

    def answer(*message) -> None:
        pickle.dump(message, answers)
        answers.flush()

    try:
        module = nn.load_module_from_file(model, inputs, outputs, **config)
    except Exception as error:
        answer("error", f"{type(error).__name__}: {error}")
        return 1
    answer("ok", [])
    while True:
        try:
            arrays = pickle.load(sys.stdin.buffer)
        except EOFError:
            return 0
        try:
            if any(a.dtype not in to_mnn for a in arrays):
                raise TypeError(f"MNN takes no input of type {next(a.dtype for a in arrays if a.dtype not in to_mnn)}")
            values = [expr.const(a, list(a.shape), expr.NCHW, to_mnn[a.dtype]) for a in arrays]
            results = module.forward(values)
            if len(results) != len(outputs):  # what went wrong, MNN prints on stderr
                raise RuntimeError(f"MNN gave {len(results)} of the model's {len(outputs)} outputs")
            answer("ok", [_read(r, to_numpy) for r in results])
        except Exception as error:
            answer("error", f"{type(error).__name__}: {error}")


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "convert":
        sys.exit(convert(*rest))
    model, threads, inputs, outputs = rest
    sys.exit(serve(model, int(threads), json.loads(inputs), json.loads(outputs)))
