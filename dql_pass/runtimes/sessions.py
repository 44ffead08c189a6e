"""What runtime adapters share to load a model and run it: the model as a proto or a file, outputs
conformed to the declared types, and sessions of compilers (one build per input shape, or per rank
where dimensions stay symbolic).
"""

from __future__ import annotations

__all__ = [
    "Compiled", "ShapeCachedSession", "as_file", "as_proto", "compiled_per_rank", "conform", "fed_inputs", "hold",
    "output_types", "release_held", "whole_proto", "with_ranks", "with_shapes",
]

import contextlib
import math
import os
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dql_pass import files
from dql_pass.runtimes.base import RuntimeFailure, Session, failures_of

# onnx and onnx_ir are imported where used: the adapters import this module, and listing them needs neither.
if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

    from dql_pass.runtimes.worker import Worker

_IN_MEMORY_BYTES = 1 << 20


@contextlib.contextmanager
def _tensors_in_memory(external: files.ExternalData, limit: float) -> Iterator[None]:
    """Temporarily read external tensor attributes and the external initializers of at most ``limit`` bytes.

    A runtime that gets the model as bytes would not find an attribute's external data, and ORT's
    shape inference needs the initializers' values (axes, shapes). The caller's model gets its
    tensors back afterwards.
    """
    import onnx_ir as ir

    swapped = [(value, value.const_value) for value in external.values if value.const_value.nbytes <= limit]
    for value, tensor in swapped:
        value.const_value = files.in_memory(tensor)
    for node, attr in external.attributes:
        node.attributes[attr.name] = ir.AttrTensor(attr.name, files.in_memory(attr.value))
    try:
        yield
    finally:
        for value, tensor in swapped:
            value.const_value = tensor
        for node, attr in external.attributes:
            node.attributes[attr.name] = attr


def as_proto(model: ir.Model | onnx.ModelProto) -> tuple[onnx.ModelProto, Path | None]:
    """The model as a proto, and the folder its large external weights are read from."""
    import onnx
    import onnx_ir as ir

    if isinstance(model, onnx.ModelProto):
        return model, None
    external = files.ExternalData.of(model)
    folders = {Path(tensor.base_dir).resolve() for tensor in external.tensors}
    with _tensors_in_memory(external, _IN_MEMORY_BYTES):
        return ir.serde.serialize_model(model), min(folders) if folders else None


def whole_proto(model: ir.Model | onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    """The model as one proto with its external weights read into it, for a converter that reads no
    files; a path read by :func:`~dql_pass.files.read_model`, as every model file dql_pass reads."""
    import onnx
    import onnx_ir as ir

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        model = files.read_model(model)
    with _tensors_in_memory(files.ExternalData.of(model), limit=math.inf):
        return ir.serde.serialize_model(model)


_HELD: list[weakref.finalize] = []


def hold(owner: Session | Worker, close: Callable[..., object], *args: object) -> weakref.finalize:
    """``close(*args)`` (what ``owner`` holds: a session's private copy of the model, read again for each
    new input shape; a browser page; a worker's folder) when ``owner`` is collected, or by
    :func:`release_held`; the finalizer."""
    _HELD[:] = [finalizer for finalizer in _HELD if finalizer.alive]
    _HELD.append(weakref.finalize(owner, close, *args))
    return _HELD[-1]


def release_held() -> None:
    """Close what every live session holds. The command line ends by ``os._exit``, which runs no
    finalizer, with the cyclic GC off, which never collects a session that a caught failure's
    traceback still references: its copy would stay in the temporary folder."""
    while _HELD:
        _HELD.pop()()


@contextlib.contextmanager
def as_file(model: ir.Model | onnx.ModelProto | str | os.PathLike) -> Iterator[Path]:
    """A private copy of ``model`` in a temporary folder, for runtimes that read files: some edit or
    overwrite the file they are given, and the user's model is never theirs to touch."""
    import onnx
    import onnx_ir as ir

    if isinstance(model, (str, os.PathLike)):
        model = files.read_model(model)  # any form dql_pass reads, .onnxtxt too
    with tempfile.TemporaryDirectory(prefix="dql_pass.") as folder:
        path = Path(folder, "model.onnx")
        if isinstance(model, onnx.ModelProto):
            model = ir.serde.deserialize_model(model)
        # Weights go to a data file beside the copy: a runtime reads them as from any saved model.
        ir.save(model, path, external_data="model.onnx.data")
        yield path


def conform(array: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    """``array`` as ``dtype``, by reinterpreting bits of the same size (a runtime that gives uint8
    as int8, say); :class:`RuntimeFailure` for any other mismatch, which no cast may hide. A model
    that does not declare the type (None) gets the array as the runtime gave it."""
    array = np.asarray(array)
    if dtype is None or array.dtype == dtype:
        return array
    if array.dtype.itemsize == np.dtype(dtype).itemsize and array.dtype.kind in "iub" and np.dtype(dtype).kind in "iub":
        return array.view(dtype)
    raise RuntimeFailure(f"the runtime gave {array.dtype} where the model declares {np.dtype(dtype)}")


Compiled = Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]]


