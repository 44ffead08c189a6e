"""Conformance suites for DynamicQuantizeLinear in ONNX's backend-test layout, and a runner for them.

:func:`generate_suite` writes one test folder per (input, form, opset):

- the inputs come from :mod:`dql_pass.catalogue`, the project's one input catalogue;
- the forms are the one-node DynamicQuantizeLinear model (``native``) and the models that
  :func:`dql_pass.expand` makes of it, one per variant (``_expanded_<variant>``);
- the layout is ONNX's: ``test_dynamicquantizelinear_<case>[_expanded_<variant>]_opset<N>/`` holding
  ``model.onnx``, ``data.json`` (``atol`` and ``rtol`` 0, read by onnx's loader) and
  ``test_data_set_0/input_0.pb``, ``output_0.pb`` .. ``output_2.pb``, TensorProtos named after the
  model's input and outputs; onnx's ``load_model_tests(data_dir=PARENT, kind=NAME)`` and ORT's
  onnx_test_runner both read it;
- expected outputs come from :mod:`dql_pass.reference` under the chosen zero-range policy;
- ``manifest.json`` lists every folder with its case, category, opset, variant, policy, what it
  tests, whether its expected values depend on the policy, whether it is comparable (NaN inputs are
  not, and appear only on request) and the backends known to differ from it, with the reason;
- the input of about a million elements (5 MB per folder) is written at the newest chosen opset
  only, in every chosen form, to keep the suite small;
- a folder whose model uses an op that the backend the suite is meant for cannot run (onnxruntime
  under the ``onnxruntime`` policy, ``onnx.reference`` under ``onnx-reference``; the knowledge is
  :mod:`dql_pass.runtimes`) is not written but listed under ``left_out`` in ``manifest.json``, with
  the reason; what the other backend cannot run is one of its known differences;
- the suite is staged beside OUTDIR and moved into place, so a failure leaves nothing half-written;
  an existing OUTDIR is replaced only when it is empty or a suite written here that holds nothing
  else (with ``force``, also when it holds files added since).

:func:`run_suite` runs any folder in that layout (``manifest.json`` is optional, so suites written
elsewhere work) on onnxruntime or ``onnx.reference`` and compares every output bit for bit: dtype,
shape and the raw bits of each element, so -0.0 differs from 0.0. A test passes only when each
data set has one file per input and per output of its model and every output matches. A suite may
come from anywhere, so its files are read only when they are regular files inside the suite (after
symlinks) and no larger than the model's types and shapes allow; external data of a test file is
resolved in its data set folder by onnx's rules. A file refused, missing or unreadable fails its
test with the reason; a manifest refused makes the whole suite bad input.
"""

from __future__ import annotations

__all__ = [
    "BACKENDS",
    "DEFAULT_OPSETS",
    "FORMS",
    "GeneratedSuite",
    "LeftOut",
    "Outcome",
    "RunReport",
    "SuiteEntry",
    "generate_suite",
    "run_suite",
]

import dataclasses
import json
import logging
import math
import os
import re
import secrets
import shutil
import stat
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import external_data_helper, numpy_helper

from dql_pass import catalogue, reference, runtimes
from dql_pass.errors import InputError
from dql_pass.expand import ExpandDynamicQuantizeLinearPass
from dql_pass.modelfiles import one_line
from dql_pass.op import INPUT, MAX_OPSET, MIN_OPSET, OUTPUTS, VARIANTS, check_choice, one_node_model, version
from dql_pass.compare import bit_difference

logger = logging.getLogger(__name__)

# 11 is the operator's only version; 13, 18 and 21 bring new versions of the ops the expansion uses
# (QuantizeLinear, ReduceMin/ReduceMax, Cast); 27 is the newest opset onnxruntime 1.32 runs in
# full: it has no QuantizeLinear-28 kernel.
DEFAULT_OPSETS: tuple[int, ...] = (11, 13, 18, 21, 27)
FORMS: tuple[str, ...] = ("native", *VARIANTS)
BACKENDS: tuple[str, ...] = tuple(runtimes.RUNTIMES)
MANIFEST = "manifest.json"

