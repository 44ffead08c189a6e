"""Every way of running a model, behind one small interface, and what each runtime lacks, as data.

A :class:`Runtime` says whether it is installed and which extra installs it, loads a model into a
:class:`Session` that runs feeds and gives outputs as ONNX types, and declares as data what it
cannot run (:class:`Lack`) and where its outputs are known to differ from the contract
(:class:`KnownDifference`), each with the measured reason. Comparing runtimes is one loop over
:data:`RUNTIMES`.

Nothing here imports a runtime until a model is loaded on it, so the expand path reads the limits
without loading onnxruntime. A version of a runtime newer than the one a limit was measured on is
assumed to have it too, until it is measured: refusing a model that would load costs a flag,
writing one that does not load costs the user a deployment.
"""

from __future__ import annotations

__all__ = ["RUNTIMES", "KnownDifference", "Lack", "Runtime", "RuntimeFailure", "Session", "get", "input_classes", "lacking"]

import contextlib
import dataclasses
import importlib.util
import os
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from dql_pass.errors import InputError
from dql_pass.modelfiles import ExternalData, in_memory
from dql_pass.reference import dynamic_quantize_linear


class RuntimeFailure(Exception):
    """A runtime refused to load or run a model; its own error is the cause.

    Callers tell the model's fault (this) from a bug of ours (anything else, which propagates).
    """


@contextlib.contextmanager
def _failures_of(origin: str | None = None) -> Iterator[None]:
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
    inputs: str  # one of the classes :func:`input_classes` names
    reason: str
    policy: str | None = None  # the zero-range policy under which it shows; None: any


def input_classes(x: np.ndarray, policy: str) -> set[str]:
    """The classes of ``x`` that known differences are stated for."""
    classes = set()
    with np.errstate(all="ignore"):
        if not x.size:
            classes |= {"empty", "zero range"}
        elif np.all(x == 0):
            classes |= {"all zero", "zero range"}
        if not np.isnan(x).any():
            scale = dynamic_quantize_linear(x, policy)[1]
            if np.isposinf(x / scale).any():
                classes.add("x/scale overflows to +inf")
    return classes


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
    extra: str | None = None  # the dql_pass extra that installs it; None: installed with dql_pass
    lacks: tuple[Lack, ...] = ()
    known_differences: tuple[KnownDifference, ...] = ()

    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def load(
        self, model: ir.Model | onnx.ModelProto | str | os.PathLike, *, threads: int = 0, optimize: str = "all"
    ) -> Session:
        """Load ``model`` (in memory, or a path whose external data sits beside it).

        ``optimize``: ``"all"`` as the runtime does by default, ``"basic"`` folds constants but
        fuses nothing, ``"none"`` runs every node as written, where the runtime allows the choice.
        """
        if not self.installed():
            install = f"pip install 'dql_pass[{self.extra}]'" if self.extra else "reinstall dql_pass"
            raise InputError(f"the runtime {self.name} is not installed; {install}")
        return self._load(model, threads=threads, optimize=optimize)

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


def _as_proto(model: ir.Model | onnx.ModelProto) -> tuple[onnx.ModelProto, Path | None]:
    """The model as a proto, and the folder its large external weights are read from."""
    if isinstance(model, onnx.ModelProto):
        return model, None
    external = ExternalData.of(model)
    folders = {Path(tensor.base_dir).resolve() for tensor in external.tensors}
    with _small_tensors_in_memory(external):
        return ir.serde.serialize_model(model), min(folders) if folders else None


class _OrtSession(Session):
    def __init__(self, session) -> None:
        super().__init__([i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()])
        self._session = session

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        fed = {name: array for name, array in feeds.items() if name in self.input_names}
        with _failures_of("onnxruntime"):
            return self._session.run(None if outputs is None else list(outputs), fed)


