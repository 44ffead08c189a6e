"""Load and save models safely: checked on the way in, written atomically on the way out.

Failures raise :class:`~dql_pass.errors.InputError` with a one-line message. The input is never
written to, and a failed save leaves no partial file behind.
"""

from __future__ import annotations

__all__ = ["ExternalData", "FolderLock", "as_ir_model", "default_file_mode", "atomic_path", "check_not_system", "check_output_path", "external_tensors", "in_memory", "load_model", "one_line", "save_model", "signals_deferred", "sweep"]

import contextlib
import dataclasses
import errno
import hashlib
import logging
import math
import os
import re
import secrets
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import onnx
import onnx_ir as ir

from dql_pass.errors import InputError

try:
    import fcntl
except ImportError:  # not on Windows: writes there are atomic but not locked against each other
    fcntl = None

logger = logging.getLogger(__name__)


def one_line(error: BaseException) -> str:
    """An exception's message on one line, whole: a runtime's reason often names its cause last."""
    return " ".join(str(error).split())


@dataclasses.dataclass
class ExternalData:
    """The model's tensors kept in external data, found in one walk over every graph and function."""

    values: list[ir.Value]
    attributes: list[tuple[ir.Node, ir.Attr]]

    @classmethod
    def of(cls, model: ir.Model) -> ExternalData:
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
        self.values += [v for v in graph.initializers.values() if isinstance(v.const_value, ir.ExternalTensor)]

    @property
    def initializers(self) -> list[ir.ExternalTensor]:
        return [value.const_value for value in self.values]

    @property
    def tensors(self) -> list[ir.ExternalTensor]:
        return self.initializers + [attr.value for _, attr in self.attributes]


def external_tensors(model: ir.Model) -> list[ir.ExternalTensor]:
    """Every tensor of the model kept in external data: initializers and attributes, all graphs."""
    return ExternalData.of(model).tensors


def in_memory(tensor: ir.ExternalTensor) -> ir.Tensor:
    """The tensor's values, read from its file."""
    return ir.tensor(tensor.numpy(), name=tensor.name)


def _read_attributes(attributes: list[tuple[ir.Node, ir.Attr]]) -> None:
    for node, attr in attributes:
        node.attributes[attr.name] = ir.AttrTensor(attr.name, in_memory(attr.value))


def _checked(tensor: ir.ExternalTensor, path: Path) -> ir.ExternalTensor:
    """``tensor`` with its offset and length spelled out, once its file is known to hold them.

    The spec makes both optional (offset 0, length to the end of the file); a declared length
    must be the tensor's size, or the output would declare bytes that are not there.
    """
    data = Path(tensor.path)
    if not data.is_file():
        raise InputError(f"{path}: the external data file {data} is missing")
    offset = tensor.offset or 0
    size = (tensor.dtype.bitwidth * math.prod(tensor.shape.numpy()) + 7) // 8
    if tensor.length is not None and tensor.length != size:
        raise InputError(
            f"{path}: the external tensor {tensor.name!r} declares {tensor.length} bytes, but its type and shape take {size}"
        )
    if data.stat().st_size < offset + size:
        raise InputError(f"{path}: the external data file {data} is shorter than the model says")
    if tensor.offset == offset and tensor.length == size:
        return tensor
    return ir.ExternalTensor(
        tensor.location, offset, size, tensor.dtype, shape=tensor.shape, name=tensor.name, base_dir=tensor.base_dir
    )


def _check_external_files(model: ir.Model, path: Path) -> None:
    external = ExternalData.of(model)
    for value in external.values:
        value.const_value = _checked(value.const_value, path)
    for node, attr in external.attributes:
        node.attributes[attr.name] = ir.AttrTensor(attr.name, _checked(attr.value, path))


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
        model = _read(path)
    except Exception as error:  # a file the checker accepted but onnx_ir cannot read
        raise InputError(f"{path}: cannot load the model: {one_line(error)}") from None
    _check_external_files(model, path)
    # What the file consists of, before a pass drops weights: save_model protects it all.
    model.meta[_LOADED_FROM] = (path.resolve(), _data_files(model))
    return model


