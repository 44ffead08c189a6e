"""ONNX Runtime: its CPU execution provider, the runtime the contract is measured on, and its CUDA
execution provider, as a user runs it (the CPU provider takes the nodes CUDA has no kernel for)."""

from __future__ import annotations

__all__ = ["OnnxRuntime", "OnnxRuntimeCuda", "import_onnxruntime"]

import contextlib
import functools
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, Lack, Runtime, RuntimeFailure, Session, failures_of
from dql_pass.runtimes.sessions import as_proto

# onnx and onnx_ir are imported where used: listing the adapters needs neither.
if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir


def import_onnxruntime():
    """The onnxruntime module, imported with its telemetry off: dql_pass imports it nowhere else."""
    # Without it ORT 1.32 writes a device id and a database under $HOME/.cache/Microsoft, leaves
    # $TMPDIR/.ses and sends events over the network; it counts only before the first import.
    # Forced, over any value the user set: nothing dql_pass runs may reach the network.
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"
    import onnxruntime

    return onnxruntime


class _OrtSession(Session):
    def __init__(self, session) -> None:
        super().__init__([i.name for i in session.get_inputs()], [o.name for o in session.get_outputs()])
        self._session = session

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        # Checked first: ORT says so with a builtin ValueError, which failures_of would take for a bug of ours.
        fed = dict(zip(self.input_names, self.fed(feeds)))
        with failures_of("onnxruntime"):
            try:
                return self._session.run(None if outputs is None else list(outputs), fed)
            except RuntimeError as error:
                # ORT's Python binding converts arrays to and from NumPy: a type without a NumPy one of its
                # own (int4, uint4, bfloat16, fed as ml_dtypes' or given out) fails there with a builtin
                # RuntimeError, which failures_of would take for a bug of ours. ORT's own errors are not one.
                raise RuntimeFailure(f"onnxruntime cannot {_unconvertible(fed)} through its Python binding: "
                                     f"{error}") from error


def _unconvertible(feeds: Mapping[str, np.ndarray]) -> str:
    """What ORT's binding cannot convert: the inputs fed in a NumPy type not built in (ml_dtypes'), else an output."""
    odd = [f"{name} ({array.dtype})" for name, array in feeds.items() if np.asarray(array).dtype.isbuiltin == 2]
    return f"take input {', '.join(odd)} from NumPy" if odd else "give an output as NumPy"


