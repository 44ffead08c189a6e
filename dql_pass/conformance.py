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
- the suite is staged beside OUTDIR and moved into place, so a failure leaves nothing half-written;
  an existing OUTDIR is replaced only when it is empty or a suite written here.

:func:`run_suite` runs any folder in that layout (``manifest.json`` is optional, so suites written
elsewhere work) on onnxruntime or ``onnx.reference`` and compares every output bit for bit: dtype,
shape and the raw bits of each element, so -0.0 differs from 0.0.
"""

from __future__ import annotations

__all__ = [
    "BACKENDS",
    "DEFAULT_OPSETS",
    "FORMS",
    "GeneratedSuite",
    "Outcome",
    "RunReport",
    "SuiteEntry",
    "generate_suite",
    "run_suite",
]

import dataclasses
import importlib.metadata
import json
import logging
import os
import re
import secrets
import shutil
import time
import warnings
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime
from onnx import helper, numpy_helper

from dql_pass import catalogue, functions, reference
from dql_pass.errors import InputError
from dql_pass.expand import ExpandDynamicQuantizeLinearPass
from dql_pass.verify import OUTPUTS, bit_difference

logger = logging.getLogger(__name__)

# 11 is the operator's only version; 13, 18 and 21 bring new versions of the ops the expansion uses
# (QuantizeLinear, ReduceMin/ReduceMax, Cast); 27 is the newest opset onnxruntime 1.32 runs in
# full: it has no QuantizeLinear-28 kernel.
DEFAULT_OPSETS: tuple[int, ...] = (11, 13, 18, 21, 27)
FORMS: tuple[str, ...] = ("native", *functions.VARIANTS)
BACKENDS: tuple[str, ...] = ("onnxruntime", "reference")
MANIFEST = "manifest.json"

_FORMAT = "dql_pass conformance suite 1"
_INPUT = "x"
_DATA_SET = "test_data_set_0"
_PREFIX = "test_dynamicquantizelinear_"


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
class GeneratedSuite:
    """What :func:`generate_suite` wrote: the folder, its entries, the inputs used, bytes and seconds."""

    path: Path
    entries: list[SuiteEntry]
    inputs: int
    size_bytes: int
    seconds: float


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


def _known_differences(case: catalogue.Case, form: str, policy: str) -> dict[str, str]:
    """Backends that are known to give other outputs than the expected ones, with the reason.

    These are the measured behaviours of onnx 1.23 and onnxruntime 1.32 (see docs/SEMANTICS.md).
    """
    known: dict[str, str] = {}
    if form == "native" and case.zero_range:
        if case.x.size == 0:
            known["reference"] = "onnx.reference's DynamicQuantizeLinear raises on an empty input (a reduction of no elements)"
        elif policy == "onnxruntime":
            known["reference"] = "onnx.reference gives a zero range the scale 1/255; the onnxruntime policy expects 1.0"
        if policy == "onnx-reference":
            known["onnxruntime"] = "ORT's kernel gives a zero range the scale 1.0; the onnx-reference policy expects 1/255"
    if form == "quantizelinear" and case.comparable:
        _, scale, _ = reference.dynamic_quantize_linear(case.x, policy)
        with np.errstate(all="ignore"):
            overflows = bool(np.isposinf(case.x / scale).any())
        if overflows:
            known["reference"] = (
                "onnx.reference's QuantizeLinear sends x/scale = +inf to 0 (rint(inf) cast to int32); "
                "the expected value saturates to 255"
            )
    return known


def _native_model(name: str, shape: tuple[int, ...], opset: int, description: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", [_INPUT], list(OUTPUTS), name="DynamicQuantizeLinear")],
        name,
        [helper.make_tensor_value_info(_INPUT, onnx.TensorProto.FLOAT, shape)],
        [
            helper.make_tensor_value_info(OUTPUTS[0], onnx.TensorProto.UINT8, shape),
            helper.make_tensor_value_info(OUTPUTS[1], onnx.TensorProto.FLOAT, ()),
            helper.make_tensor_value_info(OUTPUTS[2], onnx.TensorProto.UINT8, ()),
        ],
    )
    opsets = [helper.make_opsetid("", opset)]
    # The oldest IR version the opset allows, so that older runtimes can read the models too.
    model = helper.make_model(
        graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets),
        producer_name="dql_pass", producer_version=_version(),
    )
    model.doc_string = description
    return model


def _version() -> str:
    try:
        return importlib.metadata.version("dql_pass")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def _write_case(folder: Path, model: onnx.ModelProto, x: np.ndarray, expected: Sequence[np.ndarray]) -> None:
    onnx.checker.check_model(model, full_check=True)
    data_set = folder / _DATA_SET
    data_set.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    (folder / "data.json").write_text(json.dumps({"atol": 0, "rtol": 0}) + "\n")
    (data_set / "input_0.pb").write_bytes(numpy_helper.from_array(x, _INPUT).SerializeToString())
    for i, (name, value) in enumerate(zip(OUTPUTS, expected)):
        (data_set / f"output_{i}.pb").write_bytes(numpy_helper.from_array(np.asarray(value), name).SerializeToString())


def _check_options(opsets: Collection[int], forms: Collection[str], zero_range: str) -> None:
    if not opsets:
        raise InputError("choose at least one opset")
    outside = sorted(o for o in opsets if not functions.MIN_OPSET <= o <= functions.MAX_OPSET)
    if outside:
        raise InputError(f"opset {outside[0]} is outside {functions.MIN_OPSET}..{functions.MAX_OPSET}")
    if not forms:
        raise InputError("choose at least one variant")
    unknown = sorted(set(forms) - set(FORMS))
    if unknown:
        raise InputError(f"unknown variant {unknown[0]!r}; choose from {', '.join(FORMS)}")
    if zero_range not in reference.ZERO_RANGE_POLICIES:
        raise InputError(f"unknown zero-range policy {zero_range!r}; choose from {', '.join(reference.ZERO_RANGE_POLICIES)}")


def _is_suite(path: Path) -> bool:
    try:
        return json.loads((path / MANIFEST).read_text()).get("format") == _FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _check_replaceable(outdir: Path) -> None:
    """Raise unless ``outdir`` is absent, an empty folder or a suite written here."""
    if outdir.is_symlink() or outdir.exists() and not outdir.is_dir():
        raise InputError(f"{outdir}: exists and is not a folder; choose another output folder")
    if outdir.exists() and any(outdir.iterdir()) and not _is_suite(outdir):
        raise InputError(f"{outdir}: a non-empty folder that holds no dql_pass suite; choose another output folder")


def _install(stage: Path, outdir: Path) -> None:
    """Move the staged suite to ``outdir``, replacing an empty folder or an older suite."""
    _check_replaceable(outdir)  # again: the folder may have changed while the suite was written
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
) -> GeneratedSuite:
    """Write a conformance suite to ``outdir`` (see the module docstring for the layout).

    ``forms`` picks among ``native`` and the expansion variants; ``include_unspecified`` adds the
    NaN inputs (not comparable); ``include_large`` adds the input of about a million elements at
    the newest opset; ``names`` keeps only the catalogue cases of those names.
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
    _check_replaceable(outdir)
    try:
        outdir.parent.mkdir(parents=True, exist_ok=True)
        stage = outdir.with_name(f".{outdir.name}.tmp-{secrets.token_hex(4)}")
        stage.mkdir()
    except OSError as error:
        raise InputError(f"{outdir}: cannot create the output folder: {error.strerror}") from None

    entries: list[SuiteEntry] = []
    try:
        for case in inputs:
            expected = reference.dynamic_quantize_linear(case.x, zero_range)
            # The large input costs 5 MB per folder: one opset is enough to exercise vectorized kernels.
            case_opsets = opsets[-1:] if case.category == "large" else opsets
            for opset in case_opsets:
                native_name = _folder_name(case.name, "native", opset)
                native = _native_model(native_name, case.x.shape, opset, case.description)
                for form in forms:
                    folder = _folder_name(case.name, form, opset)
                    if form == "native":
                        model, description = native, case.description
                    else:
                        expanded = ExpandDynamicQuantizeLinearPass(variant=form, zero_range=zero_range)(
                            ir.serde.deserialize_model(native)
                        )
                        model = ir.serde.serialize_model(expanded.model)
                        model.graph.name = folder
                        description = f"{case.description}; through dql_pass's {form} expansion"
                    _write_case(stage / folder, model, case.x, expected)
                    entries.append(SuiteEntry(
                        name=case.name, folder=folder, category=case.category, opset=opset, variant=form,
                        policy=zero_range, description=description, shape=tuple(case.x.shape),
                        policy_dependent=case.zero_range, comparable=case.comparable,
                        known_differences=_known_differences(case, form, zero_range),
                    ))
            logger.info("wrote %s at opsets %s", case.name, case_opsets)
        manifest = {
            "format": _FORMAT,
            "generator": f"dql_pass {_version()}",
            "onnx": onnx.__version__,
            "policy": zero_range,
            "opsets": opsets,
            "variants": forms,
            "cases": [dataclasses.asdict(e) for e in entries],
        }
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        size = sum(f.stat().st_size for f in stage.rglob("*") if f.is_file())
        _install(stage, outdir)
    except OSError as error:
        raise InputError(f"{outdir}: cannot write the suite: {error.strerror or error}") from None
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
    return GeneratedSuite(outdir, entries, len(inputs), size, time.perf_counter() - start)


