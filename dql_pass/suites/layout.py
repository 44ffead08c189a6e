"""The suite's folder layout: its names, its manifest, and reading its files with bounds.

- The layout is ONNX's backend-test layout:
  ``test_dynamicquantizelinear_<case>[_expanded_<variant>]_opset<N>/`` holding ``model.onnx``,
  ``data.json`` and ``test_data_set_0/input_0.pb``, ``output_0.pb`` .. ``output_2.pb``;
  ``manifest.json`` beside the folders lists each one as a :class:`SuiteEntry`, and those left out
  as :class:`LeftOut`.
- A suite may come from anywhere, so a file is read only when it is a regular file inside the suite
  (after symlinks) and no larger than the model's types and shapes allow; external data of a test
  file is resolved in its data set folder by onnx's rules. A file refused, missing or unreadable
  raises :class:`Refused`, with the reason its test fails with.
"""

from __future__ import annotations

__all__ = [
    "CASE_FILES",
    "DATA",
    "DATA_SET",
    "FORMAT",
    "FORMS",
    "INPUT_FILE",
    "MANIFEST",
    "MODEL",
    "OUTPUT_FILES",
    "UNKNOWN_SHAPE_LIMIT",
    "LeftOut",
    "Refused",
    "SuiteEntry",
    "data_set_tensors",
    "folder_name",
    "read_file",
    "read_manifest",
    "read_model",
    "written_paths",
]

import dataclasses
import json
import math
import os
import re
import stat
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

from dql_pass.errors import InputError, one_line
from dql_pass.op import OUTPUTS
from dql_pass.suites.defaults import FORMS

MANIFEST = "manifest.json"
FORMAT = "dql_pass conformance suite 1"
DATA_SET = "test_data_set_0"
MODEL = "model.onnx"
DATA = "data.json"
INPUT_FILE = f"{DATA_SET}/input_0.pb"
OUTPUT_FILES = tuple(f"{DATA_SET}/output_{i}.pb" for i in range(len(OUTPUTS)))
# What gen-tests writes in each test folder: with the folders the manifest lists, all a suite holds.
CASE_FILES = (MODEL, DATA, INPUT_FILE, *OUTPUT_FILES)
_PREFIX = "test_dynamicquantizelinear_"

# Bounds on what is read from a suite that may come from anywhere.
_MANIFEST_LIMIT = 8 << 20  # the default suite's manifest is 0.35 MB
_MODEL_LIMIT = 2 << 30  # protobuf's limit on one message
UNKNOWN_SHAPE_LIMIT = 1 << 30  # a tensor whose shape the model does not fix: generous, but finite
_TENSOR_OVERHEAD = 1 << 16  # a TensorProto's name, dims and data type
_ELEMENT_BYTES = 16  # the most one element takes: complex128, or any integer as a varint (10)


@dataclasses.dataclass(frozen=True)
class SuiteEntry:
    """One test folder of a suite, as ``manifest.json`` lists it."""

    name: str
    folder: str
    category: str  # the category the case is listed under in the catalogue
    opset: int
    variant: str
    policy: str
    description: str
    shape: tuple[int, ...]
    policy_dependent: bool
    comparable: bool
    known_differences: dict[str, str] = dataclasses.field(default_factory=dict)
    op: str = "DynamicQuantizeLinear"
    # The family's folders list their files (inputs and outputs vary by op); empty: :data:`CASE_FILES`.
    files: list[str] = dataclasses.field(default_factory=list)
    answers: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # a runtime's known answer, its files
    lacks: dict[str, str] = dataclasses.field(default_factory=dict)  # runtimes that cannot run the op: why


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """A test folder not written because the suite's backend cannot run its model, as ``manifest.json`` lists it."""

    folder: str
    name: str
    opset: int
    variant: str
    reason: str


def folder_name(case: str, form: str, opset: int) -> str:
    """The test folder of catalogue case ``case`` in ``form`` (native or a variant) at ``opset``."""
    # '-' (as in magnitude_1e-30) would make test names that pytest -k and unittest cannot select.
    stem = re.sub(r"[^A-Za-z0-9_]", "_", case)
    expanded = "" if form == "native" else f"_expanded_{form}"
    return f"{_PREFIX}{stem}{expanded}_opset{opset}"


class Refused(Exception):
    """A file of the suite that is missing or that will not be read: its test fails with this reason."""


def read_file(path: Path, root: Path, limit: int, label: str) -> bytes:
    """The bytes of ``path``: a regular file inside ``root`` (``root`` resolved), symlinks followed, of at most
    ``limit`` bytes.

    ``label`` names the file in the reason of a refusal. A FIFO would block and /dev/zero never
    ends, so special files are refused before they are opened; a file outside the suite is not
    the suite's to give.
    """
    if not os.path.lexists(path):
        raise Refused(f"{label} is missing")
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(root):
        raise Refused(f"{label} is outside the suite (through a symlink)")
    try:
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise Refused(f"{label} is not a regular file")
        # No blocking and no symlink: what is opened is the file just checked, or the open fails.
        handle = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(handle, "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise Refused(f"{label} is not a regular file")
            if status.st_size > limit:
                raise Refused(f"{label} holds {status.st_size} bytes, more than the {limit} it may hold")
            data = file.read(limit + 1)
    except OSError as error:
        raise Refused(f"{label}: cannot read it: {error.strerror or error}") from None
    if len(data) > limit:
        raise Refused(f"{label} grew past the {limit} bytes it may hold while it was read")
    return data


def read_model(folder: Path, root: Path) -> onnx.ModelProto:
    """The ``model.onnx`` of test folder ``folder``, read for its names, types and shapes (not its external data)."""
    data = read_file(folder / MODEL, root, _MODEL_LIMIT, MODEL)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as error:  # protobuf's DecodeError, or what a malformed message raises
        raise Refused(f"{MODEL}: not an ONNX model: {one_line(error)}") from None
    return model


def _tensor_limit(value: onnx.ValueInfoProto) -> int:
    """The most bytes a TensorProto of ``value`` can take, by its type and shape."""
    tensor = value.type.tensor_type
    dims = tensor.shape.dim
    fixed = (
        value.type.HasField("tensor_type") and tensor.HasField("shape") and tensor.elem_type != onnx.TensorProto.STRING
        and all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims)
    )
    if not fixed:
        return UNKNOWN_SHAPE_LIMIT
    return _TENSOR_OVERHEAD + len(value.name.encode()) + _ELEMENT_BYTES * math.prod(d.dim_value for d in dims)