class ShapeCachedSession(Session):
    """A session of a runtime that compiles for fixed input shapes: one compiled model per set of
    input shapes and types, built on first use by ``compile`` and kept, so that a catalogue of
    cases compiles each shape once."""

    def __init__(
        self,
        inputs: Sequence[str],
        outputs: Sequence[str],
        output_types: Sequence[np.dtype | None],
        compile: Callable[[tuple[tuple[tuple[int, ...], np.dtype], ...]], Compiled],
    ) -> None:
        super().__init__(inputs, outputs)
        self._output_types = list(output_types)
        self._compile = compile
        self._compiled: dict[tuple, Compiled] = {}

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        arrays = [np.asarray(array) for array in self.fed(feeds)]
        signature = tuple((a.shape, a.dtype) for a in arrays)
        with failures_of():  # a compiler's refusal comes as any exception
            if signature not in self._compiled:
                self._compiled[signature] = self._compile(signature)
            results = self._compiled[signature](arrays)
        return self.chosen([conform(r, t) for r, t in zip(results, self._output_types)], outputs)


def fed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds: models below IR version 4 list their initializers too."""
    weights = {tensor.name for tensor in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in weights]


def output_types(model: onnx.ModelProto) -> list[np.dtype | None]:
    """The numpy types of the graph outputs of ``model``; None where it does not say (no value_info)."""
    import onnx

    return [onnx.helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type) if o.type.tensor_type.elem_type
            else None for o in model.graph.output]


def compiled_per_rank(proto: onnx.ModelProto, compile: Callable[[onnx.ModelProto], Compiled]) -> Session:
    """A session of a compiler that keeps dimensions symbolic: ``proto`` compiled at load, once for
    every input shape it admits; an input of unknown rank gets symbolic dimensions of the rank fed,
    one compile per rank. Any exception out of the compiler is its refusal (TVM's and IREE's C++
    errors arrive as builtin ValueError and others)."""
    ranked = all(i.type.tensor_type.HasField("shape") for i in fed_inputs(proto))
    by_ranks: dict[tuple[int, ...], Compiled] = {}

    def compiled(signature) -> Compiled:
        ranks = () if ranked else tuple(len(shape) for shape, _ in signature)
        if ranks not in by_ranks:
            by_ranks[ranks] = compile(proto if ranked else with_ranks(proto, ranks))
        return by_ranks[ranks]

    if ranked:
        with failures_of():
            compiled(())
    return ShapeCachedSession(
        [i.name for i in fed_inputs(proto)], [o.name for o in proto.graph.output], output_types(proto), compiled,
    )


def with_ranks(proto: onnx.ModelProto, ranks: tuple[int, ...]) -> onnx.ModelProto:
    """A copy of ``proto`` whose inputs have symbolic dimensions of ``ranks``, and whose other shapes
    are left to inference (what they say was for no rank in particular)."""
    names = [value.name for value in fed_inputs(proto)]
    return with_shapes(proto, [[f"{name}_{axis}" for axis in range(rank)] for name, rank in zip(names, ranks)])


def with_shapes(proto: onnx.ModelProto, shapes: Sequence[Sequence[int | str]]) -> onnx.ModelProto:
    """A copy of ``proto`` whose fed inputs have ``shapes`` (a number fixes a dimension, a name
    keeps it symbolic), and whose other shapes are left to inference."""
    import onnx

    fixed = onnx.ModelProto()
    fixed.CopyFrom(proto)
    del fixed.graph.value_info[:]
    for value in fixed.graph.output:
        value.type.tensor_type.ClearField("shape")
    for value, dims in zip(fed_inputs(fixed), shapes):
        shape = value.type.tensor_type.shape
        shape.ClearField("dim")
        shape.SetInParent()  # rank 0 too is a known rank
        for dim in dims:
            if isinstance(dim, str):
                shape.dim.add().dim_param = dim
            else:
                shape.dim.add().dim_value = dim
    return fixed
