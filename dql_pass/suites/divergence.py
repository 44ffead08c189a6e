"""Divergence reports: for each runtime x op x form that fails, a folder a runtime's maintainers can act on.

Each folder ``<runtime>__<op>/`` (the op's own node), or ``<runtime>__<op>__expanded_<variant>/`` (the op as
dql_pass writes it with other ops: a failure there is one of those ops), holds the smallest failing test folder as it
is in the suite
(ONNX's backend-test layout: ``model.onnx``, ``test_data_set_0/input_N.pb`` and the expected
``output_N.pb``), the runtime's outputs beside them (``actual/output_N.pb``), ``differences.txt``
(the first differing values with their bits) and ``ISSUE.md``, a short text ready for the
runtime's issue tracker, with its version. Nothing is sent anywhere: the user files it.
The report folder is written in a stage and put in place in one step (:mod:`dql_pass.files`).
"""

from __future__ import annotations

__all__ = ["check_report_dir", "first_differences", "write_reports"]

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from onnx import numpy_helper

from dql_pass import runtimes
from dql_pass.compare import same_bits
from dql_pass.errors import InputError
from dql_pass.files import FolderLock, check_not_system, default_file_mode, put_folder, staged
from dql_pass.op import NAME
from dql_pass.suites.layout import DATA_SET, read_manifest
from dql_pass.suites.matrix import Matrix
from dql_pass.suites.run import Mismatch, Outcome

_SHOWN = 12  # differing values listed in differences.txt


def check_report_dir(path: str | os.PathLike) -> Path:
    """The report folder: absent or empty, in an existing folder; a refusal in one line otherwise."""
    target = Path(os.path.abspath(path))
    check_not_system(target, "report folder")
    if target.is_symlink() or target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InputError(f"{target}: exists and is not an empty folder; choose a new folder for the reports")
    if not target.parent.is_dir():
        raise InputError(f"{target}: {target.parent} is not a folder")
    # Its folder resolved (a link above it, /proc/self/cwd): the stage beside it and its lock need the folder itself.
    return target.parent.resolve() / target.name


def _bits(value: np.generic) -> str:
    """The bits of one element, most significant first (little-endian storage reversed)."""
    return "0x" + np.asarray(value).tobytes()[::-1].hex()


def first_differences(expected: np.ndarray, actual: np.ndarray, limit: int = _SHOWN) -> list[str]:
    """The first ``limit`` differing elements: index, expected and actual values with their bits."""
    if expected.dtype != actual.dtype or expected.shape != actual.shape:
        return [f"expected {expected.dtype} of shape {list(expected.shape)}, "
                f"got {actual.dtype} of shape {list(actual.shape)}"]
    differs = np.argwhere(~same_bits(actual, expected)) if expected.ndim else (
        np.zeros((0, 0), int) if same_bits(actual, expected) else np.zeros((1, 0), int))
    lines = []
    for where in differs[:limit]:
        index = tuple(int(i) for i in where)
        e, a = expected[index], actual[index]
        lines.append(f"{list(index)}: expected {e.item()!r} ({_bits(e)}), got {a.item()!r} ({_bits(a)})")
    return lines


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _smallest(failures: Sequence[Outcome], suite: Path) -> Outcome:
    """The failure with the smallest folder, wrong outputs before crashes (they say more)."""
    return min(failures, key=lambda o: (o.mismatch is None, _size(suite / o.name), o.name))


def _listed(outcomes: Sequence[Outcome], heading: str) -> str:
    if not outcomes:
        return ""
    listing = "\n".join(f"- {o.name}: {o.detail}" for o in sorted(outcomes, key=lambda o: o.name)[:20])
    more = f"\n- ... and {len(outcomes) - 20} more" if len(outcomes) > 20 else ""
    return f"\n{heading} ({len(outcomes)}):\n\n{listing}{more}\n"