_FORMAT = "dql_pass conformance suite 1"
_DATA_SET = "test_data_set_0"
_PREFIX = "test_dynamicquantizelinear_"
_MODEL = "model.onnx"
_DATA = "data.json"
_INPUT_FILE = f"{_DATA_SET}/input_0.pb"
_OUTPUT_FILES = tuple(f"{_DATA_SET}/output_{i}.pb" for i in range(len(OUTPUTS)))
# What _write_case writes in each test folder: with the folders the manifest lists, all a suite holds.
_CASE_FILES = (_MODEL, _DATA, _INPUT_FILE, *_OUTPUT_FILES)
# The backend each zero-range policy's expected outputs are meant for: the folders it cannot run are left out.
_POLICY_RUNTIME = {"onnxruntime": "onnxruntime", "onnx-reference": "reference"}

# Bounds on what run-tests reads from a suite that may come from anywhere.
_MANIFEST_LIMIT = 8 << 20  # the default suite's manifest is 0.35 MB
_MODEL_LIMIT = 2 << 30  # protobuf's limit on one message
_UNKNOWN_SHAPE_LIMIT = 1 << 30  # a tensor whose shape the model does not fix: generous, but finite
_TENSOR_OVERHEAD = 1 << 16  # a TensorProto's name, dims and data type
_ELEMENT_BYTES = 16  # the most one element takes: complex128, or any integer as a varint (10)


@dataclasses.dataclass(frozen=True)
class SuiteEntry:
    """One test folder of a suite, as ``manifest.json`` lists it."""

    name: str
    folder: str
    category: str
    opset: int
    variant: str
    policy: str
    description: str
    shape: tuple[int, ...]
    policy_dependent: bool
    comparable: bool
    known_differences: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LeftOut:
    """A test folder not written because the suite's backend cannot run its model, as ``manifest.json`` lists it."""

    folder: str
    name: str
    opset: int
    variant: str
    reason: str


