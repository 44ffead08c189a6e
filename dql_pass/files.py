"""Load and save models safely: checked on the way in, written atomically on the way out.

Failures raise :class:`~dql_pass.errors.InputError` with a one-line message. The input is never
written to, and a failed save leaves no partial file behind.
"""

from __future__ import annotations

__all__ = ["as_ir_model", "atomic_path", "external_base_dirs", "external_tensors", "load_model", "one_line", "read_external_attributes", "save_model"]

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx_ir as ir

from dql_pass.errors import InputError


def one_line(error: BaseException) -> str:
    """An exception's message on one line, cut to a readable length."""
    text = " ".join(str(error).split())
    return text[:300] + ("..." if len(text) > 300 else "")


@dataclasses.dataclass
class _ExternalData:
    """The model's tensors kept in external data, found in one walk over every graph and function."""

    initializers: list[ir.ExternalTensor]
    attributes: list[tuple[ir.Node, ir.Attr]]

    @classmethod
    def of(cls, model: ir.Model) -> _ExternalData:
        graphs = [model.graph, *(function.graph for function in model.functions.values())]
        found = cls([], [])
        for root in graphs:
            found._add_initializers(root)
            for node in ir.traversal.RecursiveGraphIterator(root):
                for attr in node.attributes.values():
                    if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                        found.attributes.append((node, attr))
                    elif attr.type == ir.AttributeType.GRAPH:
                        found._add_initializers(attr.value)
                    elif attr.type == ir.AttributeType.GRAPHS:
                        for graph in attr.value:
                            found._add_initializers(graph)
        return found

    def _add_initializers(self, graph: ir.Graph) -> None:
        self.initializers += [v.const_value for v in graph.initializers.values() if isinstance(v.const_value, ir.ExternalTensor)]

    @property
    def tensors(self) -> list[ir.ExternalTensor]:
        return self.initializers + [attr.value for _, attr in self.attributes]


def external_tensors(model: ir.Model) -> list[ir.ExternalTensor]:
    """Every tensor of the model kept in external data: initializers and attributes, all graphs."""
    return _ExternalData.of(model).tensors


def external_base_dirs(model: ir.Model) -> set[Path]:
    """The folders that the model's external tensors are read from, attributes included."""
    return {Path(tensor.base_dir).resolve() for tensor in external_tensors(model)}


def read_external_attributes(model: ir.Model) -> None:
    """Read tensor attributes kept in external data (Constant nodes, small) into memory.

    Saving moves initializers' external data, not attributes', so they would point to a file
    that is not beside the new model.
    """
    _read_attributes(_ExternalData.of(model).attributes)


def _read_attributes(attributes: list[tuple[ir.Node, ir.Attr]]) -> None:
    for node, attr in attributes:
        node.attributes[attr.name] = ir.AttrTensor(attr.name, ir.tensor(attr.value.numpy(), name=attr.value.name))


def _check_external_files(model: ir.Model, path: Path) -> None:
    for tensor in external_tensors(model):
        data = Path(tensor.path)
        if not data.is_file():
            raise InputError(f"{path}: the external data file {data} is missing")
        if data.stat().st_size < tensor.offset + tensor.length:
            raise InputError(f"{path}: the external data file {data} is shorter than the model says")


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
        raise InputError(f"{path}: the model fails ONNX shape inference: {one_line(error)}") from None
    except onnx.checker.ValidationError as error:
        raise InputError(f"{path}: not a valid ONNX model: {one_line(error)}") from None
    try:
        model = ir.load(path)
    except Exception as error:  # a file the checker accepted but onnx_ir cannot read
        raise InputError(f"{path}: cannot load the model: {one_line(error)}") from None
    # ir.load sets the folder of the main graph's external tensors only.
    for function in model.functions.values():
        ir.external_data.set_base_dir(function.graph, path.parent)
    _check_external_files(model, path)
    return model


def _give_umask_permissions(path: Path) -> None:
    # Temporary files are made private; what we leave behind should look like any new file.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def as_ir_model(model: onnx.ModelProto | ir.Model | str | os.PathLike) -> ir.Model:
    """The ``ir.Model`` behind a model argument of the public API.

    An ``ir.Model`` is taken as it is. A ModelProto is copied first: onnx_ir wraps its tensors, so
    a pass that renames a value would write into the caller's proto. A path is checked and loaded
    with :func:`load_model`.
    """
    if isinstance(model, ir.Model):
        return model
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return ir.serde.deserialize_model(copy)
    return load_model(model)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, what: str = "output") -> Iterator[str]:
    """Yield a temporary path beside ``path`` that replaces ``path`` once the block succeeds.

    On any failure the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    folder = path.parent.resolve()
    if not folder.is_dir():
        raise InputError(f"{path}: the output folder does not exist")
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as error:
        raise InputError(f"{path}: cannot write the {what}: {error.strerror}") from None
    os.close(handle)
    try:
        yield temporary
        _give_umask_permissions(Path(temporary))
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, Exception) and not isinstance(error, InputError):
            raise InputError(f"{path}: cannot write the {what}: {one_line(error)}") from None
        raise


def save_model(model: ir.Model, path: str | os.PathLike, *, source: str | os.PathLike | None = None) -> None:
    """Write ``model`` to ``path`` atomically.

    External weights are referenced where they are when ``path`` sits in their folder, so nothing
    is copied; elsewhere they are streamed into ``<path>.data`` beside the output.
    """
    path = Path(path)
    if source is not None and Path(source).resolve() == path.resolve():
        raise InputError(f"{path}: the output path is the input path; choose another output")
    external = _ExternalData.of(model)
    data_files = {Path(tensor.path).resolve() for tensor in external.tensors}
    if {path.resolve(), path.with_name(f"{path.name}.data").resolve()} & data_files:
        raise InputError(f"{path}: writing there would overwrite the input's external data; choose another output")
    folder = {path.parent.resolve()}
    if {Path(attr.value.base_dir).resolve() for _, attr in external.attributes} - folder:
        _read_attributes(external.attributes)
    external_data = None
    if {Path(tensor.base_dir).resolve() for tensor in external.initializers} - folder:
        external_data = f"{path.name}.data"
    with atomic_path(path) as temporary:
        ir.save(model, temporary, external_data=external_data)
    if external_data is not None:
        _give_umask_permissions(path.with_name(external_data))
