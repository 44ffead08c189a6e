"""ONNX Runtime's CPU execution provider: the runtime the contract is measured on."""

from __future__ import annotations

__all__ = ["OnnxRuntime"]

import contextlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from dql_pass.runtimes.base import KnownDifference, Lack, Runtime, RuntimeFailure, Session, failures_of
from dql_pass.runtimes.sessions import as_proto


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
                        "onnx-reference policy expects 1/255", policy="onnx-reference"),
    )

    def optimized(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """The graph ORT runs for ``model`` after all its optimizations (fusions included), one thread."""
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
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 1 if log else 3  # errors only: callers report failures themselves
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
            return _OrtSession(ort.InferenceSession(source, options, providers=["CPUExecutionProvider"],
                                                    disabled_optimizers=list(disabled)))


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
