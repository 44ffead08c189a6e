"""The interface every runtime adapter implements, and what adapters share.

A :class:`Runtime` says whether it is installed and which extra installs it, loads a model into a
:class:`Session` that runs feeds and gives outputs as ONNX types, and declares as data what it
cannot run (:class:`Lack`) and where its outputs are known to differ from the contract
(:class:`KnownDifference`), each with the measured reason, and which expansion variant is exact on
it (:attr:`Runtime.target`).

An adapter imports its runtime only when a model is loaded on it, so the expand path reads the
limits without loading any runtime. A version of a runtime newer than the one a limit was measured on is
assumed to have it too, until it is measured: refusing a model that would load costs a flag,
writing one that does not load costs the user a deployment.
"""

from __future__ import annotations

__all__ = [
    "KnownDifference", "Lack", "Runtime", "RuntimeFailure", "Session", "ShapeCachedSession", "as_file", "as_proto",
    "compiled_per_rank", "conform", "failures_of", "fed_inputs", "output_types", "with_ranks",
]

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from dql_pass.errors import InputError
from dql_pass.modelfiles import ExternalData, in_memory
from dql_pass.inputs import check_class, input_classes


class RuntimeFailure(Exception):
    """A runtime refused to load or run a model; its own error is the cause.

    Callers tell the model's fault (this) from a bug of ours (anything else, which propagates).
    """


@contextlib.contextmanager
def failures_of(origin: str | None = None) -> Iterator[None]:
    """Raise what the runtime raises (from module ``origin``; any exception when None) as RuntimeFailure."""
    try:
        yield
    except Exception as error:
        if origin is not None and not type(error).__module__.startswith(origin):
            raise
        raise RuntimeFailure(f"{type(error).__name__}: {error}") from error


@dataclasses.dataclass(frozen=True)
class Lack:
    """An op that a runtime cannot run from ``since_version`` of its schema on."""

    runtime: str
    op_type: str
    since_version: int
    measured: str
    reason: str
    domain: str = ""

    def describe(self) -> str:
        return f"{self.op_type}-{self.since_version} does not run on {self.runtime} ({self.measured}): {self.reason}"


@dataclasses.dataclass(frozen=True)
class KnownDifference:
    """Where a runtime's outputs differ from the contract: a form, a class of inputs, a policy."""

    forms: tuple[str, ...]  # "native" (the DQL node) or expansion variants
    inputs: str  # one of :data:`dql_pass.inputs.CLASSES`, checked here: a misspelt class would never match
    reason: str
    policy: str | None = None  # the zero-range policy under which it shows; None: any

    def __post_init__(self) -> None:
        check_class(self.inputs)


