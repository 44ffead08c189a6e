"""Load and save models safely: checked on the way in, written atomically with their external data
on the way out, through :mod:`dql_pass.files.safe` (where the tensors sit:
:mod:`dql_pass.files.tensors`; the protobuf written: :mod:`dql_pass.files.protobuf`).

Failures raise :class:`~dql_pass.errors.InputError` with a one-line message. The input is never
written to, and a failed save leaves no partial file behind.
"""

from __future__ import annotations

__all__ = ["ExternalData", "as_ir_model", "external_tensors", "in_memory", "load_model", "model_form", "read_model",
           "save_model"]

import contextlib
import errno
import math
import os
import re
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx_ir as ir

from dql_pass.errors import InputError, one_line
from dql_pass.files.protobuf import AROUND_DATA, TooLarge, check_size, save_streamed, serialized
from dql_pass.files.safe import (
    FolderLock, check_output_path, data_file_name, default_file_mode, directory_entry, entries_of, fsync, is_data_file,
    signals_deferred, stale_data, staged, tidy_up,
)
from dql_pass.files.tensors import ExternalData, Slot, external_tensors, in_memory, slots, stand_ins



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
        raise _not_a_data_file(path, data)
    offset = tensor.offset or 0
    size = (tensor.dtype.bitwidth * math.prod(tensor.shape.numpy()) + 7) // 8
    if tensor.length is not None and tensor.length != size:
        raise InputError(
            f"{path}: the external tensor {tensor.name!r} declares {tensor.length} bytes, "
            f"but its type and shape take {size}"
        )
    if data.stat().st_size < offset + size:
        raise InputError(f"{path}: the external data file {data} is shorter than the model says")
    if tensor.offset == offset and tensor.length == size:
        return tensor
    return ir.ExternalTensor(
        tensor.location, offset, size, tensor.dtype, shape=tensor.shape, name=tensor.name, base_dir=tensor.base_dir
    )


def _not_a_data_file(path: Path, data: Path) -> InputError:
    what = "is not a regular file" if os.path.lexists(data) else "is missing"
    return InputError(f"{path}: the external data file {data} {what}")


def _check_external_files(model: ir.Model, path: Path) -> None:
    external = ExternalData.of(model)
    for value in external.values:
        value.const_value = _checked(value.const_value, path)
    for node, attr in external.attributes:
        node.attributes[attr.name] = ir.AttrTensor(attr.name, _checked(attr.value, path))


_STORED_ELSEWHERE = re.compile(r"should be stored in (.+?), but it is not regular file")  # onnx.checker's words


def load_model(path: str | os.PathLike) -> ir.Model:
    """Check the file with onnx's full checker, then load it; external data stays on disk, unread."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: cannot read the file")
    try:
        _check(path)
    except onnx.shape_inference.InferenceError as error:
        raise InputError(f"{path}: the model fails ONNX shape inference: {one_line(error)}") from None
    except onnx.checker.ValidationError as error:
        stored = _STORED_ELSEWHERE.search(str(error))
        if stored:  # the checker's words for a data file that is not there
            raise _not_a_data_file(path, Path(stored.group(1))) from None
        raise InputError(f"{path}: not a valid ONNX model: {one_line(error)}") from None
    try:
        model = read_model(path)
    except Exception as error:  # a file the checker accepted but onnx_ir cannot read
        while (error.__cause__ or error.__context__) is not None:  # onnx_ir's own wrapping names only the graph
            error = error.__cause__ or error.__context__
        raise InputError(f"{path}: cannot load the model: {one_line(error)}") from None
    _check_external_files(model, path)
    # What the file consists of, before a pass drops weights: save_model protects it all.
    model.meta[_LOADED_FROM] = (path.resolve(), _data_files(model))
    return model


_LOADED_FROM = "dql_pass.loaded_from"


def model_form(path: str | os.PathLike) -> str:
    """The form of the model file at ``path`` by its extension, as onnx and onnx_ir load and save it:
    ``json``, ``textproto``, ``onnxtxt``, else ``protobuf`` (the only one runtimes read)."""
    return onnx.serialization.registry.get_format_from_file_extension(Path(path).suffix) or "protobuf"


def _check(path: Path) -> None:
    """onnx's full check of the model at ``path``, read in its :func:`model_form`: what ``save_model``
    writes, ``load_model`` reads."""
    form = model_form(path)
    if form == "protobuf":
        onnx.checker.check_model(os.fspath(path), full_check=True)  # from the path: a model past 2 GiB too
        return
    try:
        with _quiet_onnxtxt():
            proto = onnx.load_model(path, format=form, load_external_data=False)
    except Exception as error:  # protobuf's or onnx's parser: each its own error type
        raise InputError(f"{path}: not a valid ONNX model in the {form} form: {one_line(error)}") from None
    onnx.checker.check_model(proto, full_check=True)


@contextlib.contextmanager
def _quiet_onnxtxt() -> Iterator[None]:
    """onnx warns that the onnxtxt form is experimental on every read of one; the file is checked all the same."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The onnxtxt format is experimental", UserWarning)
        yield


