"""Hostile conformance suites: run-tests and gen-tests answer, never hang, never read without bound,
never show what lies outside the suite, and never lose a user's file; a gen-tests killed at any step
leaves the whole old suite or the whole new one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import STEP_FAILURE_DRIVER, assert_bad_input, digest, run_cli, signals_as_by_default
from onnx import TensorProto, helper, numpy_helper

from dql_pass import suites

SPEC = "test_dynamicquantizelinear_spec_example_opset13"
SECRET = b"SECRET-BYTES-OUTSIDE-THE-SUITE"
# The most spec_example's input file may hold: x is float32[6], 16 bytes an element at most, plus 64 KiB.
X_LIMIT = 65536 + len("x") + 16 * 6


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("pristine") / "dql"
    suites.generate_suite(path, opsets=(13,), variants=("native",), names=("spec_example",))
    return path


@pytest.fixture()
def suite(pristine, tmp_path):
    """The pristine suite copied beside secret.bin, a file that run-tests must never show."""
    path = tmp_path / "dql"
    shutil.copytree(pristine, path)
    (tmp_path / "secret.bin").write_bytes(SECRET)
    return path


def _external(path, location: str) -> None:
    """Make the TensorProto file ``path`` keep its data at ``location``."""
    tensor = onnx.load_tensor(path)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    path.write_bytes(tensor.SerializeToString())


def _external_zero(model_path, location: str) -> None:
    """Make the model add a zero, read from external data at ``location``, to x before its DQL."""
    model = onnx.load(model_path)
    zero = numpy_helper.from_array(np.zeros((), np.float32), "zero")
    zero.ClearField("raw_data")
    zero.data_location = TensorProto.EXTERNAL
    entry = zero.external_data.add()
    entry.key, entry.value = "location", location
    model.graph.initializer.append(zero)
    model.graph.node[0].input[0] = "x_plus_zero"
    model.graph.node.insert(0, helper.make_node("Add", ["x", "zero"], ["x_plus_zero"]))
    model_path.write_bytes(model.SerializeToString())


def _replace(path, make) -> None:
    path.unlink()
    make(path)


def _x_beside(data_set) -> None:
    x = numpy_helper.to_array(onnx.load_tensor(data_set / "input_0.pb"))
    (data_set / "x.bin").write_bytes(x.tobytes())
    _external(data_set / "input_0.pb", "x.bin")


def _zero_beside(folder) -> None:
    (folder / "zero.bin").write_bytes(bytes(4))
    _external_zero(folder / "model.onnx", "zero.bin")


def _no_outputs(folder, data_set) -> None:
    """A test that compares nothing: a model without graph outputs, and no output files."""
    model = onnx.load(folder / "model.onnx")
    del model.graph.output[:]
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    for path in data_set.glob("output_*.pb"):
        path.unlink()


# Each hostile folder: how its copy of spec_example is edited (given the folder and its data set), and its outcome,
# "STATUS" or "STATUS: detail"; a detail ending in "..." is the start of a refusal worded by onnx or ORT. What the
# backends word differently is a dict.
HOSTILE = {
    "missing_output": (lambda f, d: (d / "output_2.pb").unlink(), "FAIL: test_data_set_0/output_2.pb is missing"),
    "missing_input": (lambda f, d: (d / "input_0.pb").unlink(), "FAIL: test_data_set_0/input_0.pb is missing"),
    "fifo_input": (lambda f, d: _replace(d / "input_0.pb", os.mkfifo),
                   "FAIL: test_data_set_0/input_0.pb is not a regular file"),
    "fifo_model": (lambda f, d: _replace(f / "model.onnx", os.mkfifo), "FAIL: model.onnx is not a regular file"),
    "symlink_to_dev_zero": (
        lambda f, d: _replace(d / "output_0.pb", lambda p: p.symlink_to("/dev/zero")),
        "FAIL: test_data_set_0/output_0.pb is outside the suite (through a symlink)",
    ),
    "symlink_outside": (
        lambda f, d: _replace(d / "output_0.pb", lambda p: p.symlink_to("../../../secret.bin")),
        "FAIL: test_data_set_0/output_0.pb is outside the suite (through a symlink)",
    ),
    "oversized_input": (
        lambda f, d: os.truncate(d / "input_0.pb", 2 << 30),  # sparse: costs no disk, and must not be read
        f"FAIL: test_data_set_0/input_0.pb holds {2 << 30} bytes, more than the {X_LIMIT} it may hold",
    ),
    # secret.bin is in the folder run-tests is started from, where it once looked.
    "external_from_current_folder": (
        lambda f, d: _external(d / "output_0.pb", "secret.bin"),
        "FAIL: test_data_set_0/output_0.pb: external data refused: ...",
    ),
    "external_escaping": (
        lambda f, d: _external(d / "output_0.pb", "../../../secret.bin"),
        "FAIL: test_data_set_0/output_0.pb: external data refused: ...",
    ),
    "external_absolute": (
        lambda f, d: _external(d / "output_0.pb", os.fspath(f.parent.parent / "secret.bin")),
        "FAIL: test_data_set_0/output_0.pb: external data refused: ...",
    ),
    "no_outputs": (_no_outputs, "FAIL: the model has no outputs"),
    "external_beside": (lambda f, d: _x_beside(d), "PASS"),
    "model_external_beside": (lambda f, d: _zero_beside(f), "PASS"),
    "model_external_escaping": (
        lambda f, d: _external_zero(f / "model.onnx", "../../secret.bin"),
        {
            "onnxruntime": "FAIL: Fail: [ONNXRuntimeError] : 1 : FAIL : External data path validation failed for "
                           "initializer: zero. Error: External data path escapes model directory...",
            "reference": "FAIL: ValidationError: Data of TensorProto ( tensor name: zero) should be file inside ...",
        },
    ),
}


def _device_node(folder, data_set) -> None:
    # A copy of /dev/zero's node (char 1,5) inside the suite: reading it would never end.
    _replace(data_set / "output_0.pb", lambda p: os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5)))


if os.geteuid() == 0:  # making a device node takes root
    HOSTILE["device_node"] = (_device_node, "FAIL: test_data_set_0/output_0.pb is not a regular file")


@pytest.mark.parametrize("backend", ["onnxruntime", "reference"])
def test_hostile_files_fail_their_own_test_only(suite, backend):
    for name, (edit, _) in HOSTILE.items():
        folder = suite / f"test_hostile_{name}"
        shutil.copytree(suite / SPEC, folder)
        edit(folder, folder / "test_data_set_0")
    run = run_cli("run-tests", str(suite), "--backend", backend, cwd=suite.parent)
    # stderr: the next step alone (a report for the maintainers), nothing of the hostile files
    assert run.stderr.startswith("next: dql-pass run-tests ") and run.stderr.count("\n") == 1, run.stderr
    assert run.returncode == 1 and "SECRET" not in run.stderr
    *lines, summary = run.stdout.splitlines()
    got = {}
    for line in lines:
        status, _, rest = line.partition(" ")
        if status not in ("PASS", "FAIL", "XFAIL", "SKIP"):
            continue  # the table of counts per form
        folder, _, detail = rest.partition(": ")
        got[folder] = f"{status}: {detail}" if detail else status
    expected = {f"test_hostile_{name}": want[backend] if isinstance(want, dict) else want
                for name, (_, want) in HOSTILE.items()}
    expected[SPEC] = "PASS"
    assert sorted(got) == sorted(expected)
    for folder, want in expected.items():
        matches = got[folder].startswith(want[:-3]) if want.endswith("...") else got[folder] == want
        assert matches, (folder, got[folder], want)
    passed = sum(want == "PASS" for want in expected.values())
    assert summary == f"{passed} passed, {len(expected) - passed} failed"
    assert "SECRET" not in run.stdout and "expected" not in run.stdout  # nothing read outside the suite is shown


# --- manifest.json: the suite as a whole is bad input ---


@pytest.mark.parametrize("make, reason", [
    (os.mkfifo, "manifest.json is not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "manifest.json is outside the suite (through a symlink)"),
])
def test_a_special_manifest_is_bad_input(suite, make, reason):
    _replace(suite / suites.MANIFEST, make)
    assert_bad_input(run_cli("run-tests", str(suite)), f"{suite}: {reason}")


# --- gen-tests: what it did not write is never lost ---


def test_gen_tests_under_a_symlink_loop_is_bad_input(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert_bad_input(run_cli("gen-tests", tmp_path / "a" / "suite"), "is not a folder")


def test_gen_tests_keeps_a_file_the_user_added(suite):
    notes = suite / SPEC / "test_data_set_0" / "notes.txt"
    notes.write_text("mine")
    run = run_cli("gen-tests", str(suite), "--opsets", "13", "--variants", "native", "--no-large")
    assert_bad_input(run, (
        f"{suite}: the suite there holds 1 file(s) that gen-tests did not write ({SPEC}/test_data_set_0/notes.txt); "
        "move them away, or force the replacement"
    ))
    assert notes.read_text() == "mine"


def test_gen_tests_over_a_fifo_manifest_does_not_hang(suite):
    _replace(suite / suites.MANIFEST, os.mkfifo)
    run = run_cli("gen-tests", str(suite), "--opsets", "13", "--variants", "native", "--no-large")
    assert_bad_input(run, f"{suite}: a non-empty folder that holds no dql_pass suite; choose another output folder")
    assert stat.S_ISFIFO(os.lstat(suite / suites.MANIFEST).st_mode)


# --- gen-tests: OUTDIR is the whole old suite or the whole new one, even under kill -9 ---

# Run before STEP_FAILURE_DRIVER: one catalogue case, so that each forked gen-tests writes one folder.
_ONE_CASE = textwrap.dedent('''
    from dql_pass import inputs

    one_case = [c for c in inputs.cases() if c.name == "spec_example"]
    inputs.cases = lambda **options: one_case
''')


def _tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the driver forks one child per injected step")
def test_gen_tests_killed_at_any_step_keeps_a_whole_suite(pristine, tmp_path):
    """Replace a suite at opset 13 by one at opset 11, with a kill -9 at step 1, 2, 3, ... of gen-tests.

    After each kill OUTDIR is the whole old suite or the whole new one (the two are swapped in one
    step), and the next run removes what the kills left. Failures and interrupts, and the two
    renames that stand in where there is no one-step swap, are covered in test_suites.py.
    """
    (tmp_path / "snapshots").mkdir()
    path = tmp_path / "out" / "dql"
    shutil.copytree(pristine, path)
    old = _tree(path)
    args = ["gen-tests", str(path), "--opsets", "11", "--variants", "native", "--no-large"]
    run = subprocess.run([sys.executable, "-c", _ONE_CASE + STEP_FAILURE_DRIVER, json.dumps(args), str(path.parent),
                          str(tmp_path / "snapshots"), "kill"], capture_output=True, text=True, check=True, timeout=300,
                         preexec_fn=signals_as_by_default)
    codes = json.loads(run.stdout.splitlines()[-1])
    assert len(codes) >= 30 and set(codes) == {-signal.SIGKILL}, codes  # every step was hit
    new = _tree(path)  # written by the run that went past every step
    assert new != old and sorted(p.name for p in path.parent.iterdir()) == ["dql"]  # it cleared what the kills left
    states = []
    for n in range(1, len(codes) + 1):
        tree = _tree(tmp_path / "snapshots" / str(n) / "dql")
        assert tree in (old, new), f"step {n}: neither the old suite nor the new one"
        states.append("old" if tree == old else "new")
    assert states[0] == "old" and states[-1] == "new", states