class OnnxRuntime(Runtime):
    name = "onnxruntime"
    module = "onnxruntime"
    distribution = "onnxruntime"
    providers: tuple[str, ...] = ("CPUExecutionProvider",)  # in onnxruntime's order of preference
    widens_float16 = ("its CPU provider has few float16 kernels: it runs such a node in float32 and removes the "
                      "Casts around it, the model's own included, even with every optimisation off")
    lacks = (
        Lack("onnxruntime", "QuantizeLinear", 28, "1.32.0",
             "no CPU kernel for QuantizeLinear(28); session creation fails with NOT_IMPLEMENTED"),
    )
    known_differences = (
        KnownDifference(("native",), "zero range", "ORT's kernel gives a zero range the scale 1.0; the "
                        "onnx-reference policy expects 1/255", policy="onnx-reference", outputs=("y_scale",)),
    )

    def saturating_products(self) -> frozenset[tuple[str, int, int]]:
        """The integer products whose ORT kernel saturates on this CPU, as (op type, operand type,
        weight type) with ONNX element types: on x86 without VNNI, MLAS sums pairs of uint8 x int8
        products in int16 (ORT PR #12088), so ORT's results there are not the ONNX op's."""
        return _saturating_products()

    def load_exact(
        self, model: ir.Model | onnx.ModelProto | str | os.PathLike, *, threads: int = 0, optimize: str = "all"
    ) -> Session:
        """Load ``model`` as :meth:`load` does, with every integer product whose kernel saturates on
        this CPU given uint8 operands, which ORT computes exactly: the ops as ONNX defines them."""
        import onnx_ir as ir

        from dql_pass.files import read_model
        from dql_pass.runtimes.unsaturated import unsaturated

        saturating = self.saturating_products()
        if saturating:
            if not isinstance(model, ir.Model):
                model = read_model(model) if isinstance(model, (str, os.PathLike)) else ir.from_proto(model)
            model = unsaturated(model, saturating)
        return self.load(model, threads=threads, optimize=optimize)

    def optimized(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """The graph ORT runs for ``model`` after all its optimizations (fusions included), one thread."""
        import onnx

        with tempfile.TemporaryDirectory(prefix="dql_pass.") as folder:
            path = Path(folder, "optimized.onnx")
            self._load(model, threads=1, optimize="all", save_to=path)
            return onnx.load(path)

    def load_without(self, model, disabled: Sequence[str]) -> Session:
        """``model`` at ORT's default level ("all") with the graph transformers ``disabled`` turned off."""
        self.check_installed()
        return self._load(model, threads=0, optimize="all", disabled=disabled)

    def transformers(self, model) -> list[str]:
        """The graph transformers that change ``model`` at ORT's default level, from ORT's own log
        ("GraphTransformer X modified: 1"), which its C++ logger writes to file descriptor 2 only."""
        self.check_installed()
        with tempfile.TemporaryFile() as log:
            with _stderr_to(log):
                self._load(model, threads=1, optimize="all", log=True)
            log.seek(0)
            text = log.read().decode(errors="replace")
        return sorted(set(re.findall(r"GraphTransformer (\w+) modified: 1", text)))

    def _load(
        self, model, *, threads: int, optimize: str, save_to: Path | None = None, disabled: Sequence[str] = (),
        log: bool = False,
    ) -> Session:
        ort = import_onnxruntime()
        # onnxruntime runs on the CPU where the provider asked for is not built in or does not start, with
        # a warning at most: a verdict on that run would be the CPU's under the provider's name.
        available = ort.get_available_providers()
        if self.providers[0] not in available:
            raise RuntimeFailure(f"onnxruntime {ort.__version__} has no {self.providers[0]}, only "
                                 f"{', '.join(available)}")
        options = ort.SessionOptions()
        options.log_severity_level = 1 if log else 3  # errors only: callers report failures themselves
        # No arena: it keeps every run's peak for the session's life, rounded up to a power of two, where
        # a large input's widened copies are freed as they go without it (verify runs large graph inputs).
        options.enable_cpu_mem_arena = False
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
            proto, folder = as_proto(model)
            if folder is not None:
                # Large weights stay on disk; ORT reads them from their folder.
                options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
            source = proto.SerializeToString()
        with failures_of("onnxruntime"):
            session = ort.InferenceSession(source, options, providers=list(self.providers),
                                           disabled_optimizers=list(disabled))
        if session.get_providers()[0] != self.providers[0]:
            raise RuntimeFailure(f"onnxruntime {ort.__version__} did not start {self.providers[0]} (no GPU, or no "
                                 "driver or library it needs?)")
        return _OrtSession(session)


_CUDA = "measured (onnxruntime-gpu 1.31.1, H200)"


class OnnxRuntimeCuda(OnnxRuntime):
    """onnxruntime-gpu's CUDA execution provider with its defaults; the nodes it has no kernel for
    run on the CPU provider, with a copy each way."""

    name = "onnxruntime-cuda"
    distribution = "onnxruntime-gpu"
    providers = ("CUDAExecutionProvider", "CPUExecutionProvider")
    where = "the GPU"
    widens_float16 = None  # not measured: the CUDA provider has float16 kernels
    variant = "float64"  # the cheapest variant exact on every input there (docs/RUNTIMES.md)
    known_differences = (
        *OnnxRuntime.known_differences,
        *(KnownDifference(("quantizelinear",), inputs, f"{_CUDA}: its QuantizeLinear adds the zero point to "
                          "__float2int_rn(x / scale) in int32 before clamping, so a quotient of +inf (int32's "
                          "maximum) wraps round to y 0 where the contract gives 255, and NaN (inf / inf) gives the "
                          "zero point where it gives 0 (quantize_linear.cu)", outputs=("y",))
          for inputs in ("x/scale overflows to +inf", "infinite")),
        KnownDifference(("quantizelinear", "arithmetic"), "empty",
                        f"{_CUDA}: its ReduceMin and ReduceMax refuse to reduce a dimension of size 0 with "
                        "keepdims=0 (reduction_ops.cc, PrepareForReduce), so these variants do not run on an empty "
                        "x", outputs=OUTPUTS),
    )
    # Measured (1.31.1, H200): the profiler put a transformer's DQL and u8s8 MatMulInteger on the CPU,
    # and the family suite's ConvInteger errors came from the CPU kernel.
    no_kernel = {"DynamicQuantizeLinear": "float32", "MatMulInteger": "uint8 and int8 (a kernel for int8 and int8)",
                 "ConvInteger": "uint8 and int8"}

    def installed(self) -> bool:
        # onnxruntime-gpu installs the module onnxruntime, as the CPU build does: the distribution tells them apart.
        return super().installed() and self.version() is not None

    def install_hint(self) -> str:
        return "pip uninstall onnxruntime && pip install onnxruntime-gpu"  # one build of the module at a time


@contextlib.contextmanager
def _stderr_to(file) -> object:
    """File descriptor 2 into ``file`` for the duration, and back."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    try:
        os.dup2(file.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


_INTEGER_PRODUCTS = {"MatMulInteger": ([4, 64], [64, 4]), "ConvInteger": ([1, 8, 5, 5], [4, 8, 3, 3])}


@functools.cache
def _saturating_products() -> frozenset[tuple[str, int, int]]:
    """Each integer product and operand types with an int8 among them, run once on operands at
    their types' maximum, where every pair sum passes int16: saturating if the result is not exact."""
    import onnx

    ort = import_onnxruntime()
    found = set()
    types = {onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.INT8: np.int8}
    for op_type, shapes in _INTEGER_PRODUCTS.items():
        for a_type, b_type in ((a, b) for a in types for b in types if onnx.TensorProto.INT8 in (a, b)):
            operands = [np.full(shape, np.iinfo(types[t]).max, types[t]) for shape, t in zip(shapes, (a_type, b_type))]
            graph = onnx.helper.make_graph(
                [onnx.helper.make_node(op_type, ["a", "b"], ["y"])], "probe",
                [onnx.helper.make_tensor_value_info(n, t, s) for n, t, s in zip("ab", (a_type, b_type), shapes)],
                [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.INT32, None)])
            opsets = [onnx.helper.make_opsetid("", 13)]  # the IR version too: onnx's newest may be ORT's next
            model = onnx.helper.make_model(graph, opset_imports=opsets,
                                           ir_version=onnx.helper.find_min_ir_version_for(opsets))
            with failures_of("onnxruntime"):  # an onnxruntime that cannot run the probe: a refusal, not a bug of ours
                session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
                got = session.run(None, dict(zip("ab", operands)))[0]
            terms = np.prod(shapes[1][1:]) if op_type == "ConvInteger" else shapes[1][0]  # no padding: all inside
            exact = int(operands[0].flat[0]) * int(operands[1].flat[0]) * int(terms)
            if not (got == exact).all():
                found.add((op_type, a_type, b_type))
    return frozenset(found)