def read_model(path: str | os.PathLike) -> ir.Model:
    """The model at ``path`` as onnx_ir reads it, unchecked, its external data unread (see :func:`load_model`)."""
    with _quiet_onnxtxt():
        model = ir.load(path)
    # ir.load sets the folder of the main graph's external tensors only.
    for function in model.functions.values():
        ir.external_data.set_base_dir(function.graph, Path(path).parent)
    return model


def _data_files(model: ir.Model) -> frozenset[Path]:
    return frozenset(Path(tensor.path).resolve() for tensor in external_tensors(model))


def _input_files(model: ir.Model, source: str | os.PathLike) -> set[Path]:
    """The files the model at ``source`` consists of, resolved: the model and every data file it
    refers to, whatever the pass dropped. Known from the load when ``model`` was read from there."""
    resolved = Path(source).resolve()
    loaded_from, files = model.meta.get(_LOADED_FROM, (None, None))
    if loaded_from != resolved:
        files = _data_files(read_model(source))
    if resolved != directory_entry(Path(source)):
        # Through a link the data is read beside the link; the file it leads to names data beside
        # itself too, which that model needs: as much the input's.
        files = {*files, *_data_files(read_model(resolved))}
    return {resolved, directory_entry(Path(source)), *files}  # a link named as the input is the input too


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




def _modes(source: str | os.PathLike | None, inputs: set[Path]) -> tuple[int, int]:
    """Permission bits for the new model and its data: the input's, so private weights stay private.
    The data gets those of every file of ``inputs`` too, the ones a pass dropped included: lowered
    weights computed from a private data file are as private."""
    model_mode = default_file_mode() if source is None else stat.S_IMODE(os.stat(source).st_mode)
    data_mode = model_mode
    for file in inputs:
        with contextlib.suppress(FileNotFoundError):  # a dropped file gone since the load: nothing to keep private
            data_mode &= stat.S_IMODE(os.stat(file).st_mode)
    return model_mode, data_mode


def _may_refer_to(tensor: ir.ExternalTensor, folder: Path, share_data: bool) -> bool:
    """Whether a model saved in ``folder`` may refer to ``tensor``'s file where it is: only when
    asked to (``share_data``; else the output must stand alone), in that folder, and not the data
    file of another output, which the next write of that output removes."""
    return share_data and Path(tensor.base_dir).resolve() == folder and not is_data_file(Path(tensor.location).name)


# Protobuf parses no message past 2 GiB: a one-file model up to this size stays one file.
INLINE_LIMIT = (1 << 31) - 1
_THRESHOLD = 256  # bytes: smaller tensors stay in the model (ir.save's threshold)


def _held(model: ir.Model) -> list[Slot]:
    """The tensors held in memory that external data can take (ONNX keeps no strings there)."""
    return [slot for slot in slots(model) if (tensor := slot.tensor) is not None
            and not isinstance(tensor, ir.ExternalTensor) and tensor.dtype != ir.DataType.STRING
            and tensor.nbytes > _THRESHOLD]

def _size_bound(model: ir.Model, held: list[Slot]) -> int:
    """At least the size of ``model`` serialised, the graph included: that of its protobuf without
    the ``held`` tensors' bytes, exact, and theirs."""
    with stand_ins(held):
        skeleton = ir.serde.serialize_model(model).ByteSize()
    return skeleton + sum(slot.tensor.nbytes + AROUND_DATA for slot in held)