_LOADED_FROM = "dql_pass.loaded_from"


def _read(path: Path) -> ir.Model:
    model = ir.load(path)
    # ir.load sets the folder of the main graph's external tensors only.
    for function in model.functions.values():
        ir.external_data.set_base_dir(function.graph, path.parent)
    return model


def _data_files(model: ir.Model) -> frozenset[Path]:
    return frozenset(Path(tensor.path).resolve() for tensor in external_tensors(model))


def _input_files(model: ir.Model, source: str | os.PathLike) -> set[Path]:
    """The files the model at ``source`` consists of, resolved: the model and every data file it
    refers to, whatever the pass dropped. Known from the load when ``model`` was read from there."""
    resolved = Path(source).resolve()
    loaded_from, files = model.meta.get(_LOADED_FROM, (None, None))
    if loaded_from != resolved:
        files = _data_files(_read(Path(source)))
    return {resolved, _entry(Path(source)), *files}  # a link named as the input is the input too


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




# The system's own folders: what is there stands for a device or a process (/dev/stdout,
# /proc/self/fd/1), whatever it looks like. /dev/shm is a plain tmpfs for files.
_SYSTEM_FOLDERS = (Path("/proc"), Path("/dev"))
_FILE_FOLDERS = (Path("/dev/shm"),)


def _within(path: Path, folders: tuple[Path, ...]) -> bool:
    return any(path == folder or folder in path.parents for folder in folders)


def check_not_system(path: str | os.PathLike, what: str = "output") -> None:
    """Refuse ``path`` if it, or any link on the way from it to its target, lies in /proc or /dev.

    A link is followed one step at a time, since the kernel's links there (``/proc/self/fd/1``)
    name the file they stand for: the whole chain must stay out of those folders.
    """
    current = Path(os.path.abspath(path))
    for _ in range(40):  # the kernel's limit on links in a row
        place = Path(os.path.realpath(current.parent)) / current.name
        if _within(place, _SYSTEM_FOLDERS) and not _within(place, _FILE_FOLDERS):
            where = current if _within(current, _SYSTEM_FOLDERS) else place  # the name as the link spells it
            shown = "is" if where == Path(os.path.abspath(path)) else f"leads to {where}, which is"
            raise InputError(f"{path}: {shown} in /dev or /proc, the system's own files; it is never replaced")
        try:
            target = os.readlink(place)
        except OSError:  # not a link, or nothing there
            return
        current = Path(os.path.abspath(place.parent / target))
    raise InputError(f"{path}: too many links in a row; give the {what} path itself")


def check_output_path(path: str | os.PathLike, what: str = "output") -> Path:
    """The output ``path``, refused unless it names a file we may replace.

    An existing output must be a regular file or a symbolic link (the link itself is replaced,
    never its target); a device, FIFO or socket is never replaced, since as root ``-o /dev/null``
    would destroy it for the whole machine, and nothing in /dev or /proc is, nor a link that
    leads there (see :func:`check_not_system`).
    """
    text = os.fspath(path)
    if not text:
        raise InputError(f"the {what} path is empty")
    path = Path(text)
    if text.endswith(("/", os.sep)) or path.name in ("", ".", ".."):
        raise InputError(f"{text}: is a folder; give a file name for the {what}")
    check_not_system(path, what)
    if not path.parent.is_dir():
        raise InputError(f"{path}: the {what} folder does not exist")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as error:
        raise InputError(f"{path}: cannot write the {what}: {error.strerror}") from None
    if stat.S_ISDIR(mode):
        raise InputError(f"{path}: is a folder; give a file name for the {what}")
    if stat.S_ISLNK(mode):
        # /dev/stdout and /dev/fd/N are links: replacing one would break the machine as /dev/null would.
        with contextlib.suppress(OSError):
            mode = os.stat(path).st_mode  # a dangling link, or a link to a regular file, is replaced
        if stat.S_ISDIR(mode):
            raise InputError(f"{path}: links to a folder; give a file name for the {what}")
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise InputError(f"{path}: links to a device, FIFO or socket; it is never replaced")
    elif not stat.S_ISREG(mode):
        raise InputError(f"{path}: exists and is not a regular file (a device, FIFO or socket); it is never replaced")
    return path