def _issue(
    runtime: str, op: str, form: str, chosen: Outcome, failures: Sequence[Outcome], total: int, lines: list[str],
    entry: dict,
) -> str:
    adapter = runtimes.get(runtime)
    opset = chosen.name.rsplit("_opset", 1)[-1]
    found = chosen.mismatch
    what = found.text if found is not None else chosen.detail
    wrong = [o for o in failures if o.mismatch is not None]
    refused = [o for o in failures if o.mismatch is None]
    subject = op if form in ("native", "?") else f"{op} as dql_pass's {form} expansion (other ops, the same outputs)"
    # DynamicQuantizeLinear's expected outputs are ORT's kernel's (the contract); the other ops', the ONNX spec's.
    source = "ORT's kernel" if op == NAME else "the ONNX spec"
    problem = f"gives other outputs than {source} for {subject}" if wrong else f"does not load or run {subject}"
    title = f"outputs differ from {source}" if wrong else "does not load or run"
    expected = ("ONNX Runtime's CPU kernel's, bit for bit (dql_pass's NumPy reference of it)" if op == NAME
                else "the ONNX spec's, computed exactly by dql_pass's NumPy reference")
    if op == NAME and entry.get("policy", "onnxruntime") != "onnxruntime":
        expected += f", but for an all-zero or empty input, whose scale follows the policy `{entry['policy']}`"
    shown = "\n".join(lines) if lines else "(the runtime did not run it: see above)"
    policy = (f"\nThe expected values of this case follow the zero-range policy `{entry.get('policy')}` (an "
              "all-zero or empty input's scale: ORT's kernel gives 1.0, ONNX's reference 1/255); `gen-tests "
              "--zero-range` writes the other.\n" if entry.get("policy_dependent") else "")
    return f"""# {op}: {title} on {runtime} {adapter.version()}

{runtime} {adapter.version()} {problem} (opset {opset}) on {len(failures)} of {total} conformance cases written by
dql_pass. The expected outputs are {expected}. The smallest failing case is `{chosen.name}`:

    {what}
{policy}
First differing values (expected, then what {runtime} gave, with their bits):

```
{shown}
```

To reproduce: the folder `{chosen.name}/` is in ONNX's backend-test layout
(`model.onnx`, `{DATA_SET}/input_N.pb`, the expected `{DATA_SET}/output_N.pb`); `actual/output_N.pb` holds what
{runtime} gave. In this folder, `dql-pass run-tests . --runtime {runtime} --raw` runs this one case; onnx's
backend-test runner runs it too; or, with any runtime:

```python
import onnx, numpy as np
from onnx import numpy_helper
case = "{chosen.name}"
model = onnx.load(f"{{case}}/model.onnx")
feeds = {{i.name: numpy_helper.to_array(onnx.load_tensor(f"{{case}}/{DATA_SET}/input_{{n}}.pb"))
         for n, i in enumerate(model.graph.input)}}
expected = [numpy_helper.to_array(onnx.load_tensor(f"{{case}}/{DATA_SET}/output_{{n}}.pb"))
            for n in range(len(model.graph.output))]
got = ...  # the runtime's outputs for feeds, one array per graph output
for output, e, g in zip(model.graph.output, expected, got):
    g = np.asarray(g)
    same = g.dtype == e.dtype and g.shape == e.shape and g.tobytes() == e.tobytes()
    print(output.name, "same" if same else "DIFFERS")
```
{_listed(wrong, "Cases with other outputs")}{_listed(refused, "Cases that did not load or run")}"""


def _write_one(
    folder: Path, suite: Path, runtime: str, op: str, form: str, failures: Sequence[Outcome], total: int,
    manifest: dict[str, dict],
) -> None:
    chosen = _smallest(failures, suite)
    folder.mkdir()
    shutil.copytree(suite / chosen.name, folder / chosen.name, symlinks=False)
    found: Mismatch | None = chosen.mismatch
    lines: list[str] = []
    if found is not None:
        (folder / "actual").mkdir()
        for i, (name, actual) in enumerate(found.actual.items()):
            (folder / "actual" / f"output_{i}.pb").write_bytes(
                numpy_helper.from_array(np.asarray(actual), name).SerializeToString())
            lines += [f"{name}: " + line for line in first_differences(found.expected[name], np.asarray(actual))]
    (folder / "differences.txt").write_text("\n".join(lines or [chosen.detail]) + "\n")
    (folder / "ISSUE.md").write_text(
        _issue(runtime, op, form, chosen, failures, total, lines, manifest.get(chosen.name, {})))


def write_reports(report_dir: str | os.PathLike, suite_dir: str | os.PathLike, found: Matrix) -> list[Path]:
    """Write one report folder per runtime x op with failures under ``report_dir``; the folders written."""
    target = check_report_dir(report_dir)
    suite = Path(suite_dir)
    manifest = read_manifest(suite, suite.resolve())
    groups: dict[tuple[str, str, str], list[Outcome]] = {}
    totals: dict[tuple[str, str, str], int] = {}
    for runtime, report in found.reports.items():
        for outcome in report.outcomes if report is not None else []:
            key = (runtime, outcome.op, outcome.form)
            totals[key] = totals.get(key, 0) + 1
            if outcome.status == "FAIL" and (suite / outcome.name).is_dir():
                groups.setdefault(key, []).append(outcome)
    written = []
    with staged(target.parent, target.name, mode=default_file_mode(folder=True)) as stage:
        for (runtime, op, form), failures in sorted(groups.items()):
            name = f"{runtime}__{op}" + ("" if form in ("native", "?") else f"__expanded_{form}")
            _write_one(stage / name, suite, runtime, op, form, failures, totals[runtime, op, form], manifest)
            written.append(target / name)
        with FolderLock(target.parent):
            check_report_dir(target)  # again: the folder may have changed meanwhile
            if target.exists():
                target.rmdir()
            put_folder(stage, target)
    return written