# --- running ----------------------------------------------------------------------------------

_Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def _onnxruntime(model: Path) -> tuple[list[str], list[str], _Runner]:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: the runner reports failures itself
    session = onnxruntime.InferenceSession(os.fspath(model), options, providers=["CPUExecutionProvider"])
    inputs = [i.name for i in session.get_inputs()]
    outputs = [o.name for o in session.get_outputs()]
    return inputs, outputs, lambda feeds: session.run(None, feeds)


def _reference(model: Path) -> tuple[list[str], list[str], _Runner]:
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(os.fspath(model))

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        # 0/0 and inf/inf are part of the tests: numpy's warnings about them are noise.
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return evaluator.run(None, feeds)

    return list(evaluator.input_names), list(evaluator.output_names), run


_BACKENDS = {"onnxruntime": _onnxruntime, "reference": _reference}


def _read_tensor(path: Path) -> tuple[str, np.ndarray]:
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    return tensor.name, numpy_helper.to_array(tensor)


def _tensors(data_set: Path, kind: str) -> list[tuple[str, np.ndarray]]:
    # Numbered as onnx's runner reads them: input_0.pb, input_1.pb, ... (not in glob order).
    count = len(list(data_set.glob(f"{kind}_*.pb")))
    return [_read_tensor(data_set / f"{kind}_{i}.pb") for i in range(count)]