@dataclasses.dataclass(frozen=True)
class GeneratedSuite:
    """What :func:`generate_suite` wrote: the folder, its entries, the inputs used, bytes and seconds.

    ``left_out`` lists the folders not written because the suite's backend cannot run them.
    """

    path: Path
    entries: list[SuiteEntry]
    inputs: int
    size_bytes: int
    seconds: float
    left_out: list[LeftOut] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The result of one test folder: PASS, FAIL, XFAIL (a known difference) or SKIP."""

    name: str
    status: str
    detail: str = ""

    def line(self) -> str:
        return f"{self.status} {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclasses.dataclass(frozen=True)
class RunReport:
    """Every outcome of :func:`run_suite`, with the counts of its summary line."""

    backend: str
    outcomes: list[Outcome]

    @property
    def passed(self) -> int:
        return sum(o.status == "PASS" for o in self.outcomes)

    @property
    def failed(self) -> int:
        return sum(o.status == "FAIL" for o in self.outcomes)

    @property
    def skipped(self) -> int:
        return sum(o.status in ("XFAIL", "SKIP") for o in self.outcomes)

    def summary(self) -> str:
        text = f"{self.passed} passed, {self.failed} failed"
        return text + (f", {self.skipped} skipped" if self.skipped else "")


# --- generation -------------------------------------------------------------------------------


def _folder_name(case: str, form: str, opset: int) -> str:
    # '-' (as in magnitude_1e-30) would make test names that pytest -k and unittest cannot select.
    stem = re.sub(r"[^A-Za-z0-9_]", "_", case)
    expanded = "" if form == "native" else f"_expanded_{form}"
    return f"{_PREFIX}{stem}{expanded}_opset{opset}"


def _write_case(folder: Path, model: onnx.ModelProto, x: np.ndarray, expected: Sequence[np.ndarray]) -> None:
    onnx.checker.check_model(model, full_check=True)
    (folder / _DATA_SET).mkdir(parents=True)
    (folder / _MODEL).write_bytes(model.SerializeToString())
    (folder / _DATA).write_text(json.dumps({"atol": 0, "rtol": 0}) + "\n")
    (folder / _INPUT_FILE).write_bytes(numpy_helper.from_array(x, INPUT).SerializeToString())
    for file, name, value in zip(_OUTPUT_FILES, OUTPUTS, expected, strict=True):
        (folder / file).write_bytes(numpy_helper.from_array(np.asarray(value), name).SerializeToString())


def _ops(nodes: Iterable[onnx.NodeProto]) -> set[tuple[str, str]]:
    """The ``(domain, op_type)`` of ``nodes`` and of every node in their subgraphs."""
    found: set[tuple[str, str]] = set()
    for node in nodes:
        found.add(("" if node.domain == "ai.onnx" else node.domain, node.op_type))
        for attr in node.attribute:
            for graph in [*([attr.g] if attr.HasField("g") else []), *attr.graphs]:
                found |= _ops(graph.node)
    return found


def _lacks(model: onnx.ModelProto, runtime: str, opset: int) -> str | None:
    """Why ``runtime`` cannot run ``model``, or None when :mod:`dql_pass.runtimes` knows of no reason."""
    ops = _ops([*model.graph.node, *(node for function in model.functions for node in function.node)])
    lacks = runtimes.lacking(runtime, ops, opset)
    return "; ".join(lack.describe() for lack in lacks) or None


def _check_options(opsets: Collection[int], forms: Collection[str], zero_range: str) -> None:
    if not opsets:
        raise InputError("choose at least one opset")
    outside = sorted(o for o in opsets if not MIN_OPSET <= o <= MAX_OPSET)
    if outside:
        raise InputError(f"opset {outside[0]} is outside {MIN_OPSET}..{MAX_OPSET}")
    if not forms:
        raise InputError("choose at least one variant")
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        raise InputError(f"unknown variant {unknown[0]!r}; choose from {', '.join(FORMS)}")
    check_choice("zero-range policy", zero_range)


def _written(path: Path) -> set[str] | None:
    """The paths (relative, with /) that gen-tests wrote in ``path``, by its manifest; None when it holds no suite."""
    try:
        manifest = json.loads(_read_file(path / MANIFEST, path.resolve(), _MANIFEST_LIMIT, MANIFEST))
        if manifest.get("format") != _FORMAT:
            return None
        folders = [entry["folder"] for entry in manifest["cases"]]
    except (_Refused, ValueError, AttributeError, KeyError, TypeError):
        return None
    if not all(isinstance(folder, str) for folder in folders):
        return None
    return {MANIFEST} | {
        file for folder in folders for file in (folder, f"{folder}/{_DATA_SET}", *(f"{folder}/{f}" for f in _CASE_FILES))
    }


def _foreign(outdir: Path, written: set[str]) -> list[str]:
    """What ``outdir`` holds that gen-tests did not write: other names, and symlinks or special files in place of its own."""
    found = []

    def unlisted(error: OSError) -> None:  # a folder that cannot be listed may hold anything
        found.append(Path(error.filename).relative_to(outdir).as_posix())

    for folder, subfolders, files in os.walk(outdir, onerror=unlisted):  # symlinked folders are listed, not entered
        for name in sorted(subfolders) + sorted(files):
            path = Path(folder, name)
            relative = path.relative_to(outdir).as_posix()
            kind = os.lstat(path).st_mode
            if relative not in written or not (stat.S_ISDIR(kind) if name in subfolders else stat.S_ISREG(kind)):
                found.append(relative)
        subfolders[:] = [name for name in subfolders if Path(folder, name).relative_to(outdir).as_posix() in written]
    return sorted(found)


def _check_replaceable(outdir: Path, force: bool) -> None:
    """Raise unless ``outdir`` is absent, an empty folder or a suite written here that holds nothing else (or ``force``)."""
    if outdir.is_symlink() or outdir.exists() and not outdir.is_dir():
        raise InputError(f"{outdir}: exists and is not a folder; choose another output folder")
    if not outdir.exists() or not any(outdir.iterdir()):
        return
    written = _written(outdir)
    if written is None:
        raise InputError(f"{outdir}: a non-empty folder that holds no dql_pass suite; choose another output folder")
    foreign = [] if force else _foreign(outdir, written)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise InputError(
            f"{outdir}: the suite there holds {len(foreign)} file(s) that gen-tests did not write ({shown}); "
            "move them away, or force the replacement"
        )


def _install(stage: Path, outdir: Path, force: bool) -> None:
    """Move the staged suite to ``outdir``, replacing an empty folder or an older suite."""
    _check_replaceable(outdir, force)  # again: the folder may have changed while the suite was written
    if not outdir.exists():
        os.replace(stage, outdir)
        return
    if not any(outdir.iterdir()):
        outdir.rmdir()
        os.replace(stage, outdir)
        return
    old = outdir.with_name(f".{outdir.name}.old-{secrets.token_hex(4)}")
    os.replace(outdir, old)
    os.replace(stage, outdir)
    shutil.rmtree(old, ignore_errors=True)


def generate_suite(
    outdir: str | os.PathLike,
    *,
    opsets: Sequence[int] = DEFAULT_OPSETS,
    forms: Sequence[str] = FORMS,
    zero_range: str = "onnxruntime",
    include_unspecified: bool = False,
    include_large: bool = True,
    names: Collection[str] | None = None,
    force: bool = False,
) -> GeneratedSuite:
    """Write a conformance suite to ``outdir`` (see the module docstring for the layout).

    ``forms`` picks among ``native`` and the expansion variants; ``include_unspecified`` adds the
    NaN inputs (not comparable); ``include_large`` adds the input of about a million elements at
    the newest opset; ``names`` keeps only the catalogue cases of those names. An existing suite in
    ``outdir`` that holds files gen-tests did not write is replaced only with ``force``; a folder
    that holds no suite, never.
    """
    start = time.perf_counter()
    opsets = sorted(set(opsets))
    _check_options(opsets, forms, zero_range)
    forms = [f for f in FORMS if f in forms]
    inputs = catalogue.cases(include_large=include_large, include_nan=include_unspecified)
    if names is not None:
        names = set(names)
        unknown = sorted(names - {c.name for c in inputs})
        if unknown:
            raise InputError(f"no catalogue case is named {unknown[0]!r}")
        inputs = [c for c in inputs if c.name in names]

    outdir = Path(os.path.abspath(outdir))  # "suite/" and "." get a name; symlinks are not followed
    if not outdir.name:
        raise InputError(f"{outdir}: cannot write a suite there; choose a folder")
    _check_replaceable(outdir, force)
    try:
        outdir.parent.mkdir(parents=True, exist_ok=True)
        stage = outdir.with_name(f".{outdir.name}.tmp-{secrets.token_hex(4)}")
        stage.mkdir()
    except OSError as error:
        raise InputError(f"{outdir}: cannot create the output folder: {error.strerror}") from None

    runtime = _POLICY_RUNTIME[zero_range]
    entries: list[SuiteEntry] = []
    left_out: list[LeftOut] = []
    try:
        for case in inputs:
            expected = reference.dynamic_quantize_linear(case.x, zero_range)
            # The large input costs 5 MB per folder: one opset is enough to exercise vectorized kernels.
            case_opsets = opsets[-1:] if case.category == "large" else opsets
            for opset in case_opsets:
                native_name = _folder_name(case.name, "native", opset)
                native = one_node_model(case.x.shape, opset, name=native_name, description=case.description)
                for form in forms:
                    folder = _folder_name(case.name, form, opset)
                    if form == "native":
                        model, description = native, case.description
                    else:
                        # runtime=None: the check below decides on the model's own ops, for every backend.
                        expanded = ExpandDynamicQuantizeLinearPass(variant=form, zero_range=zero_range, runtime=None)(
                            ir.serde.deserialize_model(native)
                        )
                        model = ir.serde.serialize_model(expanded.model)
                        model.graph.name = folder
                        description = f"{case.description}; through dql_pass's {form} expansion"
                    # A folder the suite's own backend cannot load would only fail: list it instead.
                    reason = _lacks(model, runtime, opset)
                    if reason is not None:
                        left_out.append(LeftOut(folder, case.name, opset, form, reason))
                        continue
                    known = {r.name: "; ".join(d) for r in runtimes.RUNTIMES.values() if (d := r.differences(case.x, form, zero_range))}
                    for other in runtimes.RUNTIMES:
                        other_reason = None if other == runtime else _lacks(model, other, opset)
                        if other_reason is not None:
                            known[other] = other_reason
                    _write_case(stage / folder, model, case.x, expected)
                    entries.append(SuiteEntry(
                        name=case.name, folder=folder, category=case.category, opset=opset, variant=form,
                        policy=zero_range, description=description, shape=tuple(case.x.shape),
                        policy_dependent=case.zero_range, comparable=case.comparable, known_differences=known,
                    ))
            logger.info("wrote %s at opsets %s", case.name, case_opsets)
        if not entries:
            raise InputError(f"{runtime} can run none of the chosen folders: {left_out[0].reason}; choose other opsets or variants")
        if left_out:
            logger.warning(
                "left out %d test folders that %s cannot run (%s); %s lists them", len(left_out), runtime,
                "; ".join(sorted({item.reason for item in left_out})), MANIFEST,
            )
        manifest = {
            "format": _FORMAT,
            "generator": f"dql_pass {version()}",
            "onnx": onnx.__version__,
            "policy": zero_range,
            "opsets": opsets,
            "variants": forms,
            "cases": [dataclasses.asdict(e) for e in entries],
            "left_out": [dataclasses.asdict(item) for item in left_out],
        }
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        size = sum(f.stat().st_size for f in stage.rglob("*") if f.is_file())
        _install(stage, outdir, force)
    except OSError as error:
        raise InputError(f"{outdir}: cannot write the suite: {error.strerror or error}") from None
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    return GeneratedSuite(outdir, entries, len(inputs), size, time.perf_counter() - start, left_out)


# --- running ----------------------------------------------------------------------------------



class _Refused(Exception):
    """A file of the suite that is missing or that the runner will not read: its test fails with this reason."""


def _read_file(path: Path, root: Path, limit: int, label: str) -> bytes:
    """The bytes of ``path``: a regular file inside ``root`` (``root`` resolved), symlinks followed, of at most ``limit`` bytes.

    ``label`` names the file in the reason of a refusal. A FIFO would block and /dev/zero never
    ends, so special files are refused before they are opened; a file outside the suite is not
    the suite's to give.
    """
    if not os.path.lexists(path):
        raise _Refused(f"{label} is missing")
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(root):
        raise _Refused(f"{label} is outside the suite (through a symlink)")
    try:
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise _Refused(f"{label} is not a regular file")
        # No blocking and no symlink: what is opened is the file just checked, or the open fails.
        handle = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(handle, "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise _Refused(f"{label} is not a regular file")
            if status.st_size > limit:
                raise _Refused(f"{label} holds {status.st_size} bytes, more than the {limit} it may hold")
            data = file.read(limit + 1)
    except OSError as error:
        raise _Refused(f"{label}: cannot read it: {error.strerror or error}") from None
    if len(data) > limit:
        raise _Refused(f"{label} grew past the {limit} bytes it may hold while it was read")
    return data


def _tensor_limit(value: onnx.ValueInfoProto) -> int:
    """The most bytes a TensorProto of ``value`` can take, by its type and shape."""
    tensor = value.type.tensor_type
    dims = tensor.shape.dim
    fixed = (
        value.type.HasField("tensor_type") and tensor.HasField("shape") and tensor.elem_type != onnx.TensorProto.STRING
        and all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims)
    )
    if not fixed:
        return _UNKNOWN_SHAPE_LIMIT
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
            raise _Refused(f"{label}: its external data holds {size} bytes, more than the {limit} it may hold")
        external_data_helper.load_external_data_for_tensor(tensor, os.fspath(base))
    except (OSError, ValueError, onnx.checker.ValidationError) as error:
        raise _Refused(f"{label}: external data refused: {one_line(error)}") from None


def _read_tensor(path: Path, root: Path, limit: int, label: str) -> tuple[str, np.ndarray]:
    data = _read_file(path, root, limit, label)
    tensor = onnx.TensorProto()
    try:
        tensor.ParseFromString(data)
    except Exception as error:  # protobuf's DecodeError, or what a malformed message raises
        raise _Refused(f"{label}: not a TensorProto: {one_line(error)}") from None
    if external_data_helper.uses_external_data(tensor):
        # Where onnx.load_tensor looks: beside the file, never in the current folder.
        _load_external(tensor, path.parent, limit, label)
    try:
        return tensor.name, numpy_helper.to_array(tensor)
    except Exception as error:  # dims that do not fit the data, an unknown data type ...
        raise _Refused(f"{label}: cannot read the tensor: {one_line(error)}") from None


def _data_set_tensors(
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
        raise _Refused(f"{data_set.name}/{extra[0]}: the model has {len(values)} {kind}s, so no such file is read")
    limit = max((_tensor_limit(value) for value in values), default=0)
    found: dict[str, np.ndarray] = {}
    holder: dict[str, str] = {}
    for i, file in enumerate(files):
        label = f"{data_set.name}/{file}"
        name, array = _read_tensor(data_set / file, root, limit, label)
        name = name if name in names else names[i]
        if name in found:
            raise _Refused(f"{label} holds {name}, as {holder[name]} does")
        found[name], holder[name] = array, label
    return found


def _mismatch(folder: Path, root: Path, runtime: runtimes.Runtime) -> str | None:
    """Run every data set of one test folder; None when all outputs match, else the first difference.

    Every file is read and checked before the backend loads the model, so a missing or refused one
    raises :class:`_Refused` whatever the backend does. Whatever the backend raises propagates:
    the caller tells a crash from a wrong output.
    """
    # Read for the names, types and shapes only: the backend loads the model and its external data
    # itself, from the model's folder (both refuse a path that leaves it).
    data = _read_file(folder / _MODEL, root, _MODEL_LIMIT, _MODEL)
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as error:
        raise _Refused(f"{_MODEL}: not an ONNX model: {one_line(error)}") from None
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    outputs = list(model.graph.output)
    data_sets = sorted(folder.glob("test_data_set_*"))
    if not data_sets:
        raise _Refused("no test_data_set_* folder")
    tensors = []
    for data_set in data_sets:
        if not data_set.is_dir():
            raise _Refused(f"{data_set.name} is not a folder")
        tensors.append((
            data_set,
            _data_set_tensors(data_set, root, "input", inputs),
            _data_set_tensors(data_set, root, "output", outputs),
        ))
    session = runtime.load(folder / _MODEL)
    for data_set, feeds, expected in tensors:
        got = session.run(feeds)
        for value, actual in zip(outputs, got, strict=True):
            problem = bit_difference(value.name, actual, expected[value.name])
            if problem is not None:
                return f"{data_set.name}: {problem.text}"
    return None


def _outcome(folder: Path, root: Path, entry: dict, backend: str) -> Outcome:
    crash = mismatch = None
    try:
        mismatch = _mismatch(folder, root, runtimes.get(backend))
    except _Refused as refusal:  # the test itself is broken: no known difference or NaN input excuses that
        return Outcome(folder.name, "FAIL", str(refusal))
    except Exception as error:  # whatever the backend raises is the case's result, not the runner's
        crash = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
    if not entry.get("comparable", True):
        if crash:
            return Outcome(folder.name, "FAIL", f"outputs unspecified, but it must run: {crash}")
        return Outcome(folder.name, "SKIP", "outputs unspecified for this input; it ran without error")
    known = entry.get("known_differences", {}).get(backend)
    if known:
        if crash or mismatch:
            return Outcome(folder.name, "XFAIL", f"known difference on {backend}: {known}")
        return Outcome(folder.name, "SKIP", f"listed as a known difference on {backend} ({known}), but it matched")
    if crash or mismatch:
        return Outcome(folder.name, "FAIL", crash or mismatch)
    return Outcome(folder.name, "PASS")


def _manifest(path: Path, root: Path) -> dict[str, dict]:
    file = path / MANIFEST
    if not os.path.lexists(file):
        return {}
    try:
        entries = json.loads(_read_file(file, root, _MANIFEST_LIMIT, MANIFEST))["cases"]
        manifest = {e["folder"]: e for e in entries}
    except _Refused as refusal:
        raise InputError(f"{path}: {refusal}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(f"{file}: not a readable suite manifest ({type(error).__name__}: {one_line(error)})") from None
    for folder, entry in manifest.items():
        known = entry.get("known_differences", {})
        if not (isinstance(folder, str) and isinstance(entry.get("comparable", True), bool) and isinstance(known, dict)
                and all(isinstance(reason, str) for reason in known.values())):
            raise InputError(f"{file}: not a readable suite manifest (the entry of {folder!r} is malformed)")
    return manifest


def run_suite(
    outdir: str | os.PathLike,
    backend: str = "onnxruntime",
    *,
    progress: Callable[[Outcome], None] | None = None,
) -> RunReport:
    """Run every test folder of ``outdir`` (folders holding a ``model.onnx``) on ``backend``.

    ``manifest.json``, when present, says which folders are not comparable (they must only run)
    and which differences of a backend are known (reported as XFAIL, not as failures).
    ``progress`` is called with each outcome as soon as it is known.
    """
    runtimes.get(backend)
    path = Path(outdir)
    if not path.is_dir():
        raise InputError(f"{path}: no such folder")
    root = path.resolve()
    manifest = _manifest(path, root)
    # Any model.onnx, even one that is not a regular file, makes a test folder: its test then fails with the reason.
    folders = sorted(d for d in path.iterdir() if d.is_dir() and os.path.lexists(d / _MODEL))
    if not folders:
        raise InputError(f"{path}: no test folders (folders holding a model.onnx)")
    missing = sorted(set(manifest) - {f.name for f in folders})
    outcomes = [Outcome(name, "FAIL", f"listed in {MANIFEST} but it has no model.onnx") for name in missing]
    if progress is not None:
        for outcome in outcomes:
            progress(outcome)
    for folder in folders:
        outcomes.append(_outcome(folder, root, manifest.get(folder.name, {}), backend))
        if progress is not None:
            progress(outcomes[-1])
    return RunReport(backend, outcomes)