class OnnxRuntime(Runtime):
    name = "onnxruntime"
    module = "onnxruntime"
    lacks = (
        Lack("onnxruntime", "QuantizeLinear", 28, "1.32.0",
             "no CPU kernel for QuantizeLinear(28); session creation fails with NOT_IMPLEMENTED"),
    )
    known_differences = (
        KnownDifference(("native",), "zero range", "ORT's kernel gives a zero range the scale 1.0; the "
                        "onnx-reference policy expects 1/255", policy="onnx-reference"),
    )

    def optimized(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """The graph ORT runs for ``model`` after all its optimizations (fusions included), one thread."""
        with tempfile.TemporaryDirectory(prefix="dql_pass.") as folder:
            path = Path(folder, "optimized.onnx")
            self._load(model, threads=1, optimize="all", save_to=path)
            return onnx.load(path)

    def _load(self, model, *, threads: int, optimize: str, save_to: Path | None = None) -> Session:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: callers report failures themselves
        options.intra_op_num_threads = threads
        options.graph_optimization_level = {
            "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[optimize]
        if optimize != "all":
            # ORT's QDQ transformers run at every level: they move and duplicate DequantizeLinear
            # nodes (EnsureUniqueDQForNodeUnit takes time quadratic in the nodes), while "basic"
            # and "none" promise the kernels as written.
            options.add_session_config_entry("session.disable_quant_qdq", "1")
        if save_to is not None:
            options.optimized_model_filepath = str(save_to)
        if isinstance(model, (str, os.PathLike)):
            source = os.fspath(model)
        else:
            proto, folder = _as_proto(model)
            if folder is not None:
                # Large weights stay on disk; ORT reads them from their folder.
                options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
            source = proto.SerializeToString()
        with _failures_of("onnxruntime"):
            return _OrtSession(ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]))


class _ReferenceSession(Session):
    def __init__(self, evaluator) -> None:
        super().__init__(evaluator.input_names, evaluator.output_names)
        self._evaluator = evaluator

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        # 0/0 and inf/inf are part of what runs here: numpy's warnings about them are noise.
        # onnx.reference raises whatever its NumPy code raises: all of it is the runtime's refusal.
        with np.errstate(all="ignore"), warnings.catch_warnings(), _failures_of():
            warnings.simplefilter("ignore")
            return self._evaluator.run(None if outputs is None else list(outputs), dict(feeds))


class OnnxReference(Runtime):
    name = "reference"
    module = "onnx.reference"
    known_differences = (
        KnownDifference(("native",), "empty",
                        "onnx.reference's DynamicQuantizeLinear raises on an empty input (a reduction of no elements)"),
        KnownDifference(("native",), "all zero", "onnx.reference gives a zero range the scale 1/255; the "
                        "onnxruntime policy expects 1.0", policy="onnxruntime"),
        KnownDifference(("quantizelinear",), "x/scale overflows to +inf",
                        "onnx.reference's QuantizeLinear sends x/scale = +inf to 0 (rint(inf) cast to int32); "
                        "the expected value saturates to 255"),
    )

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        from onnx.reference import ReferenceEvaluator

        if isinstance(model, ir.Model):
            model = _as_proto(model)[0]
        with _failures_of():
            return _ReferenceSession(ReferenceEvaluator(os.fspath(model) if isinstance(model, (str, os.PathLike)) else model))


RUNTIMES: dict[str, Runtime] = {runtime.name: runtime for runtime in (OnnxRuntime(), OnnxReference())}


def get(name: str) -> Runtime:
    """The runtime called ``name``; :class:`InputError` naming the known ones otherwise."""
    if name not in RUNTIMES:
        raise InputError(f"unknown runtime {name!r}; choose from {', '.join(RUNTIMES)}")
    return RUNTIMES[name]


def _schema_version(domain: str, op_type: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None


def lacking(runtime: str, ops: Iterable[tuple[str, str]], opset: int) -> list[Lack]:
    """What ``runtime`` lacks of ops ``(domain, op_type)`` at ai.onnx ``opset``."""
    wanted = set(ops)
    return [
        lack for lack in get(runtime).lacks
        if (lack.domain, lack.op_type) in wanted and (_schema_version(lack.domain, lack.op_type, opset) or 0) >= lack.since_version
    ]
