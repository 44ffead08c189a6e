"""The conventions of the field that a user expects of a command line: --version, -v/-q anywhere,
--json for every command, a bare command that lists the commands, a help that imports no graph
library (a Ctrl-C that never prints a traceback is test_interrupts.py's)."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import onnx_ir as ir
import pytest
from helpers import MODELS, installed, run_cli

import dql_pass
from dql_pass.cli import main

MLP = MODELS / "mlp_dynamic.onnx"


def test_version_is_the_installed_one(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"dql-pass {dql_pass.__version__}\n"
    assert dql_pass.__version__ not in ("", "unknown")


def test_a_bare_command_lists_the_commands():
    run = run_cli()
    assert run.returncode == 2 and run.stdout == ""
    for command in ("expand", "lower", "fuse", "verify", "gen-tests", "run-tests"):
        assert f"    {command}" in run.stderr, run.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_prints_nothing_before_or_after_the_command(tmp_path, capsys, where):
    argv = ["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), "--verify"]
    assert main(["-q", *argv] if where == "before" else [*argv, "-q"]) == 0
    assert capsys.readouterr() == ("", "")
    assert (tmp_path / "o.onnx").exists()


def test_verbose_after_the_command_logs(tmp_path):
    run = run_cli("expand", MLP, "-o", tmp_path / "o.onnx", "-v")
    assert run.returncode == 0 and "dql_pass." in run.stderr, run.stderr


def test_verbose_and_quiet_together_are_a_usage_error(tmp_path, capsys):
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), "-v", "-q"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def _json_of(tmp_path, argv) -> dict:
    report = tmp_path / "report.json"
    code = main([*argv, "-q", "--json", str(report)])
    data = json.loads(report.read_text())
    assert data["exit_code"] == code
    return data


def test_every_command_writes_its_report_as_json(tmp_path):
    expanded, lowered, fused, suite = (tmp_path / name for name in ("e.onnx", "l.onnx", "f.onnx", "suite"))
    data = _json_of(tmp_path, ["expand", str(MLP), "-o", str(expanded), "--verify"])
    assert data["command"] == "expand" and data["sites"] == {"main": 3} and data["verify"]["verdict"] == "PASS"
    data = _json_of(tmp_path, ["lower", str(MLP), "-o", str(lowered)])
    assert data["command"] == "lower" and len(data["lowered"]) > 0 and data["target"] is None
    data = _json_of(tmp_path, ["fuse", str(expanded), "-o", str(fused)])
    assert data["command"] == "fuse" and data["total"] == 3
    data = _json_of(tmp_path, ["verify", str(MLP), str(expanded), "--samples", "0"])
    assert data["command"] == "verify" and data["verdict"] == "PASS" and data["exit_code"] == 0
    data = _json_of(tmp_path, ["gen-tests", str(suite), "--opsets", "21", "--variants", "native", "--no-large"])
    assert data["command"] == "gen-tests" and data["folders"] > 0
    data = _json_of(tmp_path, ["run-tests", str(suite)])
    assert data["command"] == "run-tests" and data["ok"] and len(data["outcomes"]) == data_folders(suite)


def data_folders(suite) -> int:
    return sum(1 for d in suite.iterdir() if (d / "model.onnx").exists())


@pytest.mark.parametrize("victim", ["input", "data"])
def test_a_report_path_that_holds_something_else_is_never_replaced(tmp_path, capsys, victim):
    # Any file that is not a JSON report: here a model's weights, which no other check would know of.
    precious = tmp_path / ("weights.data" if victim == "data" else "other.onnx")
    precious.write_bytes(MLP.read_bytes())
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), "--json", str(precious)]) == 2
    assert "holds something other than a report of dql-pass" in capsys.readouterr().err
    assert precious.read_bytes() == MLP.read_bytes() and not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("held", [
    '{"cases": [], "format": "dql_pass conformance suite 1"}',  # a suite's manifest
    '{"atol": 0, "rtol": 0}',  # onnx's tolerance file of a test folder
    '{"irVersion": "8", "graph": {}}',  # a model in ONNX's JSON format
    "11111111",  # weights whose bytes happen to read as a JSON number
])
def test_a_json_file_that_is_no_report_of_dql_pass_is_never_replaced(tmp_path, capsys, held):
    precious = tmp_path / "precious.json"
    precious.write_text(held)
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), "--json", str(precious)]) == 2
    assert "holds something other than a report of dql-pass" in capsys.readouterr().err
    assert precious.read_text() == held


@pytest.mark.parametrize("command", ["gen-tests", "run-tests"])
def test_a_report_is_never_written_into_the_suite(tmp_path, capsys, command):
    suite = tmp_path / "suite"
    assert main(["gen-tests", str(suite), "--opsets", "21", "--variants", "native", "--no-large", "-q"]) == 0
    manifest = (suite / "manifest.json").read_bytes()
    for target in (suite / "manifest.json", suite / "new.json"):
        assert main([command, str(suite), "--json", str(target)]) == 2
        assert "would be written into the suite folder" in capsys.readouterr().err
    assert (suite / "manifest.json").read_bytes() == manifest and not (suite / "new.json").exists()


def test_a_report_replaces_an_older_report(tmp_path):
    report = tmp_path / "r.json"
    report.write_text('{"command": "verify", "exit_code": 0}')
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), "-q", "--json", str(report)]) == 0
    assert json.loads(report.read_text())["command"] == "expand"


def _runs_clean(code: str) -> None:
    """``code`` in a fresh interpreter, where no import of this one can hide what it imports."""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stderr


def test_help_imports_no_graph_library():
    # What makes --help slow is onnx, onnx_ir and numpy; the parser is built from leaf modules.
    code = ("import sys\nfrom dql_pass.cli import main\nassert main(['--help']) == 0\n"
            "for command in ('expand', 'lower', 'fuse', 'verify', 'gen-tests', 'run-tests'):\n"
            "    assert main([command, '--help']) == 0\n"
            "heavy = sorted(m for m in ('onnx', 'onnx_ir', 'numpy', 'onnxruntime', 'onnxscript') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    _runs_clean(code)


def test_listing_the_targets_imports_no_graph_library():
    # Listing reads the adapters' data: their versions, lacks and differences, never a model.
    code = ("import sys\nfrom dql_pass.cli import main\nassert main(['expand', '--list-targets']) == 0\n"
            "heavy = sorted(m for m in ('onnx', 'onnx_ir', 'onnxruntime', 'onnxscript') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    _runs_clean(code)


# --- The Python API ---------------------------------------------------------------------------------------------


def test_a_report_is_true_only_for_a_pass(tmp_path):
    expanded = tmp_path / "e.onnx"
    dql_pass.expand_file(MLP, expanded)
    assert dql_pass.verify(MLP, expanded, samples=0)
    wrong = onnx.load(expanded)
    for node in wrong.graph.node:
        if node.op_type == "Div":
            node.op_type = "Mul"  # x * scale: wrong everywhere
    report = dql_pass.verify(MLP, wrong, samples=0)
    assert report.verdict == "FAIL" and not report
    assert repr(report).startswith("<VerifyReport FAIL: ") and len(repr(report)) < 1000


def test_a_pass_handed_a_proto_says_what_it_takes():
    from dql_pass.fusion import FuseDynamicQuantizeLinearPass

    proto = onnx.load(MLP)
    for rewrite, function in ((dql_pass.ExpandDynamicQuantizeLinearPass(), "expand"),
                              (FuseDynamicQuantizeLinearPass(), "fuse"), (dql_pass.LowerQuantizationPass(), "lower")):
        with pytest.raises(TypeError, match=rf"takes an onnx_ir Model, not ModelProto; use dql_pass.{function}\(\)"):
            rewrite(proto)


def test_every_pass_takes_a_target():
    assert dql_pass.ExpandDynamicQuantizeLinearPass(target="tract").variant == dql_pass.target_variant("tract")
    assert dql_pass.LowerQuantizationPass(target="tract").variant == dql_pass.target_variant("tract")
    with pytest.raises(dql_pass.InputError, match="not the one target tract gets"):
        dql_pass.ExpandDynamicQuantizeLinearPass(variant="quantizelinear", target="tract")


def test_results_print_short():
    from dql_pass.fusion import FuseDynamicQuantizeLinearPass

    model = ir.load(MLP)
    expanded = dql_pass.ExpandDynamicQuantizeLinearPass()(model)
    assert repr(expanded) == "ExpandResult(modified=True, sites={'main': 3})"
    assert repr(FuseDynamicQuantizeLinearPass()(model)) == "FuseResult(modified=True, fused=3)"
    assert repr(dql_pass.LowerQuantizationPass()(ir.load(MLP))).startswith("LowerResult(modified=True, lowered=")


def test_no_module_replaces_a_function_of_the_api():
    # Importing every submodule first: a module named like a function would replace it.
    code = ("import importlib, pkgutil, dql_pass\n"
            "for info in pkgutil.walk_packages(dql_pass.__path__, 'dql_pass.'):\n"
            "    if info.name not in ('dql_pass.__main__', 'dql_pass.onnxscript_bodies'):\n"
            "        importlib.import_module(info.name)\n"
            "import inspect\n"
            "bad = [n for n in dql_pass.__all__ if inspect.ismodule(getattr(dql_pass, n))]\n"
            "assert not bad, bad\n"
            "assert callable(dql_pass.verify) and dql_pass.verification.MAX_INPUT_BYTES > 0\n")
    _runs_clean(code)


# --- What still blocks a target -----------------------------------------------------------------------------------


def test_expand_for_a_target_that_lacks_an_op_of_the_model_exits_1_and_points_to_lower(tmp_path, capsys):
    # onnx2torch has no MatMulInteger: a stated lack, known whether onnx2torch is installed or not.
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), "--target", "onnx2torch"]) == 1
    err = capsys.readouterr().err
    assert "still blocks onnx2torch: MatMulInteger-10 does not run on onnx2torch" in err
    assert f"dql-pass lower {MLP} -o OUTPUT --target onnx2torch" in err


def test_expand_for_a_target_that_cannot_load_the_model_says_why(tmp_path, capsys):
    installed("openvino")
    # OpenVINO has no model-local functions: no lack names that, its loader does.
    out = tmp_path / "o.onnx"
    assert main(["expand", str(MODELS / "control_flow.onnx"), "-o", str(out), "--target", "openvino"]) == 1
    assert "still blocks openvino: openvino cannot load it: " in capsys.readouterr().err


def test_expand_for_a_target_that_runs_it_exits_0(tmp_path, capsys):
    installed("tract")
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx"), "--target", "tract"]) == 0
    assert "still blocks" not in capsys.readouterr().err


def test_expand_without_a_target_names_where_its_variant_is_exact(tmp_path, capsys):
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx")]) == 0
    assert "variant quantizelinear is the exact target of onnxruntime" in capsys.readouterr().err


def test_a_report_never_replaces_a_models_data_whatever_its_bytes(tmp_path, capsys):
    # Weights whose bytes read as a report of dql-pass were replaced.
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    text = b'{"command": "expand", "exit_code": 0}'
    weight = numpy_helper.from_array(np.frombuffer(text, np.uint8).copy(), "w")
    graph = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, [len(text)])], [weight])
    source = tmp_path / "in.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), source,
              save_as_external_data=True, location="w.json", size_threshold=0)
    data = tmp_path / "w.json"
    assert main(["expand", str(source), "-o", str(tmp_path / "out.onnx"), "--json", str(data)]) == 2
    assert "would overwrite the external data of the input model" in capsys.readouterr().err
    assert data.read_bytes() == text


def test_a_report_through_a_link_in_the_suite_is_still_in_the_suite(tmp_path, capsys):
    suite = tmp_path / "suite"
    assert main(["gen-tests", str(suite), "--opsets", "21", "--variants", "native", "--no-large", "-q"]) == 0
    outside = tmp_path / "outside.json"
    outside.write_text('{"command": "x", "exit_code": 0}')
    (suite / "r.json").symlink_to(outside)
    assert main(["run-tests", str(suite), "--json", str(suite / "r.json")]) == 2
    assert "would be written into the suite folder" in capsys.readouterr().err
    assert (suite / "r.json").is_symlink()