def _entry(path: Path) -> Path:
    """The directory entry ``path`` names: its folder resolved, its last part kept even if a link."""
    return path.parent.resolve() / path.name


def _read_umask() -> int:
    # /proc says it without changing it; os.umask would leave other threads a window with umask 0.
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status") as status:
            return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def default_file_mode(folder: bool = False) -> int:
    """The permission bits a new file (or folder) gets under the process's umask."""
    return (0o777 if folder else 0o666) & ~_read_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, what: str = "output") -> Iterator[str]:
    """Yield a temporary path beside ``path`` that replaces ``path`` once the block succeeds.

    On any failure or interruption the temporary file is removed and ``path`` is left as it was.
    Only an ``OSError`` becomes :class:`InputError`: anything else is a bug, and surfaces as one.
    """
    path = check_output_path(path, what)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{_stem(path.name)}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise InputError(f"{path}: cannot write the {what}: {error.strerror}") from None
    os.close(handle)
    try:
        yield temporary
        os.chmod(temporary, default_file_mode())
        os.replace(temporary, path)
    except OSError as error:
        raise InputError(f"{path}: cannot write the {what}: {one_line(error)}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _stem(name: str) -> str:
    """What the files named after output ``name`` start with: ``name``, or for a name so long that
    ours would pass the 255-byte limit of a file name, a cut of it with a digest of the whole."""
    if len(name.encode()) <= 200:
        return name
    return name.encode()[:160].decode(errors="ignore") + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]


# The data file of OUTPUT is OUTPUT.<12 hex>.data: a fresh name for every write, so that a model is
# never renamed next to data that is not its own.
_DATA = re.compile(r"(.+)\.[0-9a-f]{12}\.data")


def _data_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(_stem(name))}\.[0-9a-f]{{12}}\.data")


def _stage_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(_stem(name))}\.[^/]*\.stage")