def _mismatch(folder: Path, load: Callable[[Path], tuple[list[str], list[str], _Runner]]) -> str | None:
    """Run every data set of one test folder; None when all outputs match, else the first difference.

    Whatever the backend raises propagates: the caller tells a crash from a wrong output.
    """
    data_sets = sorted(folder.glob("test_data_set_*"))
    if not data_sets:
        raise InputError("no test_data_set_* folder")
    input_names, output_names, run = load(folder / "model.onnx")
    for data_set in data_sets:
        feeds = {
            name if name in input_names else input_names[i]: value
            for i, (name, value) in enumerate(_tensors(data_set, "input"))
        }
        got = dict(zip(output_names, run(feeds)))
        for i, (name, expected) in enumerate(_tensors(data_set, "output")):
            name = name if name in got else output_names[i]
            problem = bit_difference(name, got[name], expected)
            if problem is not None:
                return f"{data_set.name}: {problem.text}"
    return None


def _outcome(folder: Path, entry: dict, backend: str) -> Outcome:
    crash = mismatch = None
    try:
        mismatch = _mismatch(folder, _BACKENDS[backend])
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


def _manifest(path: Path) -> dict[str, dict]:
    file = path / MANIFEST
    if not file.exists():
        return {}
    try:
        return {e["folder"]: e for e in json.loads(file.read_text())["cases"]}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise InputError(f"{file}: not a readable suite manifest ({type(error).__name__}: {error})") from None


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
    if backend not in _BACKENDS:
        raise InputError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    path = Path(outdir)
    if not path.is_dir():
        raise InputError(f"{path}: no such folder")
    manifest = _manifest(path)
    folders = sorted(d for d in path.iterdir() if (d / "model.onnx").is_file())
    if not folders:
        raise InputError(f"{path}: no test folders (folders holding a model.onnx)")
    missing = sorted(set(manifest) - {f.name for f in folders})
    outcomes = [Outcome(name, "FAIL", f"listed in {MANIFEST} but it has no model.onnx") for name in missing]
    if progress is not None:
        for outcome in outcomes:
            progress(outcome)
    for folder in folders:
        outcomes.append(_outcome(folder, manifest.get(folder.name, {}), backend))
        if progress is not None:
            progress(outcomes[-1])
    return RunReport(backend, outcomes)
