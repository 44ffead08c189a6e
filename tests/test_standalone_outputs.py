"""Outputs stand alone by default: the output and the data file written for it are all it needs,
wherever it is written; ``--share-data`` (``share_data=True``) refers to the input's data files
instead, and the output line says so."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import assert_outputs_bits_equal
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import runtimes
from dql_pass.cli import main
from dql_pass.files import models

ORT = runtimes.get("onnxruntime")
FEEDS = {"x": np.random.default_rng(7).standard_normal((2, 64)).astype(np.float32)}


def _model(folder: Path, bias: bool = True) -> Path:
    """DQL -> MatMulInteger (uint8 weights) -> Cast -> Mul -> Add of a float bias: every tensor
    in the input's data file, and the bias one that lower keeps (without ``bias``, none)."""
    rng = np.random.default_rng(1)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "scale", "zp"]),
        helper.make_node("MatMulInteger", ["q", "W", "zp", "W_zp"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["accf", "scale"], ["y0" if bias else "y"]),
    ]
    weights = [numpy_helper.from_array(rng.integers(0, 256, (64, 32)).astype(np.uint8), "W"),
               numpy_helper.from_array(np.array(128, np.uint8), "W_zp")]
    if bias:
        nodes.append(helper.make_node("Add", ["y0", "bias"], ["y"]))
        weights.append(numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "bias"))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])],
        weights)
    path = folder / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path,
              save_as_external_data=True, all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    return path


def _locations(path: Path) -> set[str]:
    return {t.location for t in models.external_tensors(ir.load(path))}


def _run(path: Path) -> list[np.ndarray]:
    return ORT.load(path, threads=1, optimize="basic").run(FEEDS)


@pytest.mark.parametrize("command", ["lower", "expand"])
def test_an_output_beside_its_input_runs_after_the_input_and_its_data_are_gone(tmp_path, command, capsys):
    """Moved elsewhere with its data file, the input and its data deleted: it loads and gives the
    same bits (before, it referred to m.onnx.data, and ORT refused it)."""
    source = _model(tmp_path)
    expected = _run(source)
    output = tmp_path / "m.out.onnx"
    assert main([command, str(source), "-o", str(output)]) == 0
    assert "data file" not in capsys.readouterr().out
    locations = _locations(output)
    assert locations and all(location.startswith("m.out.onnx.") for location in locations), locations
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for location in locations:
        shutil.move(tmp_path / location, moved / location)
    shutil.move(output, moved / output.name)
    source.unlink()
    (tmp_path / "m.onnx.data").unlink()
    assert_outputs_bits_equal(_run(moved / output.name), expected)


@pytest.mark.parametrize("command", ["expand", "lower", "fuse"])
def test_share_data_refers_to_the_inputs_data_file_and_says_so(tmp_path, command, capsys):
    source = _model(tmp_path)
    output = tmp_path / "m.out.onnx"
    assert main([command, str(source), "-o", str(output), "--share-data", "--json", str(tmp_path / "r.json")]) == 0
    assert "m.onnx.data" in _locations(output)
    assert f"{output} refers to the input's data file m.onnx.data (--share-data)" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["shared_data"] == ["m.onnx.data"]
    assert_outputs_bits_equal(_run(output), _run(source))


def test_share_data_in_another_folder_copies_and_says_nothing_is_shared(tmp_path, capsys):
    source = _model(tmp_path)
    (tmp_path / "out").mkdir()
    output = tmp_path / "out" / "m.out.onnx"
    assert main(["expand", str(source), "-o", str(output), "--share-data"]) == 0
    assert all(location.startswith("m.out.onnx.") for location in _locations(output))
    assert f"{output} stands alone: --share-data shares only" in capsys.readouterr().out


def test_the_api_shares_only_when_asked(tmp_path):
    source = _model(tmp_path)
    dql_pass.lower_file(source, tmp_path / "a.onnx")
    dql_pass.lower_file(source, tmp_path / "b.onnx", share_data=True)
    dql_pass.fuse_file(source, tmp_path / "c.onnx", share_data=True)
    assert "m.onnx.data" not in _locations(tmp_path / "a.onnx")
    assert "m.onnx.data" in _locations(tmp_path / "b.onnx")
    assert "m.onnx.data" in _locations(tmp_path / "c.onnx")


