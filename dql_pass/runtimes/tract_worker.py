"""tract in a worker process (:mod:`dql_pass.runtimes.worker_main` runs it, for :mod:`dql_pass.runtimes.tract`):
a panic in tract's Rust code (an allocation it cannot make, say) aborts the process it runs in.

``load(KEY, PATH)`` reads the ONNX file PATH (a model tract cannot read fails here, not at its first run);
``run(KEY, arrays)`` runs it, compiled once per set of input shapes and types (tract fixes them before it
optimizes); ``drop(KEY)`` forgets it. One process serves every session of the command. Its environment has
no RUST_BACKTRACE, so tract's errors and panics come without Rust's stack trace.
"""

import numpy as np

FAILURES = ("tract",)  # the runtime's refusals: any other exception is a bug of this module's
_models = {}  # key: (path, {input signature: runnable})


def _fact(shape, dtype) -> str:
    """tract's spelling of an input fact: ``"2,16,f32"``, or ``"f32"`` for a scalar."""
    kind = "bool" if dtype == np.bool_ else f"{dtype.kind}{dtype.itemsize * 8}"
    return ",".join([*map(str, shape), kind])


def load(key: int, path: str) -> None:
    import tract

    tract.onnx().load(path)
    _models[key] = (path, {})


def run(key: int, arrays: list) -> list:
    import tract

    path, compiled = _models[key]
    arrays = [np.require(a, requirements="C") for a in arrays]
    signature = tuple((a.shape, a.dtype) for a in arrays)
    if signature not in compiled:
        inference = tract.onnx().load(path)
        for index, (shape, dtype) in enumerate(signature):
            inference.set_input_fact(index, _fact(shape, dtype))
        compiled[signature] = inference.into_model().into_runnable()
    return [t.to_numpy() for t in compiled[signature].run(arrays)]


def drop(key: int) -> None:
    _models.pop(key, None)