class FolderLock:
    """An advisory lock (flock) on a folder; the kernel drops it when the process dies."""

    def __init__(self, path: Path, *, block: bool = True) -> None:
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0))
        if fcntl is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(self.fd)
                raise

    def release(self) -> None:
        os.close(self.fd)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back for a step and the bookkeeping that must go with it.

    Blocking the signals in this thread would not do: the system hands a signal to any thread that
    does not block it (numpy's and ORT's threads too), and Python then runs the handler here at
    once. So the handlers are swapped for one that notes the signal, raised again after the step.
    """
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
        if held:
            signal.raise_signal(held[0])


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sweep(folder: Path, name: str, keep: set[Path]) -> None:
    """Remove what earlier writes of ``name`` left: unreferenced data files and stage folders.

    Runs under the folder lock, which every writer holds from moving its data in to renaming its
    model. A data file is kept if it is in ``keep`` (the input's files and the new model's), or if
    another file of the folder may refer to it (see :func:`_referred_to`): a model that survives
    keeps its data, whoever wrote it. A stage folder that its writer still holds locked is in
    flight, and kept. Links are never ours.
    """
    data, stage = _data_pattern(name), _stage_pattern(name)
    entries = list(os.scandir(folder))
    unused = {folder / e.name for e in entries if data.fullmatch(e.name) and e.is_file(follow_symlinks=False)} - keep
    unused -= _referred_to(folder, entries, unused, skip=keep | {folder / name})
    for entry in entries:
        path = folder / entry.name
        try:
            if path in unused:
                os.unlink(path)
            elif path not in keep and stage.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                held = FolderLock(path, block=False)
                try:
                    shutil.rmtree(path)
                finally:
                    held.release()
            else:
                continue
            logger.info("removed %s, left by an earlier write", path)
        except BlockingIOError:
            continue
        except OSError as error:
            logger.warning("cannot remove %s: %s", path, error.strerror)


def _referred_to(folder: Path, entries: list[os.DirEntry], candidates: set[Path], skip: set[Path]) -> set[Path]:
    """The ``candidates`` that a file of ``folder`` outside ``skip`` may refer to.

    A model names its data file in its bytes, so a file that holds a candidate's name may be a
    model that needs it (a copy of an older output, say), and a link that leads to one may be the
    name a model uses. A file that cannot be read keeps them all. Models in other folders are not
    looked for: ONNX allows no ``..`` in a location, and a copy of an output made elsewhere looks
    for its data there, beside it.
    """
    found: set[Path] = set()
    names = {path.name.encode(): path for path in candidates}
    for entry in entries:
        path = folder / entry.name
        if not names or path in candidates or path in skip:
            continue
        try:
            if entry.is_symlink():
                target = Path(os.path.realpath(path))
                if target in candidates:
                    found.add(target)
                    names.pop(target.name.encode(), None)
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            with open(path, "rb") as file:
                if path.suffix.lower() in _TEXT_FORMATS or _may_be_model(file):
                    file.seek(0)
                    found |= {names.pop(key) for key in _mentioned(file, set(names))}
        except OSError as error:
            logger.warning("cannot read %s, so the data files of earlier writes are kept: %s", path, error.strerror)
            return set(candidates)
    return found


# The extensions of onnx's textual formats (onnx.serialization: textproto, json, onnxtxt), which
# dql_pass writes too: such a model names its data file in its text, and is read through.
_TEXT_FORMATS = frozenset({".pbtxt", ".prototxt", ".txtpb", ".textproto", ".onnxjson", ".json", ".onnxtxt", ".onnxtext"})


def _may_be_model(file: BinaryIO) -> bool:
    """Whether ``file`` parses as protobuf fields to its end, as a ModelProto must: a weights file
    fails within a few fields, so it is not read through."""
    size = os.fstat(file.fileno()).st_size
    for _ in range(100_000):  # a model has few top-level fields; past that, read it through
        if file.tell() == size:
            return True
        tag = _varint(file)
        if tag is None or tag >> 3 == 0:
            return False
        wire = tag & 7
        if wire == 0:
            if _varint(file) is None:
                return False
        elif wire == 2:
            length = _varint(file)
            if length is None:
                return False
            file.seek(length, os.SEEK_CUR)
        elif wire in (1, 5):
            file.seek(8 if wire == 1 else 4, os.SEEK_CUR)
        else:
            return False
        if file.tell() > size:
            return False
    return True


def _varint(file: BinaryIO) -> int | None:
    value = shift = 0
    while shift < 64 and (byte := file.read(1)):
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
    return None


def _mentioned(file: BinaryIO, keys: set[bytes], block: int = 1 << 24) -> set[bytes]:
    """The ``keys`` that occur in ``file``, read a block at a time."""
    found: set[bytes] = set()
    overlap = max(map(len, keys), default=1) - 1
    tail = b""
    while keys - found and (chunk := file.read(block)):
        window = tail + chunk
        found |= {key for key in keys - found if key in window}
        tail = window[len(window) - overlap:]
    return found


def _modes(model: ir.Model, source: str | os.PathLike | None) -> tuple[int, int]:
    """Permission bits for the new model and its data: the input's, so private weights stay private."""
    model_mode = default_file_mode() if source is None else stat.S_IMODE(os.stat(source).st_mode)
    data_mode = model_mode
    for tensor in external_tensors(model):
        data_mode &= stat.S_IMODE(os.stat(tensor.path).st_mode)
    return model_mode, data_mode