@pytest.mark.skipif(os.name != "posix", reason="permission bits")
@pytest.mark.parametrize("rewrite", [dql_pass.expand_file, dql_pass.lower_file], ids=["expand", "lower"])
def test_the_data_file_written_beside_the_input_takes_the_inputs_permission_bits(tmp_path, rewrite):
    """Private weights stay private: the copy beside the input is as closed as the input's data, and
    so are lower's float32 weights made from it when nothing of the input's data file is left."""
    source = _model(tmp_path, bias=rewrite is dql_pass.expand_file)
    os.chmod(source, 0o640)
    os.chmod(tmp_path / "m.onnx.data", 0o600)
    output = tmp_path / "m.out.onnx"
    rewrite(source, output)
    (location,) = _locations(output)
    assert location.startswith("m.out.onnx.") and stat.S_IMODE(os.stat(tmp_path / location).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(output).st_mode) == 0o640


@pytest.mark.parametrize("command", ["expand", "lower", "fuse"])
@pytest.mark.parametrize("share", ["no", "beside", "elsewhere"])
def test_the_shared_data_line_and_json_key_of_each_command(tmp_path, command, share, capsys):
    """The output's shared data in the text (a line of its own with --share-data, none without) and
    in --json (``shared_data``, the last key; input, output and seconds come first after the command's)."""
    source = _model(tmp_path)
    folder = tmp_path / "out" if share == "elsewhere" else tmp_path
    folder.mkdir(exist_ok=True)
    output, report = folder / "m.out.onnx", tmp_path / "r.json"
    flags = [] if share == "no" else ["--share-data"]
    assert main([command, str(source), "-o", str(output), *flags, "--json", str(report)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(str(output))]
    expected = {
        "no": [],
        "beside": [f"{output} refers to the input's data file m.onnx.data (--share-data): it needs it where it is"],
        "elsewhere": [f"{output} stands alone: --share-data shares only the input's data files in the output's "
                      "folder, and this output keeps none"],
    }[share]
    assert lines == expected
    held = json.loads(report.read_text())
    keys = list(held)
    assert keys[2:5] == ["input", "output", "seconds"] and keys[-1] == "shared_data", keys
    assert held["shared_data"] == (["m.onnx.data"] if share == "beside" else [])
    if command == "lower":  # the footprint: the nodes, and the bytes of the model and its data files on disk
        size = lambda path: path.stat().st_size + sum((path.parent / name).stat().st_size  # noqa: E731
                                                      for name in _locations(path))
        nodes = lambda path: len(onnx.load(path, load_external_data=False).graph.node)  # noqa: E731 (one graph)
        footprint = (nodes(source), nodes(output), size(source), size(output))
        assert (held["nodes_before"], held["nodes_after"], held["bytes_before"], held["bytes_after"]) == footprint


@pytest.mark.parametrize("share", ["no", "beside", "elsewhere", "one file"])
def test_save_model_gives_the_data_files_the_written_model_refers_to(tmp_path, share):
    """What save_model says the output refers to is what the written model refers to: its own new
    data file, the input's with share_data beside the input, none for a model written in one file."""
    source = _model(tmp_path)
    folder = tmp_path / "out" if share == "elsewhere" else tmp_path
    folder.mkdir(exist_ok=True)
    output = folder / "m.out.onnx"
    if share == "one file":  # the weights held in memory
        given = dql_pass.save_model(ir.serde.deserialize_model(onnx.load(source)), output)
    else:
        given = dql_pass.save_model(dql_pass.load_model(source), output, source=source, external=True,
                                    share_data=share != "no")
    assert given == {os.path.realpath(tensor.path) for tensor in models.external_tensors(models.read_model(output))}
    if share == "beside":
        assert given == {os.path.realpath(tmp_path / "m.onnx.data")}
    else:
        assert [Path(file).name.startswith("m.out.onnx.") for file in given] == ([] if share == "one file" else [True])