def save_model(
    model: ir.Model, path: str | os.PathLike, *, source: str | os.PathLike | None = None, external: bool = False,
    share_data: bool = False,
) -> frozenset[str]:
    """Write ``model`` to ``path`` atomically, with its external data as one unit; the data files the
    written model refers to come back, as real paths (none for a model in one file).

    The output stands alone: external weights are streamed, never loaded whole, into a new
    ``<path>.<12 hex>.data`` beside it, and so are the initializers held in memory when
    ``external`` (the input kept its weights in external data), and every tensor held in memory,
    initializer or attribute (a Constant's), when the whole model would pass :data:`INLINE_LIMIT`;
    a model past it even so is refused. With ``share_data``, external weights in ``path``'s folder
    are referred to where they are and nothing is copied (but another output's data file, which its
    next write removes): the output then needs those files.
    ``path`` is replaced last, by one rename: whatever happens, it is the complete old model with
    its data or the complete new one. Nothing is written through a link, and no file the input
    consists of is replaced: ``source`` and every data file it refers to, though ``model`` may no
    longer use them (lower and fuse drop weights). The new data file's name must be free. A
    successful write removes the data files and stage folders that earlier writes of ``path``
    left, unless the input, the new model or another file of the folder refers to them (see
    :func:`~dql_pass.files.safe.stale_data` and :func:`~dql_pass.files.safe.sweep`).
    """
    path = check_output_path(path)
    entry = directory_entry(path)
    found = ExternalData.of(model)
    # The input as it is on disk, not what is left of it in the model: lower and fuse drop weights.
    inputs = set(_data_files(model))
    if source is not None:
        if entry in entries_of(entry.parent, (Path(source).resolve(), directory_entry(Path(source)))):
            raise InputError(f"{path}: the output path is the input path; choose another output")
        try:
            inputs |= _input_files(model, source)
        except Exception as error:  # a source that is gone, or not a model
            raise InputError(
                f"{path}: cannot write the output: cannot read the input {source}: {one_line(error)}") from None
    if entry in entries_of(entry.parent, inputs):
        raise InputError(f"{path}: writing there would overwrite the input or its external data; choose another output")
    folder = entry.parent
    try:
        kept = [attr.value for _, attr in found.attributes]
        if not all(_may_refer_to(tensor, folder, share_data) for tensor in kept):
            _read_attributes(found.attributes)
            kept = []
        moved = []
        for value in found.values:
            if _may_refer_to(value.const_value, folder, share_data):
                kept.append(value.const_value)
            else:
                moved.append(Slot(value))
        held = _held(model)
        if _size_bound(model, held) <= INLINE_LIMIT:
            # The input kept its weights in external data: so does the output.
            held = [slot for slot in held if slot.value is not None] if external else []
        data_name = data_file_name(path.name) if moved or held else None
        model_mode, data_mode = _modes(source, inputs)
        _write(model, folder, path.name, data_name, moved + held, model_mode, data_mode, keep=inputs)
    except OSError as error:
        raise InputError(f"{path}: cannot write the output: {_why_not_written(error)}") from None
    except TooLarge as error:
        raise InputError(f"{path}: cannot write the output: it takes {error.args[0]:,} bytes with every tensor that "
                         f"can be in external data there, past protobuf's limit of {INLINE_LIMIT:,}") from None
    referred = [tensor.path for tensor in kept] + ([folder / data_name] if data_name else [])
    return frozenset(os.path.realpath(file) for file in referred)


def _save(model: ir.Model, path: Path, data_name: str | None, slots: list[Slot]) -> None:
    """The model saved at ``path``, with ``slots``' tensors streamed, one at a time, into
    ``data_name`` beside it; the model is left as it was."""
    tensors = [slot.tensor for slot in slots]
    if data_name is not None:
        written = ir.external_data.convert_tensors_to_external(tensors, path.parent, data_name)
        for slot, tensor in zip(slots, written):
            slot.tensor = tensor
    try:
        protobuf = onnx.serialization.registry.get_format_from_file_extension(path.suffix) in (None, "protobuf")
        if data_name is None and protobuf:
            save_streamed(model, path, INLINE_LIMIT)
        else:
            proto = serialized(model)
            check_size(proto.ByteSize(), INLINE_LIMIT)
            onnx.save_model(proto, path)  # in the format of its extension, as ir.save
    finally:
        for slot, tensor in zip(slots, tensors):
            slot.tensor = tensor


def _why_not_written(error: OSError) -> str:
    """``error`` on one line; numpy's short write ("4096 requested and 1760 written") says what ran out."""
    if error.errno is None and re.fullmatch(r"\d+ requested and \d+ written", str(error)):
        return f"the disk is full, or a limit on the size of files was reached ({error})"
    return one_line(error)


def _write(
    model: ir.Model, folder: Path, name: str, data_name: str | None, slots: list[Slot], model_mode: int,
    data_mode: int, keep: set[Path],
) -> None:
    """The steps of :func:`save_model`, each one undone if a later one fails or is interrupted;
    ``slots``' tensors go to ``data_name``, the model's other external tensors stay where they are."""
    with staged(folder, name) as stage:
        placed = None  # the new data file, once beside the output and until its model is in place
        try:
            staged_model = stage / name
            _save(model, staged_model, data_name, slots)
            os.chmod(staged_model, model_mode)
            fsync(staged_model)
            if data_name is not None:
                os.chmod(stage / data_name, data_mode)
                fsync(stage / data_name)
            # Under the folder lock, so that no sweep takes the new data before its model is in place.
            with FolderLock(folder):
                if data_name is not None:
                    data = folder / data_name
                    # A fresh name is no file's: neither the input's data nor the old output's.
                    if os.path.lexists(data):
                        raise FileExistsError(errno.EEXIST, "the new data file's name is taken", os.fspath(data))
                    with signals_deferred():  # else Ctrl-C could land between the rename and the assignment
                        os.rename(stage / data_name, data)
                        placed = data
                kept = keep | ({folder / data_name} if data_name else set())
                stale = stale_data(folder, name, kept)
                # The data is the new model's once it is in place: not ours to undo; the removal of what
                # it replaced goes with it, or a Ctrl-C there would leave the old data beside it.
                with signals_deferred():
                    os.replace(staged_model, folder / name)
                    placed = None
                    tidy_up(folder, name, kept, stale)
        finally:
            if placed is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(placed)