def _may_refer_to(tensor: ir.ExternalTensor, folder: Path) -> bool:
    """Whether a model saved in ``folder`` may refer to ``tensor``'s file where it is: in that
    folder, and not the data file of another output, which the next write of that output removes."""
    return Path(tensor.base_dir).resolve() == folder and not _DATA.fullmatch(Path(tensor.location).name)


# Protobuf refuses a message of 2 GiB or more; the graph around the tensors gets the rest.
INLINE_LIMIT = (1 << 31) - (1 << 27)
_THRESHOLD = 256  # bytes: smaller tensors stay in the model (ir.save's threshold)
_STREAMED = 1 << 20  # bytes: larger tensors of a one-file model are serialised one at a time


def save_model(
    model: ir.Model, path: str | os.PathLike, *, source: str | os.PathLike | None = None, external: bool = False
) -> None:
    """Write ``model`` to ``path`` atomically, with its external data as one unit.

    External weights are referenced where they are when ``path`` sits in their folder, so nothing
    is copied; elsewhere, or when they are another output's data file, they are streamed into a new
    ``<path>.<12 hex>.data`` beside the output. So are the tensors held in memory when ``external``
    (the input kept its weights in external data) or when they would take the model past
    :data:`INLINE_LIMIT`.
    ``path`` is replaced last, by one rename: whatever happens, it is the complete old model with
    its data or the complete new one. Nothing is written through a link, and no file the input
    consists of is replaced: ``source`` and every data file it refers to, though ``model`` may no
    longer use them (lower and fuse drop weights). The new data file's name must be free. A
    successful write removes the data files and stage folders that earlier writes of ``path``
    left, unless the input, the new model or another file of the folder refers to them (see
    :func:`sweep`).
    """
    path = check_output_path(path)
    entry = _entry(path)
    found = ExternalData.of(model)
    # The input as it is on disk, not what is left of it in the model: lower and fuse drop weights.
    inputs = set(_data_files(model))
    if source is not None:
        if entry in (Path(source).resolve(), _entry(Path(source))):
            raise InputError(f"{path}: the output path is the input path; choose another output")
        try:
            inputs |= _input_files(model, source)
        except Exception as error:  # a source that is gone, or not a model
            raise InputError(f"{path}: cannot write the output: cannot read the input {source}: {one_line(error)}") from None
    if entry in inputs:
        raise InputError(f"{path}: writing there would overwrite the input or its external data; choose another output")
    folder = entry.parent
    moved = [value for value in found.values if not _may_refer_to(value.const_value, folder)]
    held = [value for graph in model.graphs() for value in graph.initializers.values()
            if value.const_value is not None and not isinstance(value.const_value, ir.ExternalTensor)
            and value.const_value.nbytes > _THRESHOLD]
    if not external and sum(value.const_value.nbytes for value in held) <= INLINE_LIMIT:
        held = []
    data_name = f"{_stem(path.name)}.{secrets.token_hex(6)}.data" if moved or held else None
    try:
        if not all(_may_refer_to(attr.value, folder) for _, attr in found.attributes):
            _read_attributes(found.attributes)
        model_mode, data_mode = _modes(model, source)
        _write(model, folder, path.name, data_name, moved + held, model_mode, data_mode, keep=inputs)
    except OSError as error:
        raise InputError(f"{path}: cannot write the output: {one_line(error)}") from None


