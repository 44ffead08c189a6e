"""ONNX Runtime's CPU execution provider: the runtime the contract is measured on."""

from __future__ import annotations

__all__ = ["OnnxRuntime", "import_onnxruntime"]

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from dql_pass.runtimes.base import KnownDifference, Lack, Runtime, RuntimeFailure, Session, failures_of
from dql_pass.runtimes.sessions import as_proto


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
        fed = {name: array for name, array in feeds.items() if name in self.input_names}
        missing = [name for name in self.input_names if name not in fed]
        if missing:  # ORT says so with a builtin ValueError, which failures_of would take for a bug of ours
            raise RuntimeFailure(f"the model takes inputs it was not given: {', '.join(missing)}")
        with failures_of("onnxruntime"):
            return self._session.run(None if outputs is None else list(outputs), fed)


class OnnxRuntime(Runtime):
    name = "onnxruntime"
    module = "onnxruntime"
    distribution = "onnxruntime"
    lacks = (
        Lack("onnxruntime", "QuantizeLinear", 28, "1.32.0",
             "no CPU kernel for QuantizeLinear(28); session creation fails with NOT_IMPLEMENTED"),
    )
    known_differences = (
        KnownDifference(("native",), "zero range", "ORT's kernel gives a zero range the scale 1.0; the "
                        "onnx-reference policy expects 1/255", policy="onnx-reference", outputs=("y_scale",)),
    )

    def optimized(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """The graph ORT runs for ``model`` after all its optimizations (fusions included), one thread."""
        with tempfile.TemporaryDirectory(prefix="dql_pass.") as folder:
            path = Path(folder, "optimized.onnx")
            self._load(model, threads=1, optimize="all", save_to=path)
            return onnx.load(path)

    def _load(self, model, *, threads: int, optimize: str, save_to: Path | None = None) -> Session:
        ort = import_onnxruntime()
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
            proto, folder = as_proto(model)
            if folder is not None:
                # Large weights stay on disk; ORT reads them from their folder.
                options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
            source = proto.SerializeToString()
        with failures_of("onnxruntime"):
            return _OrtSession(ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]))
