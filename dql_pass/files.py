"""Load and save models safely: checked on the way in, written atomically on the way out.

Failures raise :class:`~dql_pass.errors.InputError` with a one-line message. The input is never
written to, and a failed save leaves no partial file behind.
"""

from __future__ import annotations

__all__ = ["load_model", "save_model"]

import contextlib
import os
import tempfile
from pathlib import Path

import onnx
import onnx_ir as ir

from dql_pass.errors import InputError


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def load_model(path: str | os.PathLike) -> ir.Model:
    """Check the file with onnx's full checker, then load it; external data stays on disk, unread."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: cannot read the file")
    try:
        onnx.checker.check_model(os.fspath(path), full_check=True)
    except onnx.shape_inference.InferenceError as error:
        raise InputError(f"{path}: the model fails ONNX shape inference: {_one_line(error)}") from None
    except onnx.checker.ValidationError as error:
        raise InputError(f"{path}: not a valid ONNX model: {_one_line(error)}") from None
    try:
        return ir.load(path)
    except Exception as error:  # a file the checker accepted but onnx_ir cannot read
        raise InputError(f"{path}: cannot load the model: {_one_line(error)}") from None


def _external_base_dirs(model: ir.Model) -> set[Path]:
    return {
        Path(value.const_value.base_dir).resolve()
        for value in model.graph.initializers.values()
        if isinstance(value.const_value, ir.ExternalTensor)
    }


def save_model(model: ir.Model, path: str | os.PathLike, *, source: str | os.PathLike | None = None) -> None:
    """Write ``model`` to ``path`` atomically.

    External weights are referenced where they are when ``path`` sits in their folder, so nothing
    is copied; elsewhere they are streamed into ``<path>.data`` beside the output.
    """
    path = Path(path)
    if source is not None and Path(source).resolve() == path.resolve():
        raise InputError(f"{path}: the output path is the input path; choose another output")
    folder = path.parent.resolve()
    if not folder.is_dir():
        raise InputError(f"{path}: the output folder does not exist")
    external_data = None
    if _external_base_dirs(model) - {folder}:
        external_data = f"{path.name}.data"
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as error:
        raise InputError(f"{path}: cannot write the output: {error.strerror}") from None
    os.close(handle)
    try:
        ir.save(model, temporary, external_data=external_data)
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, Exception):
            raise InputError(f"{path}: cannot write the output: {_one_line(error)}") from None
        raise