def _save(model: ir.Model, path: Path, data_name: str | None, values: list[ir.Value]) -> None:
    """``ir.save`` of ``model`` with ``values``' tensors streamed, one at a time, into ``data_name``
    beside ``path``; the model is left as it was."""
    tensors = [value.const_value for value in values]
    if data_name is not None:
        written = ir.external_data.convert_tensors_to_external(tensors, path.parent, data_name)
        for value, tensor in zip(values, written):
            value.const_value = tensor
    try:
        protobuf = onnx.serialization.registry.get_format_from_file_extension(path.suffix) in (None, "protobuf")
        if data_name is None and protobuf:
            _save_streamed(model, path)
        else:
            ir.save(model, path)
    finally:
        for value, tensor in zip(values, tensors):
            value.const_value = tensor


def _save_streamed(model: ir.Model, path: Path) -> None:
    """``ir.save`` of a model whose tensors stay in it, without a second and a third copy of them.

    The model goes out without its large initializers, then each of them as a message of its own:
    protobuf merges a message field that occurs twice (here ``graph``) and appends to a repeated
    one (``initializer``), so the file parses as one model. Each tensor is serialised alone.
    """
    large = [value for value in model.graph.initializers.values()
             if value.const_value is not None and not isinstance(value.const_value, ir.ExternalTensor)
             and value.const_value.nbytes > _STREAMED]
    tensors = [value.const_value for value in large]
    for value in large:  # a stand-in that serialises without its bytes, dropped from the proto below
        value.const_value = ir.ExternalTensor("", 0, 0, value.const_value.dtype, shape=value.const_value.shape, name=value.name)
    try:
        proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in zip(large, tensors):
            value.const_value = tensor
    names = {value.name for value in large}
    for index in reversed(range(len(proto.graph.initializer))):
        if proto.graph.initializer[index].name in names:
            del proto.graph.initializer[index]
    with open(path, "wb") as file:
        file.write(proto.SerializeToString())
        del proto
        for value, tensor in zip(large, tensors):
            piece = onnx.ModelProto()
            tensor.name = value.name  # as ir.serde does for initializers
            ir.serde.serialize_tensor_into(piece.graph.initializer.add(), tensor)
            file.write(piece.SerializeToString())


def _write(
    model: ir.Model, folder: Path, name: str, data_name: str | None, values: list[ir.Value], model_mode: int,
    data_mode: int, keep: set[Path],
) -> None:
    """The steps of :func:`save_model`, each one undone if a later one fails or is interrupted;
    ``values``' tensors go to ``data_name``, the model's other external tensors stay where they are."""
    # The stage folder is made and locked under the folder lock, so no sweep sees it unlocked.
    stage = stage_lock = None
    data = folder / data_name if data_name is not None else None
    try:
        lock = FolderLock(folder)
        try:
            with signals_deferred():  # else Ctrl-C could land between mkdtemp and the assignment
                stage = Path(tempfile.mkdtemp(prefix=f".{_stem(name)}.", suffix=".stage", dir=folder))
            stage_lock = FolderLock(stage)
        finally:
            lock.release()
        staged = stage / name
        _save(model, staged, data_name, values)
        os.chmod(staged, model_mode)
        _fsync(staged)
        if data is not None:
            os.chmod(stage / data_name, data_mode)
            _fsync(stage / data_name)
        # Under the folder lock, so that no sweep takes the new data before its model is in place.
        lock = FolderLock(folder)
        try:
            if data is not None:
                if os.path.lexists(data):  # a fresh name is no file's: neither the input's data nor the old output's
                    taken, data = data, None
                    raise FileExistsError(errno.EEXIST, "the new data file's name is taken", os.fspath(taken))
                os.rename(stage / data_name, data)
            with signals_deferred():  # the data is the new model's once it is in place: not ours to undo
                os.replace(staged, folder / name)
                data = None
            try:
                _fsync(folder)
                sweep(folder, name, keep | ({folder / data_name} if data_name else set()))
            except OSError as error:  # the new model is in place: what is left is tidying up
                logger.warning("%s: written, but not tidied up: %s", folder / name, one_line(error))
        finally:
            lock.release()
    finally:
        if data is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(data)
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        if stage_lock is not None:
            stage_lock.release()
