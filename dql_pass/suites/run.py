"""Run a suite on a runtime and compare every output bit for bit.

- Any folder in the layout runs: ``manifest.json`` is optional, so suites written elsewhere work;
  when present it says which folders are not comparable (they must only run) and which
  differences of a runtime are known (XFAIL, not a failure). A known difference excuses the
  runtime's arithmetic, not the model: one that ORT (onnx.reference, where ORT has a known
  difference of its own) cannot run, or runs to other outputs, fails.
- Every run goes through :mod:`dql_pass.runtimes`; outputs are compared by dtype, shape and the raw
  bits of each element (so -0.0 differs from 0.0), through :mod:`dql_pass.compare`.
- A test passes only when its model has outputs, each data set has one file per input and per
  output of its model, and every output matches. A file refused, missing or unreadable fails its
  test with the reason (:mod:`dql_pass.suites.layout` reads them); a manifest refused makes the
  whole suite bad input.
"""

from __future__ import annotations

__all__ = ["Outcome", "RunReport", "run_suite", "test_folders"]

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from dql_pass import runtimes
from dql_pass.compare import bit_difference, same_bits
from dql_pass.errors import InputError, one_line
from dql_pass.suites.layout import MANIFEST, MODEL, Refused, data_set_tensors, read_file, read_manifest, read_model



STATUSES = ("PASS", "FAIL", "XFAIL", "SKIP")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The result of one test folder: PASS, FAIL, XFAIL (a known difference) or SKIP."""

    name: str
    status: str
    detail: str = ""
    form: str = "?"  # native or the expansion variant, as the manifest lists the folder; "?" without one
    op: str = "?"  # the op the folder tests, as the manifest lists it; "?" without one
    mismatch: Mismatch | None = dataclasses.field(default=None, repr=False, compare=False)  # what a FAIL ran to

    def line(self) -> str:
        return f"{self.status} {self.name}" + (f": {self.detail}" if self.detail else "")

    def to_dict(self) -> dict:
        return {key: getattr(self, key) for key in ("name", "status", "detail", "form", "op")}


@dataclasses.dataclass(frozen=True)
class RunReport:
    """Every outcome of :func:`run_suite`, with the counts of its summary line."""

    runtime: str
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

    @property
    def ok(self) -> bool:
        """Nothing failed and something was compared: a run of skips and known differences checks nothing."""
        return not self.failed and self.passed > 0

    def __bool__(self) -> bool:
        return self.ok

    def __repr__(self) -> str:
        return f"<RunReport on {self.runtime}: {self.summary}>"

    def counts(self) -> dict[str, dict[str, int]]:
        """How many outcomes of each status every form has, forms in the order first met."""
        table: dict[str, dict[str, int]] = {}
        for outcome in self.outcomes:
            by_status = table.setdefault(outcome.form, dict.fromkeys(STATUSES, 0))
            by_status[outcome.status] += 1
        return table

    def table(self) -> str:
        """The counts per form and status, one row a form, as run-tests prints them before its summary."""
        rows = [("form", *STATUSES)] + [(form, *map(str, by.values())) for form, by in self.counts().items()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w)
                                   for i, (cell, w) in enumerate(zip(row, widths)))
                         for row in rows)

    @property
    def summary(self) -> str:
        text = f"{self.passed} passed, {self.failed} failed"
        xfail = sum(o.status == "XFAIL" for o in self.outcomes)
        skip = self.skipped - xfail
        # XFAIL (a known difference that showed) and SKIP (not compared) told apart: both hide a result.
        text += f", {xfail} known differences (XFAIL)" if xfail else ""
        text += f", {skip} skipped" if skip else ""
        return text + ("" if self.failed or self.passed else " (nothing was compared)")

    def format(self) -> str:
        """The counts per form, then the summary line."""
        return f"{self.table()}\n{self.summary}"

    def to_dict(self, raw: bool = False) -> dict:
        """``raw``: whether the run ignored the manifest's known differences, as the report says."""
        return {"runtime": self.runtime, "raw": raw, "summary": self.summary, "ok": self.ok, "counts": self.counts(),
                "outcomes": [outcome.to_dict() for outcome in self.outcomes]}


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The first data set of a test folder whose outputs differ: its feeds, the expected and the actual outputs."""

    data_set: str
    text: str
    feeds: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]
    actual: dict[str, np.ndarray]


def _compare(folder: Path, root: Path, runtime: runtimes.Runtime) -> Mismatch | None:
    """Run every data set of one test folder; None when all outputs match, else the first difference.

    Every file is read and checked before the runtime loads the model, so a missing or refused one
    raises :class:`Refused` whatever the runtime does. Whatever the runtime raises propagates:
    the caller tells a crash from a wrong output.
    """
    # The runtime loads the model and its external data itself, from the model's folder (both
    # refuse a path that leaves it).
    model = read_model(folder, root)
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    outputs = list(model.graph.output)
    if not outputs:  # a test that compares nothing would pass whatever the runtime computes
        raise Refused("the model has no outputs")
    data_sets = sorted(folder.glob("test_data_set_*"))
    if not data_sets:
        raise Refused("no test_data_set_* folder")
    tensors = []
    for data_set in data_sets:
        if not data_set.is_dir():
            raise Refused(f"{data_set.name} is not a folder")
        tensors.append((
            data_set,
            data_set_tensors(data_set, root, "input", inputs),
            data_set_tensors(data_set, root, "output", outputs),
        ))
    session = runtime.load(folder / MODEL)
    for data_set, feeds, expected in tensors:
        got = dict(zip([value.name for value in outputs], session.run(feeds), strict=True))
        for value in outputs:
            problem = bit_difference(value.name, got[value.name], expected[value.name])
            if problem is not None:
                text = f"{data_set.name}: {problem.text}{_inputs_at(feeds, got[value.name], expected[value.name])}"
                return Mismatch(data_set.name, text, feeds, expected, got)
    return None


def _inputs_at(feeds: dict[str, np.ndarray], actual: np.ndarray, expected: np.ndarray) -> str:
    """Where an output first differs, the input there, when one input has the output's shape and the
    others fewer elements (an elementwise op and its scales): what a maintainer looks at first (the
    scale of a DynamicQuantizeLinear still depends on the whole input). Not for MatMulInteger's operands."""
    actual = np.asarray(actual)
    if actual.shape != expected.shape or actual.dtype != expected.dtype or not actual.ndim:
        return ""
    shaped = [name for name, array in feeds.items() if np.shape(array) == actual.shape]
    if len(shaped) != 1 or any(np.size(a) >= actual.size for n, a in feeds.items() if n != shaped[0]):
        return ""
    where = tuple(int(i) for i in np.argwhere(~same_bits(actual, expected))[0])
    return f" (input {shaped[0]}{list(where)} = {feeds[shaped[0]][where]!s})"


