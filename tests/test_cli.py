"""The dql-pass command line: what it prints, its exit codes, and that nothing is ever lost.

Every test that runs a command in this process (``main([...])``) is here, grouped by command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import (
    MODELS, Result, assert_bad_input, digest, dql_model, dql_outputs, edit_graph, onnx_body, reciprocal_rewrite,
    run_cli, sample, without_clip,
)
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import runtimes, suites
from dql_pass import cli
from dql_pass.inputs import cases
from dql_pass.cli import main

MLP = MODELS / "mlp_dynamic.onnx"
CONTROL_FLOW = MODELS / "control_flow.onnx"


def _one_line_error(capsys: pytest.CaptureFixture[str], message: str) -> None:
    """What ``main`` printed, after it returned 2: nothing on stdout, one line on stderr (assert_bad_input)."""
    assert_bad_input(Result(2, *capsys.readouterr()), message)


# --- The entry points: python -m dql_pass and the console script ----------------------------------------------


def test_module_entry_point_expands_a_sample(tmp_path):
    out = tmp_path / "expanded.onnx"
    run = subprocess.run(
        [sys.executable, "-m", "dql_pass", "expand", str(MODELS / "control_flow.onnx"), "-o", str(out)],
        capture_output=True, text=True, check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "expanded 7 DynamicQuantizeLinear (variant quantizelinear, mode inline" in run.stdout
    per_graph = [line.split(None, 1) for line in run.stdout.splitlines()[1:]]
    assert sorted(label for _, label in per_graph) == [
        "function local::FakeQuant", "main", "main/If(if_out).else_branch", "main/If(if_out).then_branch",
        "main/Loop(loop_out).body", "main/Loop(loop_out).body/If(acc_next).then_branch", "main/Scan(scan_state).body",
    ]
    assert {count for count, _ in per_graph} == {"1"}
    onnx.checker.check_model(onnx.load(out), full_check=True)


CONSOLE_SCRIPT = Path(sys.executable).with_name("dql-pass")  # where pip puts it, on PATH or not


@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="the console script is not installed")
def test_console_script(tmp_path):
    run = subprocess.run([str(CONSOLE_SCRIPT), "expand", str(MODELS / "mlp_dynamic.onnx"), "-o",
                          str(tmp_path / "o.onnx"), "--variant", "arithmetic", "--mode", "function"],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert "expanded 3 DynamicQuantizeLinear (variant arithmetic, mode function" in run.stdout


# --- expand ---------------------------------------------------------------------------------------------------


def test_model_without_dql_is_copied_and_said(tmp_path, capsys):
    plain = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2])]),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    onnx.save(plain, tmp_path / "plain.onnx")
    assert main(["expand", str(tmp_path / "plain.onnx"), "-o", str(tmp_path / "out.onnx")]) == 0
    assert "no DynamicQuantizeLinear" in capsys.readouterr().out
    assert onnx.load(tmp_path / "out.onnx").graph == plain.graph


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = tmp_path / "good.onnx"
    onnx.save(dql_model(13), good)
    text = tmp_path / "text.onnx"
    text.write_text("not a model\n")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    invalid = tmp_path / "invalid.onnx"
    broken = dql_model(13)
    broken.graph.node[0].input[0] = "missing"
    onnx.save(broken, invalid)
    half = tmp_path / "half.onnx"
    f16 = dql_model(13)
    f16.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    onnx.save(f16, half)
    folder = tmp_path / "folder.onnx"
    folder.mkdir()
    return {
        "missing": (tmp_path / "absent.onnx", "no such file"),
        "directory": (folder, "not a file"),
        "not onnx": (text, "not a valid ONNX model"),
        "truncated": (truncated, "not a valid ONNX model"),
        "invalid": (invalid, "not a valid ONNX model"),
        "float16 input": (half, "float16"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "not onnx", "truncated", "invalid", "float16 input"])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, case):
    path, message = _bad_inputs(tmp_path)[case]
    before = {p.name: digest(p) for p in tmp_path.iterdir() if p.is_file()}
    out = tmp_path / "out.onnx"
    assert main(["expand", str(path), "-o", str(out)]) == 2
    _one_line_error(capsys, message)
    assert not out.exists()
    assert {p.name: digest(p) for p in tmp_path.iterdir() if p.is_file()} == before


def test_output_equal_to_input_is_refused(tmp_path, capsys):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    before = digest(source)
    assert main(["expand", str(source), "-o", str(tmp_path / "." / "m.onnx")]) == 2
    assert "output path is the input path" in capsys.readouterr().err
    assert digest(source) == before


@pytest.mark.parametrize("target", ["no/such/folder/out.onnx", "existing_dir"])
def test_unwritable_output_leaves_nothing(tmp_path, capsys, target):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    (tmp_path / "existing_dir").mkdir()
    assert main(["expand", str(source), "-o", str(tmp_path / target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("does not exist" in err or "is a folder" in err), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["existing_dir", "m.onnx"]


@pytest.mark.parametrize("closed", [1, 2])
def test_a_closed_standard_stream_leaves_the_other_reporting_and_the_exit_code_true(closed):
    """A parent may start the command with stdout or stderr closed (`2>&-`): Python then has no stream for it."""
    run = subprocess.run([sys.executable, "-m", "dql_pass", "verify", str(MODELS / "mlp_dynamic.onnx"),
                          str(MODELS / "mlp_dynamic.onnx"), "--samples", "1"],
                         capture_output=True, text=True, check=False, preexec_fn=lambda: os.close(closed))
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert ("PASS" in run.stdout) == (closed == 2), run.stdout


def test_a_closed_standard_descriptor_is_never_given_to_a_file_the_command_opens():
    """With stdin and stderr closed, the next file opened would take descriptor 0 or 2, and what a library or a
    runtime writes to stderr would land in it (the output model): the null device takes them first."""
    code = ("import os; from dql_pass.cli.process import _open_closed_streams; _open_closed_streams(); "
            "print(os.open(os.devnull, os.O_RDONLY))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         preexec_fn=lambda: [os.close(fd) for fd in (0, 2)])
    assert run.returncode == 0 and int(run.stdout) > 2, (run.stdout, run.stderr)


def test_a_missing_input_through_run_cli_is_one_line_without_traceback(tmp_path):
    """As a process runs it (its own logging, a fresh interpreter's warnings): an exception that escaped
    would fail here, as a traceback would in a process."""
    assert_bad_input(run_cli("expand", tmp_path / "nope.onnx", "-o", tmp_path / "o.onnx"), "no such file")
    assert list(tmp_path.iterdir()) == []


def test_outputs_get_ordinary_permissions(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    old = os.umask(0o022)
    try:
        assert main(["expand", str(source), "-o", str(tmp_path / "e.onnx")]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "e.onnx").stat().st_mode & 0o777 == 0o644


def test_truncated_external_data_blames_the_input(tmp_path, capsys):
    model = dql_model(13)
    weight = onnx.numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    model.graph.initializer.append(weight)
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    data = tmp_path / "m.data"
    data.write_bytes(data.read_bytes()[:100])
    assert main(["expand", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "m.onnx" in err and "external data" in err, err
    assert not (tmp_path / "o.onnx").exists()


def test_output_over_the_inputs_external_data_is_refused(tmp_path, capsys):
    model = dql_model(13)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones((64, 64), np.float32), "w"))
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0)
    before = digest(tmp_path / "weights.bin")
    assert main(["expand", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "weights.bin")]) == 2
    assert "external data" in capsys.readouterr().err
    assert digest(tmp_path / "weights.bin") == before


# --- fuse -----------------------------------------------------------------------------------------------------


def test_cli_fuses_and_reports(tmp_path, capsys):
    source = tmp_path / "inlined.onnx"
    onnx.save(onnx_body(sample("control_flow")), source)
    before = digest(source)
    assert main(["fuse", str(source), "-o", str(tmp_path / "out.onnx")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"fused 7 DynamicQuantizeLinear into {tmp_path / 'out.onnx'}")
    assert "main/Loop(loop_out).body/If(acc_next).then_branch  (onnx_function_body_11)" in out
    assert "function local::FakeQuant  (onnx_function_body_11)" in out
    assert "behaviour change of the 7 node(s) fused by onnx_function_body_11: " in out and "0/0" in out
    assert digest(source) == before
    assert dql_outputs(onnx.load(tmp_path / "out.onnx")) == dql_outputs(sample("control_flow"))


def test_cli_reports_what_it_left_alone(tmp_path, capsys):
    source = tmp_path / "edited.onnx"
    onnx.save(edit_graph(dql_pass.expand(sample("mlp_dynamic"), variant="arithmetic")[0], without_clip), source)
    assert main(["fuse", str(source), "-o", str(tmp_path / "out.onnx")]) == 0
    out = capsys.readouterr().out
    assert "fused 2 DynamicQuantizeLinear" in out
    assert "left alone 1 ReduceMin/ReduceMax pair(s)" in out
    assert "main, x 'input': closest rule dql_pass_arithmetic_onnxruntime" in out and "expected Clip, got Add" in out


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "absent.onnx", "no such file"),
        (lambda d: (d / "text.onnx").write_text("not a model\n") and d / "text.onnx", "not a valid ONNX model"),
    ],
)
def test_cli_bad_input_exits_2(tmp_path, capsys, make, message):
    path = make(tmp_path)
    assert main(["fuse", str(path), "-o", str(tmp_path / "out.onnx")]) == 2
    _one_line_error(capsys, message)
    assert not (tmp_path / "out.onnx").exists()


def test_cli_refuses_to_overwrite_its_input(tmp_path, capsys):
    source = tmp_path / "m.onnx"
    onnx.save(dql_pass.expand(sample("relu_dql"))[0], source)
    before = digest(source)
    assert main(["fuse", str(source), "-o", str(source)]) == 2
    assert "output path is the input path" in capsys.readouterr().err
    assert digest(source) == before


# --- gen-tests and run-tests ----------------------------------------------------------------------------------


def test_an_edited_expected_output_fails(small_suite, capsys):
    folder = "test_dynamicquantizelinear_spec_example_expanded_arithmetic_opset18"
    path = small_suite / folder / "test_data_set_0" / "output_0.pb"
    tensor = onnx.load_tensor(path)
    y = numpy_helper.to_array(tensor).copy()
    y[2] += 1
    path.write_bytes(numpy_helper.from_array(y, tensor.name).SerializeToString())

    assert main(["run-tests", str(small_suite)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"FAIL {folder}: ") and "y differs in 1 of 6" in line for line in lines)
    assert lines[-1] == f"{2 * len(suites.FORMS) - 1} passed, 1 failed"


def test_the_cli_writes_and_runs_a_suite(tmp_path, capsys):
    path = tmp_path / "dql"
    assert main(["gen-tests", str(path), "--opsets", "11", "--variants", "native", "--no-large"]) == 0
    count = len(cases())
    assert capsys.readouterr().out.startswith(f"wrote {count} test folders from {count} inputs to {path}: ")
    assert main(["run-tests", str(path), "--backend", "reference"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{count - 5} passed, 0 failed, 5 known differences (XFAIL)"
    # A second generation replaces the first suite.
    assert main(["gen-tests", str(path), "--opsets", "21", "--variants", "quantizelinear", "--no-large"]) == 0
    assert {d.name.rpartition("_opset")[2] for d in path.iterdir() if d.is_dir()} == {"21"}
    assert not [p for p in path.parent.iterdir() if p.name != "dql"]  # no staging folder left behind


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run-tests", "{tmp}/missing"], "no such folder"),
        (["run-tests", "{tmp}/foreign"], "no test folders"),
        (["gen-tests", "{tmp}/foreign"], "holds no dql_pass suite"),
        (["gen-tests", "{tmp}/new", "--opsets", "10"], "opset 10 is outside 11..28, the opsets that have Dynamic"),
        (["gen-tests", "{tmp}/new", "--variants", "native,fast"], "unknown variant 'fast'"),
        (["run-tests", "{tmp}/new", "--backend", "reference"], "no such folder"),
        # gen-tests makes the missing parents, and removes them again when it fails.
        (["gen-tests", "{tmp}/x/y/dql", "--opsets", "28", "--variants", "quantizelinear"],
         "can run none of the chosen folders"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(tmp_path, capsys, argv, message):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    _one_line_error(capsys, message)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"] and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign"]


def test_gen_tests_makes_the_missing_parents_of_its_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the README's own example, in a new folder
    assert main(["gen-tests", "conformance/dql", "--opsets", "13", "--variants", "native", "--no-large", "-q"]) == 0
    assert main(["run-tests", "-q"]) == 0  # its default folder is the same
    assert (tmp_path / "conformance" / "dql" / suites.MANIFEST).is_file()


def test_the_cli_at_opset_28_writes_a_suite_ort_passes(tmp_path, capsys):
    path = tmp_path / "dql"
    assert main(["gen-tests", str(path), "--opsets", "28", "--variants", "quantizelinear,arithmetic",
                 "--no-large"]) == 0
    count = len(cases())
    assert capsys.readouterr().out.startswith(f"wrote {count} test folders from {count} inputs to {path}: ")
    assert len(json.loads((path / suites.MANIFEST).read_text())["left_out"]) == count
    assert main(["run-tests", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{count} passed, 0 failed"


# verify


def test_cli_exit_codes_and_json(tmp_path, capsys, mlp):
    good, bad = tmp_path / "good.onnx", tmp_path / "bad.onnx"
    onnx.save(dql_pass.expand(mlp)[0], good)
    onnx.save(reciprocal_rewrite(mlp), bad)
    report_path = tmp_path / "report.json"
    assert main(["verify", str(MLP), str(good), "--json", str(report_path), "--samples", "1", "--dim", "batch=3"]) == 0
    saved = json.loads(report_path.read_text())
    assert saved["passed"] and len(saved["sites"]) == 3
    assert saved["input_sets"] == ["sample 0", "zeros", "negative", "positive", "heavy tails"]
    assert (saved["original"], saved["rewritten"]) == (str(MLP), str(good))
    assert "PASS" in capsys.readouterr().out

    assert main(["verify", str(MLP), str(bad), "--json", str(report_path)]) == 1
    saved = json.loads(report_path.read_text())
    assert saved["verdict"] == "FAIL" and "reciprocal" in saved["sites"][0]["classes"]
    assert "input_QuantizeLinear" in capsys.readouterr().out

    x = tmp_path / "x.npy"
    np.save(x, np.zeros((2, 64), np.float32))
    assert main(["verify", str(MLP), str(good), "--input", f"input={x}", "--samples", "0"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    "extra",
    [
        ["--dim", "nothing=3"],
        ["--dim", "batch=two"],
        ["--input", "input"],
        ["--input", "input=missing.npy"],
        ["--input", "nothing=x.npy"],
        ["--samples", "-1"],
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, monkeypatch):
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "x.npy", np.zeros((2, 64), np.float32))
    assert main(["verify", str(MLP), str(MLP), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dql-pass: error: ") and err.count("\n") == 1


def test_cli_missing_model_and_json_over_a_model(tmp_path, capsys):
    assert main(["verify", str(MLP), str(tmp_path / "none.onnx")]) == 2
    assert main(["verify", str(MLP), str(MLP), "--json", str(MLP)]) == 2
    assert capsys.readouterr().err.count("dql-pass: error: ") == 2


def test_cli_refuses_a_report_path_before_running(tmp_path, capsys, monkeypatch):
    """A missing folder, a folder, a model's external data: refused up front, nothing run, nothing touched."""
    model = tmp_path / "model.onnx"
    onnx.save(onnx.load(MLP), model, save_as_external_data=True, location="weights.bin", size_threshold=0)
    weights = (tmp_path / "weights.bin").read_bytes()
    monkeypatch.setattr(dql_pass, "verify", lambda *args, **kwargs: pytest.fail("verify ran"))
    for report in (tmp_path / "missing" / "report.json", tmp_path, tmp_path / "weights.bin", model):
        assert main(["verify", str(MLP), str(model), "--json", str(report)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"dql-pass: error: {report}: ") and err.count("\n") == 1
    assert (tmp_path / "weights.bin").read_bytes() == weights and not (tmp_path / "missing").exists()


def test_cli_prints_the_report_even_when_it_cannot_write_it(tmp_path, capsys, monkeypatch):
    def refuse(path, report):
        raise dql_pass.InputError(f"{path}: cannot write the report: disk full")

    monkeypatch.setattr(cli.process, "write_json", refuse)
    assert main(["verify", str(MLP), str(MLP), "--samples", "0", "--json", str(tmp_path / "report.json")]) == 2
    out, err = capsys.readouterr()
    assert "PASS: 3 sites" in out and "disk full" in err


@pytest.mark.parametrize("variant", dql_pass.VARIANTS)
def test_cli_expand_verify(tmp_path, capsys, variant):
    output = tmp_path / "out.onnx"
    assert main(["expand", str(CONTROL_FLOW), "-o", str(output), "--variant", variant, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "expanded 7" in out and "PASS: 7 sites" in out


@pytest.mark.parametrize("command, target", [("expand", None), ("lower", "onnxruntime")])
def test_expand_and_lower_say_how_to_check_what_they_wrote(tmp_path, capsys, command, target):
    output = tmp_path / "out put.onnx"
    argv = [command, str(MLP), "-o", str(output), *(["--target", target] if target else [])]
    assert main(argv) == 0
    runtime = f" --runtime {target}" if target else ""
    assert f"next: dql-pass verify {MLP} '{output}'{runtime} checks it" in capsys.readouterr().err
    assert main([*argv, "-q"]) == 0 and capsys.readouterr().err == ""


def test_the_check_expand_suggests_carries_the_options_it_would_verify_with(tmp_path, capsys):
    output = tmp_path / "out.onnx"
    assert main(["expand", str(MLP), "-o", str(output), "--zero-range", "onnx-reference", "--dim", "batch=3"]) == 0
    suggested = capsys.readouterr().err.split("next: ", 1)[1].split(" checks it")[0]
    assert suggested == f"dql-pass verify {MLP} {output} --zero-range onnx-reference --dim batch=3"
    assert main(suggested.split()[1:]) == 0


def test_run_tests_that_compared_nothing_is_not_a_success(small_suite, capsys):
    manifest = small_suite / "manifest.json"
    data = json.loads(manifest.read_text())
    for entry in data["cases"]:
        entry["comparable"] = False
    manifest.write_text(json.dumps(data))
    assert main(["run-tests", str(small_suite)]) == 1
    assert capsys.readouterr().out.splitlines()[-1].endswith("skipped (nothing was compared)")


def test_a_suite_folder_gets_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        assert main(["gen-tests", str(tmp_path / "dql"), "--opsets", "13", "--variants", "native", "--no-large"]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "dql").stat().st_mode & 0o777 == 0o755


# --- runtimes: expand --target, --list-targets, verify --runtime, run-tests --runtime -------------------------


def test_expand_target_picks_the_runtimes_variant(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runtimes.get("reference"), "variant", "float64")
    output = tmp_path / "out.onnx"
    assert main(["expand", str(MLP), "-o", str(output), "--target", "reference"]) == 0
    assert "(variant float64 for reference, mode inline" in capsys.readouterr().out
    casts = {a.i for n in onnx.load(output).graph.node if n.op_type == "Cast" for a in n.attribute}
    assert TensorProto.DOUBLE in casts


@pytest.mark.parametrize("argv, message", [
    (["--target", "nosuch"], "unknown runtime 'nosuch'; choose from onnxruntime, "),
    (["--target", "reference", "--variant", "arithmetic"], "argument --variant: not allowed with argument --target"),
])
def test_expand_target_bad_input(tmp_path, capsys, argv, message):
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), *argv]) == 2
    _one_line_error(capsys, message)
    assert not (tmp_path / "o.onnx").exists()


def test_a_variant_that_is_not_the_targets_is_refused_by_the_api(mlp):
    with pytest.raises(dql_pass.InputError, match="variant quantizelinear is not the one target reference gets"):
        dql_pass.expand(mlp, variant="quantizelinear", target="reference")[0]


@pytest.mark.parametrize("command", ["expand", "lower", "advise"])
def test_list_targets_is_one_line_per_target_on_every_command_that_takes_one(capsys, command):
    assert main([command, "--list-targets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:4] == ["target", "variant", "weights", "installed"]
    for name, runtime in runtimes.RUNTIMES.items():
        row = [line for line in lines if line.split()[:1] == [name]]
        assert len(row) == 1 and row[0].split()[1:3] == [runtime.variant, runtime.weights], row
    for name in runtimes.ELSEWHERE:  # named in the README, without an adapter: listed with their command
        assert any(line.split()[:1] == [name] for line in lines), name
    assert "run `dql-pass lower INPUT -o OUTPUT`, no --target" in "\n".join(lines)
    assert len(lines) < len(runtimes.RUNTIMES) + len(runtimes.ELSEWHERE) + 4 and max(map(len, lines)) < 250


@pytest.mark.parametrize("argv", [["expand", "-v", "--list-targets"], ["lower", "--list-targets", "-v"],
                                  ["-v", "advise", "--list-targets"]])
def test_list_targets_with_v_gives_every_reason(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    for name, runtime in runtimes.RUNTIMES.items():
        assert f"\n{name}:\n" in out
        for difference in runtime.known_differences:
            said = f"differs on {difference.inputs} inputs: {difference.reason}" in out
            assert said == (runtime.variant in difference.forms)


def test_list_targets_keeps_its_rows_short_when_an_install_hint_names_a_long_path(capsys, monkeypatch, tmp_path):
    from dql_pass.runtimes.web import installation

    long_cache = tmp_path / ("deep" * 60)  # not there: the web runtimes are missing, their hint names it
    monkeypatch.setenv(installation.CACHE_VARIABLE, str(long_cache))
    assert main(["expand", "--list-targets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) < 250 and any(line.split()[:1] == ["webgpu"] and " no: run `" in line for line in lines)
    assert main(["expand", "--list-targets", "-v"]) == 0
    assert f"  not installed: {runtimes.get('webgpu').install_hint()}" in capsys.readouterr().out
    assert str(long_cache) in runtimes.get("webgpu").install_hint()


@pytest.mark.parametrize("command", ["expand", "lower"])
@pytest.mark.parametrize("name", ["tensorrt", "coreml"])
def test_a_target_without_an_adapter_says_to_lower_without_one(tmp_path, capsys, command, name):
    assert main([command, str(MLP), "-o", str(tmp_path / "o.onnx"), "--target", name]) == 2
    _one_line_error(capsys, "run `dql-pass lower INPUT -o OUTPUT` with no --target")
    assert not (tmp_path / "o.onnx").exists()


def test_expand_for_webgpu_says_the_integer_ops_stay_on_the_cpu_and_names_lower(tmp_path, capsys, monkeypatch):
    from dql_pass import deployment

    # The browser's own load is tested in test_web_runtimes.py; here only what expand says of its stated data.
    monkeypatch.setattr(deployment, "blockers",
                        lambda model, runtime, dims=None: deployment.Blockers(runtime, [], "not loaded here"))
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), "--target", "webgpu"]) == 0
    err = capsys.readouterr().err
    assert "MatMulInteger still run on the CPU, not on webgpu" in err
    assert f"`dql-pass lower {MLP} -o OUTPUT --target webgpu`" in err


def test_a_runtime_that_is_not_installed_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    runtime = runtimes.get("reference")
    monkeypatch.setattr(type(runtime), "installed", lambda self: False)
    monkeypatch.setattr(runtime, "extra", "reference-extra", raising=False)
    assert main(["verify", str(MLP), str(MLP), "--runtime", "reference"]) == 2
    _one_line_error(capsys, "the runtime reference is not installed; pip install 'dql_pass[reference-extra]'")
    assert main(["run-tests", str(tmp_path), "--runtime", "reference"]) == 2
    _one_line_error(capsys, "pip install 'dql_pass[reference-extra]'")


def test_verify_on_a_runtime_runs_rewritten_there(tmp_path, capsys):
    arithmetic, quantizelinear = tmp_path / "a.onnx", tmp_path / "q.onnx"
    assert main(["expand", str(MLP), "-o", str(arithmetic), "--target", "reference", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "PASS: 3 sites" in out and "REWRITTEN on reference" in out
    assert "graph outputs compared with ORIGINAL run on reference, its DQL expanded by the variant exact there" in out
    # quantizelinear is exact on ORT, not on onnx.reference (+inf quotients): the difference it states for that form.
    assert main(["expand", str(MLP), "-o", str(quantizelinear)]) == 0
    assert main(["verify", str(MLP), str(quantizelinear)]) == 0
    capsys.readouterr()
    assert main(["verify", str(MLP), str(quantizelinear), "--runtime", "reference"]) == 0
    out, err = capsys.readouterr()
    assert "known difference of reference, 6 cases at 3 sites: onnx.reference's QuantizeLinear sends" in out
    (summary,) = [line for line in out.splitlines() if line.startswith("PASS: 3 sites")]
    assert summary.endswith("REWRITTEN on reference, 6 known differences of reference")
    assert ("next: the known differences are reference's for quantizelinear, the form REWRITTEN has, not for its "
            f"target; `dql-pass expand {MLP} -o OUT --target reference --verify`") in err


def test_run_tests_on_a_runtime_and_its_old_name(small_suite, capsys):
    for option in ("--runtime", "--backend"):
        assert main(["run-tests", str(small_suite), option, "reference"]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == f"{2 * len(suites.FORMS)} passed, 0 failed"


# --- what the command line points to next ------------------------------------------------------------------


def test_a_dim_the_model_lacks_lists_the_dimensions_it_has(capsys):
    assert main(["verify", str(MLP), str(MLP), "--dim", "nosuch=3"]) == 2
    _one_line_error(capsys, "no input of ORIGINAL has a dimension named 'nosuch'; its dimensions: batch")


def test_a_target_that_is_not_installed_names_its_setup_command(tmp_path, capsys, monkeypatch):
    runtime = runtimes.get("reference")
    monkeypatch.setattr(type(runtime), "installed", lambda self: False)
    monkeypatch.setattr(runtime, "extra", "reference-extra", raising=False)
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), "--target", "reference"]) == 0
    err = capsys.readouterr().err
    assert ("note: reference is not installed, so only its stated lacks were checked; "
            "pip install 'dql_pass[reference-extra]'") in err


def test_expand_says_what_it_checks_on_the_target_and_the_result(tmp_path, capsys):
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), "--target", "reference"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [f"dql-pass: checking {tmp_path / 'o.onnx'} on reference...",
                       "dql-pass: reference: loads and runs it"]


def _target_check(command: str, *lacks: runtimes.Lack) -> dql_pass.TargetCheck:
    from dql_pass.verification.deployable import Blockers

    found = Blockers("somewhere", [lack.describe() for lack in lacks], not_tried="not installed")
    return dql_pass.TargetCheck(command, "in.onnx", "out.onnx", "somewhere", list(lacks), found, [])


def _lack(op_type: str, reason: str = "no kernel") -> runtimes.Lack:
    return runtimes.Lack("somewhere", op_type, 11, "measured", reason)


@pytest.mark.parametrize(("lacks", "points"), [
    ([_lack("QuantizeLinear")], True),
    ([_lack("MatMulInteger")], True),
    # An op whose name holds a lowered op's name, and a reason that names one: lower changes neither.
    ([_lack("DynamicQuantizeLinear")], False),
    ([_lack("Gemm", reason="it runs Gemm as MatMulInteger does, which it lacks")], False),
])
def test_expand_target_points_to_lower_by_the_lacking_op_not_by_its_sentence(lacks, points):
    text = _target_check("expand", *lacks).format()
    assert all(f"dql-pass: still blocks somewhere: {lack.describe()}" in text for lack in lacks)
    assert ("`dql-pass lower in.onnx -o OUTPUT --target somewhere`" in text) == points, text


def test_lower_target_leaves_the_lacks_to_lowers_own_report():
    check = _target_check("lower", _lack("QuantizeLinear"))
    assert check.format() == "dql-pass: note: not installed" and check.to_dict() == {"blockers": check.found.reasons}


def test_generate_suite_takes_variants_and_its_old_name_forms(tmp_path):
    new = dql_pass.generate_suite(tmp_path / "new", opsets=(13,), variants=("arithmetic",), names=("rank_0",))
    old = dql_pass.generate_suite(tmp_path / "old", opsets=(13,), forms=("arithmetic",), names=("rank_0",))
    for suite in (new, old):
        assert json.loads((suite.path / suites.MANIFEST).read_text())["variants"] == ["arithmetic"]
        assert [entry.variant for entry in suite.entries] == ["arithmetic"]


@pytest.mark.parametrize("variants", [("native",), ("arithmetic",)])
def test_generate_suite_refuses_variants_and_forms_together_writing_nothing(tmp_path, variants):
    with pytest.raises(TypeError, match="^generate_suite[(][)] takes variants or its old name forms, not both$"):
        dql_pass.generate_suite(tmp_path / "suite", opsets=(13,), variants=variants, forms=("arithmetic",),
                                names=("rank_0",))
    assert list(tmp_path.iterdir()) == []


def test_main_in_process_logs_to_stderr_as_it_is_and_leaves_no_state_behind(capsys):
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    ort = runtimes.get("onnxruntime")
    timeout = ort.timeout
    argv = ["-v", "verify", str(MLP), str(MLP), "--samples", "0", "--runtime", "onnxruntime", "--runtime-timeout", "7"]
    assert main(argv) == 0
    assert (root.handlers, root.level, ort.timeout) == (handlers, level, timeout)
    out, err = capsys.readouterr()
    assert "PASS" in out and any(line.startswith("dql_pass.") for line in err.splitlines()), err


def test_a_usage_error_points_to_the_commands_help(capsys):
    assert main(["expand", "model.onnx"]) == 2
    assert capsys.readouterr().err == ("dql-pass: error: the following arguments are required: -o/--output "
                                       "(see `dql-pass expand --help`)\n")
    assert main(["frob"]) == 2
    assert capsys.readouterr().err.endswith(" (see `dql-pass --help`)\n")


def test_a_pass_on_onnxruntime_says_how_to_check_on_the_runtime_it_will_run_on(tmp_path, capsys):
    output = tmp_path / "out.onnx"
    assert main(["expand", str(MLP), "-o", str(output), "-q"]) == 0
    assert main(["verify", str(MLP), str(output)]) == 0
    assert "next: checked on onnxruntime; --runtime NAME checks it" in capsys.readouterr().err
    assert main(["expand", str(MLP), "-o", str(output), "--target", "reference", "-q"]) == 0
    assert main(["verify", str(MLP), str(output), "--runtime", "reference"]) == 0, capsys.readouterr()
    assert "next:" not in capsys.readouterr().err


def test_a_fail_of_another_tools_rewrite_says_how_to_get_one_that_passes(tmp_path, capsys):
    broken = onnx.load(MLP)
    next(n for n in broken.graph.node if n.op_type == "Relu").op_type = "Abs"
    onnx.save(broken, tmp_path / "broken.onnx")
    assert main(["verify", str(MLP), str(tmp_path / "broken.onnx")]) == 1
    assert f"next: REWRITTEN does not compute what ORIGINAL does (the lines above say where); `dql-pass expand {MLP} " \
           "-o OUT --verify`" in capsys.readouterr().err


def test_fuse_gen_tests_and_a_failing_run_tests_say_what_to_do_next(tmp_path, capsys):
    expanded, fused, suite = tmp_path / "e.onnx", tmp_path / "f.onnx", tmp_path / "suite"
    assert main(["expand", str(MLP), "-o", str(expanded), "-q"]) == 0
    assert main(["fuse", str(expanded), "-o", str(fused)]) == 0
    assert f"next: dql-pass verify {expanded} {fused} checks it" in capsys.readouterr().err
    assert main(["gen-tests", str(suite), "--opsets", "13", "--variants", "native", "--no-large"]) == 0
    assert f"next: dql-pass run-tests {suite} --runtime NAME runs it" in capsys.readouterr().err
    assert main(["run-tests", str(suite), "--runtime", "reference", "--raw"]) == 1  # its empty-input difference
    again = f"next: dql-pass run-tests {suite} --runtime reference --raw --report-dir DIR writes"
    assert again in capsys.readouterr().err


def test_the_runtime_timeout_help_gives_the_adapters_own_limits():
    from dql_pass.cli.parser import build
    from dql_pass.runtimes import litert, mnn, served, web

    help_text = build().commands["verify"].format_help()
    limits = (f"webgpu and wasm: {web.WebRuntime.load_timeout:g} to load, {web.WebRuntime.run_timeout:g} to run; "
              f"mnn: {mnn.CONVERT_SECONDS:g} to convert, {mnn.RUN_SECONDS:g} to run; "
              f"tract and openvino: {served.RUN_SECONDS:g} to load or run; "
              f"litert: {litert.LiteRt.conversion_timeout:g} to convert")
    assert limits in " ".join(help_text.split())


def test_run_tests_on_several_runtimes_says_how_far_it_is(tmp_path, capsys, monkeypatch):
    """It printed nothing until the end: 16 minutes with IREE, which compiles every model."""
    from dql_pass.cli.progress import Progress

    monkeypatch.setattr(Progress, "_EVERY", 0.0)  # a line at each test, not every 2 s
    suite = tmp_path / "suite"
    assert main(["gen-tests", str(suite), "--opsets", "13", "--variants", "native", "--no-large", "-q"]) == 0
    assert main(["run-tests", str(suite), "--runtime", "onnxruntime,reference"]) in (0, 1)
    err = capsys.readouterr().err
    assert "dql-pass: run-tests: tests on onnxruntime 57 of 57" in err and "tests on reference 1 of 57" in err
    assert main(["run-tests", str(suite), "--runtime", "onnxruntime,reference", "--raw"]) == 1
    assert "next: -v lists every test as it runs; --report-dir DIR writes" in capsys.readouterr().err
    assert main(["run-tests", str(tmp_path / "missing"), "--runtime", "onnxruntime,reference"]) == 2  # no traceback


def test_an_option_another_command_has_points_to_this_commands_help(capsys):
    assert main(["fuse", str(MLP), "-o", "out.onnx", "--target", "webgpu"]) == 2
    assert capsys.readouterr().err == (
        "dql-pass: error: unrecognized arguments: --target webgpu (see `dql-pass fuse --help`)\n")
