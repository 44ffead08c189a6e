"""The dql-pass command line: what it prints, its exit codes, and that nothing is ever lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import MODELS, digest, dql_model
from onnx import TensorProto, helper

from dql_pass.cli import main

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
    run = subprocess.run([str(CONSOLE_SCRIPT), "expand", str(MODELS / "mlp_dynamic.onnx"), "-o", str(tmp_path / "o.onnx"),
                          "--variant", "arithmetic", "--mode", "function"], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert "expanded 3 DynamicQuantizeLinear (variant arithmetic, mode function" in run.stdout


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
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dql-pass: error: ") and message in err, err
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


def test_no_traceback_from_a_real_process(tmp_path):
    run = subprocess.run([sys.executable, "-m", "dql_pass", "expand", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "o.onnx")],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 2 and "Traceback" not in run.stderr and run.stderr.count("\n") == 1


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