def _mismatch(folder: Path, root: Path, runtime: runtimes.Runtime) -> str | None:
    found = _compare(folder, root, runtime)
    return None if found is None else found.text


def _is_answer(folder: Path, root: Path, files: list[str], mismatch: Mismatch) -> bool:
    """Whether the actual outputs are the runtime's known answer, stored in ``files`` (one per output)."""
    for file, (name, actual) in zip(files, mismatch.actual.items(), strict=False):
        try:
            data = read_file(folder / file, root, 1 << 30, file)
        except Refused:
            return False
        answer = numpy_helper.to_array(onnx.TensorProto.FromString(data))
        if bit_difference(name, np.asarray(actual), answer) is not None:
            return False
    return len(files) == len(mismatch.actual)


# The runtimes that run the ops as ONNX defines them, in the order they hold a model to its outputs.
_HOLDERS = ("onnxruntime", "reference")


def _wrong_as_written(folder: Path, root: Path, entry: dict, runtime: str) -> str | None:
    """Why the folder's model is wrong as ONNX defines it, on the first of :data:`_HOLDERS` that is not
    ``runtime`` and has no known difference of its own there; None when it matches there, or when no
    holder is left.

    A model the holder cannot run is not excused by another runtime's known difference: it is not
    the runtime's arithmetic that fails it.
    """
    known = entry.get("known_differences", {})
    if entry.get("policy") == "spec":
        # The family's folders: checked by onnx's checker when written, their outputs the spec's by the NumPy
        # reference, ORT's known answers stored beside them; onnx.reference is no holder (+inf to uint8 gives 0).
        return None
    holder = next((name for name in _HOLDERS if name != runtime and name not in known), None)
    if holder is None:
        return None
    try:
        wrong = _mismatch(folder, root, runtimes.get(holder))
    except runtimes.RuntimeFailure as error:
        return f"{holder} cannot run it either: {one_line(error)}"
    return None if wrong is None else f"wrong on {holder} too: {wrong}"


