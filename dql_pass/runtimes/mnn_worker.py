"""MNN in a worker process (:mod:`dql_pass.runtimes.worker_main` runs it, for :mod:`dql_pass.runtimes.mnn`).

``convert(SOURCE, TARGET)``: the ONNX file SOURCE converted into the MNN file TARGET through the converter's
extension module ``_tools``; exit status 1 when it refuses. Never ``MNN.tools``, whose import installs a
logging SDK and uploads usage logs (see :mod:`dql_pass.runtimes.mnn`).

``load(MODEL, THREADS, INPUTS, OUTPUTS)`` loads MODEL, the one model of the process; ``run(arrays)`` runs it.
"""

import numpy as np

_loaded = {}


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


def load(model: str, threads: int, inputs: list, outputs: list) -> None:
    import MNN.expr as expr
    import MNN.nn as nn

    pairs = [(np.dtype(numpy_type), mnn_type) for numpy_type, mnn_type in (
        (np.float32, expr.float), (np.float64, expr.double), (np.int32, expr.int), (np.int64, expr.int64),
        (np.uint8, expr.uint8), (np.int8, expr.int8))]
    config = {"precision_mode": expr.PrecisionMode.High}  # Normal may pick float16 where the CPU has it
    if threads > 0:
        config["thread_num"] = threads
    _loaded.update(module=nn.load_module_from_file(model, inputs, outputs, **config), outputs=outputs,
                   to_mnn=dict(pairs), to_numpy={mnn_type: numpy_type for numpy_type, mnn_type in pairs})


def run(arrays: list) -> list:
    import MNN.expr as expr

    to_mnn = _loaded["to_mnn"]
    if any(a.dtype not in to_mnn for a in arrays):
        raise TypeError(f"MNN takes no input of type {next(a.dtype for a in arrays if a.dtype not in to_mnn)}")
    values = [expr.const(a, list(a.shape), expr.NCHW, to_mnn[a.dtype]) for a in arrays]
    results = _loaded["module"].forward(values)
    if len(results) != len(_loaded["outputs"]):  # what went wrong, MNN prints on stderr
        raise RuntimeError(f"MNN gave {len(results)} of the model's {len(_loaded['outputs'])} outputs")
    return [_read(r, _loaded["to_numpy"]) for r in results]
