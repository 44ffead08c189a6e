"""dql_pass.advise and `dql-pass advise`: per runtime, what a model needs that the runtime lacks,
and the command that gives it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import onnx
from helpers import MODELS, dql_model, with_custom_op

import dql_pass
from dql_pass import runtimes
from dql_pass.cli import main

MLP = MODELS / "mlp_dynamic.onnx"
CONV = MODELS / "conv_dynamic.onnx"
README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def _rows(advice: dql_pass.Advice) -> dict[str, dql_pass.advice.RuntimeAdvice]:
    return {row.runtime: row for row in advice.runtimes}


def test_every_runtime_gets_an_answer_with_or_without_an_adapter():
    rows = _rows(dql_pass.advise(MLP, load=False))
    assert set(rows) == {*runtimes.RUNTIMES, *runtimes.ELSEWHERE}
    for name in runtimes.ELSEWHERE:
        row = rows[name]
        assert not row.adapter and row.command == f"dql-pass lower {MLP} -o {MODELS / 'mlp_dynamic.float.onnx'}", row
        assert any("source: " in note for note in row.notes)


def test_every_runtime_the_readme_names_is_one_advise_knows():
    known = {*runtimes.RUNTIMES, *runtimes.ELSEWHERE}
    for name in ("TensorRT", "CoreML", "QNN", "candle", "burn", "onnx2torch", "WebGPU", "CUDA"):
        assert name in README
        assert any(name.lower() in key for key in known), name


def test_the_command_follows_what_the_runtime_lacks():
    rows = _rows(dql_pass.advise(CONV, ["onnxruntime", "wasm", "tract", "tvm", "webgpu", "mnn", "tensorrt"],
                                 load=False))
    assert rows["onnxruntime"].command is None and rows["onnxruntime"].needs == []
    assert rows["wasm"].command is None
    # tract runs the integer ops, but its own DQL is not ORT's on some inputs: its variant is the fix.
    assert rows["tract"].command == f"dql-pass expand {CONV} -o {MODELS / 'conv_dynamic.tract.onnx'} --target tract"
    # tvm has no ConvInteger, webgpu runs them on the CPU: lower, for the target.
    assert rows["tvm"].command == f"dql-pass lower {CONV} -o {MODELS / 'conv_dynamic.tvm.onnx'} --target tvm"
    assert any(need.startswith("ConvInteger-10 does not run on tvm") for need in rows["tvm"].needs)
    assert rows["webgpu"].command.endswith("--target webgpu") and "lower" in rows["webgpu"].command
    assert "2 ConvInteger run on the CPU, not on webgpu" in rows["webgpu"].needs[0]
    # mnn: lower leaves ConvInteger alone there (its Conv is not exact), and says so.
    assert any(note.startswith("lower leaves ConvInteger alone on mnn") for note in rows["mnn"].notes)
    assert rows["tensorrt"].needs[0].startswith("3 DynamicQuantizeLinear, 1 MatMulInteger, 2 ConvInteger: ")


def test_a_model_with_only_a_dql_needs_expand_for_webgpu_and_lower_elsewhere(tmp_path):
    path = tmp_path / "dql.onnx"
    onnx.save(dql_model(21), path)
    advice = dql_pass.advise(path, ["tensorrt", "webgpu", "wasm"], load=False)
    assert advice.ops == {"DynamicQuantizeLinear": 1}
    rows = _rows(advice)
    assert rows["tensorrt"].command == f"dql-pass lower {path} -o {tmp_path / 'dql.float.onnx'}"
    assert rows["webgpu"].command == f"dql-pass expand {path} -o {tmp_path / 'dql.webgpu.onnx'} --target webgpu"
    assert rows["wasm"].command is None


def test_a_real_load_where_installed_is_reported():
    row = _rows(dql_pass.advise(CONV, ["reference"]))["reference"]  # named: loaded and run
    assert row.loaded is True
    assert "loaded on reference: it loads and runs" in dql_pass.advise(CONV, ["reference"]).format()


def test_a_need_no_command_meets_is_not_nothing_to_run(tmp_path):
    """A model with an op of an unknown domain: ORT refuses it, and no dql-pass command changes that."""
    onnx.save(with_custom_op(dql_model(13), "y_scale"), tmp_path / "m.onnx")
    text = dql_pass.advise(tmp_path / "m.onnx", ["onnxruntime"]).format()
    assert "onnxruntime  no dql-pass command meets what it needs" in text and "cannot load it" in text, text


def test_the_command_line_prints_the_report_and_writes_json(tmp_path, capsys):
    report = tmp_path / "advice.json"
    assert main(["advise", str(MLP), "--runtime", "tensorrt", "--runtime", "webgpu", "--no-load", "--json",
                 str(report)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{MLP}: 3 DynamicQuantizeLinear, 3 MatMulInteger"
    assert re.match(r"tensorrt +dql-pass lower .* -o .*mlp_dynamic\.float\.onnx$", out[1])
    held = json.loads(report.read_text())
    assert held["command"] == "advise" and held["exit_code"] == 0
    assert [row["runtime"] for row in held["runtimes"]] == ["tensorrt", "webgpu"]


def test_an_unknown_runtime_is_bad_input(capsys):
    assert main(["advise", str(MLP), "--runtime", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown runtime 'nosuch'" in err and "tensorrt" in err


def test_expand_without_a_target_points_to_advise(tmp_path, capsys):
    assert main(["expand", str(MLP), "-o", str(tmp_path / "o.onnx")]) == 0
    assert f"or `dql-pass advise {MLP}`" in capsys.readouterr().err


def test_a_suggested_command_runs_as_printed_for_a_path_with_spaces_and_quotes(tmp_path):
    import shlex

    path = tmp_path / "my model's.onnx"
    onnx.save(dql_model(21), path)
    rows = _rows(dql_pass.advise(path, ["tensorrt", "reference"], load=False))  # no browser to start
    for row in rows.values():
        argv = shlex.split(row.command)
        assert argv[:3] == ["dql-pass", argv[1], str(path)], row.command
        assert main([*argv[1:], "-q"]) in (0, 1)  # 1: something may still block the target
        assert Path(argv[4]).is_file()