def _outcome(folder: Path, root: Path, entry: dict, runtime: str, raw: bool) -> Outcome:
    lacks = entry.get("lacks", {}).get(runtime)
    if lacks:
        outcome = Outcome(folder.name, "SKIP", lacks)
    else:
        outcome = _judged(folder, root, entry, runtime, raw)
    op = entry.get("op", "DynamicQuantizeLinear" if entry else "?")
    return dataclasses.replace(outcome, form=entry.get("variant", "?"), op=op)


def _judged(folder: Path, root: Path, entry: dict, runtime: str, raw: bool) -> Outcome:
    crash = found = mismatch = None
    try:
        found = _compare(folder, root, runtimes.get(runtime))
        mismatch = None if found is None else found.text
    except Refused as refusal:  # the test itself is broken: no known difference or NaN input excuses that
        return Outcome(folder.name, "FAIL", str(refusal))
    except runtimes.RuntimeFailure as error:  # what the runtime refuses is the case's result, not the runner's
        crash = one_line(error)
    if not entry.get("comparable", True):
        if crash:
            return Outcome(folder.name, "FAIL", f"outputs unspecified, but it must run: {crash}")
        return Outcome(folder.name, "SKIP", "outputs unspecified for this input; it ran without error")
    known = None if raw else entry.get("known_differences", {}).get(runtime)
    if known:
        if (crash or mismatch) and (wrong := _wrong_as_written(folder, root, entry, runtime)):
            # The excuse covers the runtime's arithmetic, not a model that is wrong as ONNX defines it.
            return Outcome(folder.name, "FAIL", f"not excused by the known difference on {runtime}: {wrong}")
        answer = entry.get("answers", {}).get(runtime)
        if found is not None and answer and not _is_answer(folder, root, answer, found):
            return Outcome(folder.name, "FAIL", f"{mismatch}; nor is it the known answer of {runtime}", mismatch=found)
        if crash or mismatch:
            return Outcome(folder.name, "XFAIL", f"known difference on {runtime}: {known}")
        return Outcome(folder.name, "SKIP", f"listed as a known difference on {runtime} ({known}), but it matched")
    if crash or mismatch:
        return Outcome(folder.name, "FAIL", crash or mismatch, mismatch=found)
    return Outcome(folder.name, "PASS")


def test_folders(path: Path) -> list[Path]:
    """The test folders of the suite ``path``, sorted."""
    # Any model.onnx, even one that is not a regular file, makes a test folder: its test then fails with the reason.
    return sorted(d for d in path.iterdir() if d.is_dir() and os.path.lexists(d / MODEL))


def run_suite(
    outdir: str | os.PathLike,
    runtime: str = "onnxruntime",
    *,
    progress: Callable[[Outcome], None] | None = None,
    raw: bool = False,
) -> RunReport:
    """Run every test folder of ``outdir`` (folders holding a ``model.onnx``) on ``runtime``.

    ``manifest.json``, when present, says which folders are not comparable (they must only run)
    and which differences of a runtime are known (reported as XFAIL, not as failures); with
    ``raw`` the known differences are ignored, so that every difference is a FAIL, for a runtime's
    author. ``progress`` is called with each outcome as soon as it is known.
    """
    runtimes.get(runtime).check_installed()
    path = Path(outdir)
    if not path.is_dir():
        if path.exists():
            raise InputError(f"{path}: not a folder; give a suite folder (dql-pass gen-tests DIR makes one)")
        raise InputError(f"{path}: no such folder; give a suite folder, or make one with dql-pass gen-tests {path}")
    root = path.resolve()
    manifest = read_manifest(path, root)
    folders = test_folders(path)
    if not folders:
        raise InputError(f"{path}: no test folders (folders holding a model.onnx)")
    missing = sorted(set(manifest) - {f.name for f in folders})
    outcomes = [Outcome(name, "FAIL", f"listed in {MANIFEST} but it has no model.onnx",
                        manifest[name].get("variant", "?"))
                for name in missing]
    if progress is not None:
        for outcome in outcomes:
            progress(outcome)
    for folder in folders:
        outcomes.append(_outcome(folder, root, manifest.get(folder.name, {}), runtime, raw))
        if progress is not None:
            progress(outcomes[-1])
    return RunReport(runtime, outcomes)
