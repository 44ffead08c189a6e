"""OpenVINO in a worker process (:mod:`dql_pass.runtimes.worker_main` runs it, for :mod:`dql_pass.runtimes.openvino`):
its CPU plugin dies (SIGSEGV) compiling some models, ending the process it runs in.

``load(KEY, PATH, THREADS)`` reads the ONNX file PATH (a model the plugin cannot read fails here, not at its
first run); ``run(KEY, arrays)`` runs it, compiled once per set of input shapes (the plugin refuses an input
of unknown rank, and a fixed shape is what it optimizes best); ``drop(KEY)`` forgets it. The plugin raises
builtin RuntimeErrors: those of its calls are its refusals (OpenVINOError), any other exception a bug of
this module's.
"""

import contextlib
import sys

import numpy as np

FAILURES = ("openvino_worker",)  # OpenVINOError, the plugin's refusals: any other exception is a bug of ours
_models = {}  # key: (core, model read, config, {input shapes: compiled model})


class OpenVINOError(Exception):
    """The plugin's refusal: a RuntimeError of one of its calls, or a compile that would kill it."""


@contextlib.contextmanager
def _plugin():
    try:
        yield
    except RuntimeError as error:
        raise OpenVINOError(str(error)) from None


def _openvino():
    """The openvino module, imported without its telemetry."""
    # `import openvino` starts openvino-telemetry, which writes a client id and usage stats under
    # $HOME/intel and sends an "import" event to Google Analytics; where that package does not
    # import, OpenVINO uses its own no-op stub. Nothing dql_pass runs may reach the network.
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)
    import openvino

    return openvino


def load(key: int, path: str, threads: int) -> None:
    config = {"INFERENCE_PRECISION_HINT": "f32"}
    if threads > 0:
        config["INFERENCE_NUM_THREADS"] = threads
    with _plugin():
        core = _openvino().Core()
        _models[key] = (core, core.read_model(path), config, {})


def _refuse_empty_gathers(model) -> None:
    """A refusal, where compiling would kill the worker: the CPU plugin dies (SIGFPE) compiling a
    Gather whose indices are empty (measured on a three-node model, and on the lean variant's for an
    empty x)."""
    for node in model.get_ordered_ops():
        if node.get_type_name() == "Gather":
            indices = node.input_value(1).get_partial_shape()
            if indices.is_static and 0 in indices.to_shape():
                raise OpenVINOError("the CPU plugin dies (SIGFPE) compiling a Gather with empty indices; not run")


def run(key: int, arrays: list) -> list:
    core, read, config, compiled = _models[key]
    shapes = tuple(a.shape for a in arrays)
    with _plugin():
        if shapes not in compiled:
            fixed = read.clone()
            fixed.reshape({index: list(shape) for index, shape in enumerate(shapes)})
            _refuse_empty_gathers(fixed)
            compiled[shapes] = core.compile_model(fixed, "CPU", config)
        model = compiled[shapes]
        results = model.create_infer_request().infer(dict(enumerate(arrays)))
        return [np.array(results[port]) for port in model.outputs]


def drop(key: int) -> None:
    _models.pop(key, None)