class Session:
    """A model loaded on a runtime. Subclasses compile per input shape where the runtime needs it."""

    def __init__(self, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        self.input_names = list(inputs)
        self.output_names = list(outputs)

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        """The named outputs (default: all) for ``feeds``, as arrays of their ONNX types;
        :class:`RuntimeFailure` when the runtime refuses."""
        raise NotImplementedError


class Runtime:
    """One way of running ONNX models; subclasses fill in the class attributes and :meth:`_load`."""

    name: str
    module: str  # what import finds when the runtime is installed
    distribution: str  # the PyPI distribution whose version is reported
    extra: str | None = None  # the dql_pass extra that installs it; None: installed with dql_pass
    target: str = "quantizelinear"  # the expansion variant that is exact on it (`expand --target`)
    lacks: tuple[Lack, ...] = ()
    known_differences: tuple[KnownDifference, ...] = ()

    def installed(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except ImportError:  # a parent package that is missing
            return False

    def version(self) -> str | None:
        """The installed version of the runtime; None when it is not installed."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def load(
        self, model: ir.Model | onnx.ModelProto | str | os.PathLike, *, threads: int = 0, optimize: str = "all"
    ) -> Session:
        """Load ``model`` (in memory, or a path whose external data sits beside it).

        ``optimize``: ``"all"`` as the runtime does by default, ``"basic"`` folds constants but
        fuses nothing, ``"none"`` runs every node as written, where the runtime allows the choice.
        """
        self.check_installed()
        return self._load(model, threads=threads, optimize=optimize)

    def check_installed(self) -> None:
        """:class:`InputError` naming the extra to install, unless the runtime is installed."""
        if not self.installed():
            install = f"pip install 'dql_pass[{self.extra}]'" if self.extra else "reinstall dql_pass"
            raise InputError(f"the runtime {self.name} is not installed; {install}")

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        raise NotImplementedError

    def differences(self, x: np.ndarray, form: str, policy: str) -> list[str]:
        """The reasons this runtime is known to give other outputs for ``x`` in ``form`` under ``policy``."""
        classes = input_classes(x, policy)
        return [
            d.reason for d in self.known_differences
            if form in d.forms and d.inputs in classes and d.policy in (None, policy)
        ]


_IN_MEMORY_BYTES = 1 << 20


@contextlib.contextmanager
def _small_tensors_in_memory(external: ExternalData) -> Iterator[None]:
    """Temporarily read external tensor attributes and small external initializers.

    A runtime that gets the model as bytes would not find an attribute's external data, and ORT's
    shape inference needs the initializers' values (axes, shapes). The caller's model gets its
    tensors back afterwards.
    """
    swapped = [(value, value.const_value) for value in external.values if value.const_value.nbytes <= _IN_MEMORY_BYTES]
    for value, tensor in swapped:
        value.const_value = in_memory(tensor)
    for node, attr in external.attributes:
        node.attributes[attr.name] = ir.AttrTensor(attr.name, in_memory(attr.value))
    try:
        yield
    finally:
        for value, tensor in swapped:
            value.const_value = tensor
        for node, attr in external.attributes:
            node.attributes[attr.name] = attr


def as_proto(model: ir.Model | onnx.ModelProto) -> tuple[onnx.ModelProto, Path | None]:
    """The model as a proto, and the folder its large external weights are read from."""
    if isinstance(model, onnx.ModelProto):
        return model, None
    external = ExternalData.of(model)
    folders = {Path(tensor.base_dir).resolve() for tensor in external.tensors}
    with _small_tensors_in_memory(external):
        return ir.serde.serialize_model(model), min(folders) if folders else None




@contextlib.contextmanager
def as_file(model: ir.Model | onnx.ModelProto | str | os.PathLike, *, private: bool = False) -> Iterator[Path]:
    """A path to ``model``, for runtimes that read files: the path given, or a temporary copy;
    always a copy with ``private``, for an adapter that edits the file it hands its runtime."""
    if isinstance(model, (str, os.PathLike)):
        if not private:
            yield Path(model)
            return
        model = ir.load(model)
    with tempfile.TemporaryDirectory(prefix="dql_pass.") as folder:
        path = Path(folder, "model.onnx")
        if isinstance(model, onnx.ModelProto):
            model = ir.serde.deserialize_model(model)
        # Weights go to a data file beside the copy: a runtime reads them as from any saved model.
        ir.save(model, path, external_data="model.onnx.data")
        yield path


def conform(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` as ``dtype``, by reinterpreting bits of the same size (a runtime that gives uint8
    as int8, say); :class:`RuntimeFailure` for any other mismatch, which no cast may hide."""
    array = np.asarray(array)
    if array.dtype == dtype:
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
        output_types: Sequence[np.dtype],
        compile: Callable[[tuple[tuple[tuple[int, ...], np.dtype], ...]], Compiled],
        origin: str | None = None,
    ) -> None:
        super().__init__(inputs, outputs)
        self._output_types = list(output_types)
        self._compile = compile
        self._compiled: dict[tuple, Compiled] = {}
        self._origin = origin

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        arrays = [np.asarray(feeds[name]) for name in self.input_names]
        signature = tuple((a.shape, a.dtype) for a in arrays)
        with failures_of(self._origin):
            if signature not in self._compiled:
                self._compiled[signature] = self._compile(signature)
            results = self._compiled[signature](arrays)
        by_name = {name: conform(r, t) for name, r, t in zip(self.output_names, results, self._output_types)}
        return [by_name[name] for name in (self.output_names if outputs is None else outputs)]


def fed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds: models below IR version 4 list their initializers too."""
    weights = {tensor.name for tensor in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in weights]


def output_types(model: onnx.ModelProto) -> list[np.dtype]:
    """The numpy types of the graph outputs of ``model``."""
    return [onnx.helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type) for o in model.graph.output]


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
    fixed = onnx.ModelProto()
    fixed.CopyFrom(proto)
    del fixed.graph.value_info[:]
    for value in fixed.graph.output:
        value.type.tensor_type.ClearField("shape")
    for value, rank in zip(fed_inputs(fixed), ranks):
        shape = value.type.tensor_type.shape
        shape.SetInParent()  # rank 0 too is a known rank
        for axis in range(rank):
            shape.dim.add().dim_param = f"{value.name}_{axis}"
    return fixed