def _load_external(tensor: onnx.TensorProto, base: Path, limit: int, label: str) -> None:
    """Read the external data of ``tensor`` from ``base``, by onnx's rules, bounded by ``limit``."""
    try:
        with warnings.catch_warnings():  # on unknown keys, which onnx ignores
            warnings.simplefilter("ignore")
            info = external_data_helper.ExternalDataInfo(tensor)
        size = info.length
        if size is None:  # to the end of the file: only its size bounds the read (onnx reads regular files only)
            data = base / info.location
            size = (os.lstat(data).st_size if os.path.lexists(data) else 0) - (info.offset or 0)
        if size > limit:
            raise Refused(f"{label}: its external data holds {size} bytes, more than the {limit} it may hold")
        external_data_helper.load_external_data_for_tensor(tensor, os.fspath(base))
    except (OSError, ValueError, onnx.checker.ValidationError) as error:
        raise Refused(f"{label}: external data refused: {one_line(error)}") from None


def _read_tensor(path: Path, root: Path, limit: int, label: str) -> tuple[str, np.ndarray]:
    data = read_file(path, root, limit, label)
    tensor = onnx.TensorProto()
    try:
        tensor.ParseFromString(data)
    except Exception as error:  # protobuf's DecodeError, or what a malformed message raises
        raise Refused(f"{label}: not a TensorProto: {one_line(error)}") from None
    if external_data_helper.uses_external_data(tensor):
        # Where onnx.load_tensor looks: beside the file, never in the current folder.
        _load_external(tensor, path.parent, limit, label)
    try:
        return tensor.name, numpy_helper.to_array(tensor)
    except Exception as error:  # dims that do not fit the data, an unknown data type ...
        raise Refused(f"{label}: cannot read the tensor: {one_line(error)}") from None


def data_set_tensors(
    data_set: Path, root: Path, kind: str, values: Sequence[onnx.ValueInfoProto],
) -> dict[str, np.ndarray]:
    """The ``kind`` (input or output) files of one data set, by the name of the model's value each one holds.

    There must be one file per value, numbered as onnx's runner reads them (input_0.pb, input_1.pb,
    ...); a file holds the value it is named after, else the one at its position.
    """
    names = [value.name for value in values]
    files = [f"{kind}_{i}.pb" for i in range(len(values))]
    extra = sorted({p.name for p in data_set.glob(f"{kind}_*.pb")} - set(files))
    if extra:
        raise Refused(f"{data_set.name}/{extra[0]}: the model has {len(values)} {kind}s, so no such file is read")
    limit = max((_tensor_limit(value) for value in values), default=0)
    found: dict[str, np.ndarray] = {}
    holder: dict[str, str] = {}
    for i, file in enumerate(files):
        label = f"{data_set.name}/{file}"
        name, array = _read_tensor(data_set / file, root, limit, label)
        name = name if name in names else names[i]
        if name in found:
            raise Refused(f"{label} holds {name}, as {holder[name]} does")
        found[name], holder[name] = array, label
    return found


def read_manifest(path: Path, root: Path) -> dict[str, dict]:
    """The entries of the suite ``path``'s manifest by folder; none when it has no manifest.

    A manifest refused or malformed makes the whole suite bad input.
    """
    file = path / MANIFEST
    if not os.path.lexists(file):
        return {}
    try:
        entries = json.loads(read_file(file, root, _MANIFEST_LIMIT, MANIFEST))["cases"]
        manifest = {e["folder"]: e for e in entries}
    except Refused as refusal:
        raise InputError(f"{path}: {refusal}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(f"{file}: not a readable suite manifest ({type(error).__name__}: {one_line(error)})") from None
    for folder, entry in manifest.items():
        known = entry.get("known_differences", {})
        if not (isinstance(folder, str) and isinstance(entry.get("comparable", True), bool) and isinstance(known, dict)
                and all(isinstance(reason, str) for reason in known.values())):
            raise InputError(f"{file}: not a readable suite manifest (the entry of {folder!r} is malformed)")
    return manifest


def written_paths(path: Path) -> set[str] | None:
    """The paths (relative, with /) that gen-tests wrote in ``path``, by its manifest; None when it holds no suite."""
    try:
        manifest = json.loads(read_file(path / MANIFEST, path.resolve(), _MANIFEST_LIMIT, MANIFEST))
        if manifest.get("format") != FORMAT:
            return None
        listed = {entry["folder"]: entry.get("files") or CASE_FILES for entry in manifest["cases"]}
    except (Refused, ValueError, AttributeError, KeyError, TypeError):
        return None
    if not all(isinstance(folder, str) and all(isinstance(f, str) for f in files) for folder, files in listed.items()):
        return None
    return {MANIFEST} | {
        file for folder, files in listed.items()
        for file in (folder, f"{folder}/{DATA_SET}", *(f"{folder}/{f}" for f in files))
    }
