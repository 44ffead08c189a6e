"""Bad input to the command line is one line, exit 2 and no traceback, and it is refused before it is
read to the end or waited on: arrays that declare more than they hold or than verify allows, a FIFO,
numbers that are not whole, an opset ORT cannot run, an onnxscript fuse cannot use, a model whose 4-bit
inputs or outputs ORT's Python binding cannot exchange with NumPy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from helpers import MODELS, assert_bad_input, dql_model, run_cli, session


def test_an_unsupported_onnxscript_is_one_line_for_fuse(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    # A fresh process: dql_pass.fusion checks onnxscript's version when it is first imported.
    code = ("import sys, onnxscript; onnxscript.__version__ = '0.9.0'; from dql_pass import cli; "
            f"sys.argv = ['dql-pass', 'fuse', {str(source)!r}, '-o', {str(tmp_path / 'o.onnx')!r}]; cli.run()")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert_bad_input(run, "onnxscript 0.9.0 is installed")


def test_an_npy_header_larger_than_its_file_is_one_line(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    header = tmp_path / "huge.npy"
    with open(header, "wb") as file:
        np.lib.format.write_array_header_1_0(file, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})
        file.write(bytes(16))
    assert_bad_input(run_cli("verify", source, source, "--input", f"x={header}"), "declares 4,000,000,000,000 bytes")


def test_a_sparse_npy_beyond_what_verify_allows_is_refused_before_it_is_read(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    sparse = tmp_path / "sparse.npy"
    with open(sparse, "wb") as file:  # a valid header over 8 GiB of holes: nothing is read
        np.lib.format.write_array_header_1_0(file, {"descr": "<f4", "fortran_order": False, "shape": (2**31,)})
        file.truncate(file.tell() + 4 * 2**31)
    assert_bad_input(run_cli("verify", source, source, "--input", f"x={sparse}"), "GiB verify allows")


def test_an_opset_ort_cannot_run_for_the_variant_is_refused_naming_one_it_can(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(28), source)
    assert_bad_input(run_cli("expand", source, "-o", tmp_path / "o.onnx"),
                     "the variant arithmetic or float64 or residual or portable or lean runs there")
    assert not (tmp_path / "o.onnx").exists()
    assert run_cli("expand", source, "-o", tmp_path / "o.onnx", "--variant", "arithmetic").returncode == 0
    session(onnx.load(tmp_path / "o.onnx"))


def test_an_input_array_that_is_a_fifo_is_refused_without_waiting(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    os.mkfifo(tmp_path / "x.npy")
    assert_bad_input(run_cli("verify", source, source, "--input", f"x={tmp_path / 'x.npy'}", timeout=60),
                     "not a regular file")


@pytest.mark.parametrize("option", [["--seed", "-1"], ["--samples", "-3"], ["--dim", "d0=\u00b2"]])
def test_numbers_that_are_not_whole_numbers_are_one_line(tmp_path, option):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    assert_bad_input(run_cli("verify", source, source, *option), "whole number")




def _four_bit_model(through_input: bool) -> onnx.ModelProto:
    """A DQL beside a 4-bit graph input (dequantized) or a 4-bit graph output (quantized)."""
    tensor, value = onnx.TensorProto, oh.make_tensor_value_info
    four_bit = (oh.make_node("DequantizeLinear", ["q", "s"], ["x"]) if through_input
                else oh.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]))
    q = value("q", tensor.INT4, [4])
    graph = oh.make_graph(
        [four_bit, oh.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"])], "four_bit",
        [q if through_input else value("x", tensor.FLOAT, [4])],
        [value("y", tensor.UINT8, [4]), value("y_scale", tensor.FLOAT, []), value("y_zero_point", tensor.UINT8, []),
         *([] if through_input else [q])],
        [oh.make_tensor("s", tensor.FLOAT, [], [0.5]), oh.make_tensor("z", tensor.INT4, [], [0])])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)])


@pytest.mark.parametrize("through_input, message", [
    (True, "onnxruntime cannot take input q (int4) from NumPy through its Python binding"),
    (False, "onnxruntime cannot give an output as NumPy through its Python binding"),
])
def test_a_4_bit_graph_value_that_ort_cannot_exchange_with_numpy_is_one_line(tmp_path, through_input, message):
    source = tmp_path / "m.onnx"
    onnx.save(_four_bit_model(through_input), source)
    assert_bad_input(run_cli("verify", source, source), f"ORT cannot run ORIGINAL: {message}")


def _not_installed() -> str:
    from dql_pass import runtimes

    missing = [name for name, runtime in runtimes.RUNTIMES.items() if not runtime.installed()]
    if not missing:
        pytest.skip("every runtime is installed here")
    return missing[0]


@pytest.mark.parametrize("options, message", [
    (["--dim", "batch=abc"], "the size must be a whole number, 0 or more, not 'abc'"),
    (["--dim", "nosuch=3"], "--dim nosuch: no input of ORIGINAL has a dimension named 'nosuch'"),
    (["--target", None], "is not installed"),
], ids=["dim size", "dim name", "target not installed"])
@pytest.mark.parametrize("command", ["expand", "lower"])
def test_what_verify_would_refuse_is_refused_before_the_output_is_written(tmp_path, command, options, message):
    source, output = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(oh.make_model(onnx.load(MODELS / "mlp_dynamic.onnx").graph), source)
    output.write_bytes(b"an older output")
    options = [option or _not_installed() for option in options]
    assert_bad_input(run_cli(command, source, "-o", output, "--verify", *options), message)
    assert output.read_bytes() == b"an older output"


@pytest.mark.parametrize("command", ["expand", "lower"])
def test_a_dim_that_targets_check_would_refuse_is_refused_before_the_output_is_written(tmp_path, command):
    source, output = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(oh.make_model(onnx.load(MODELS / "mlp_dynamic.onnx").graph), source)
    output.write_bytes(b"an older output")
    assert_bad_input(run_cli(command, source, "-o", output, "--target", "onnxruntime", "--dim", "nosuch=3"),
                     "--dim nosuch: no input of ORIGINAL has a dimension named 'nosuch'")
    assert output.read_bytes() == b"an older output"


def test_a_report_folder_that_cannot_be_written_is_refused_before_the_output_is_written(tmp_path, monkeypatch):
    source, output = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(dql_model(13), source)
    (tmp_path / "closed").mkdir()
    closed = (tmp_path / "closed").resolve()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != closed and access(path, mode, **kw))
    assert_bad_input(run_cli("expand", source, "-o", output, "--json", closed / "r.json"), "is not writable")
    assert not output.exists()


def test_a_missing_external_data_file_is_named_as_missing(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(onnx.load(MODELS / "mlp_dynamic.onnx"), source, save_as_external_data=True, location="m.data",
              size_threshold=0)
    (tmp_path / "m.data").unlink()
    assert_bad_input(run_cli("expand", source, "-o", tmp_path / "o.onnx"),
                     f"the external data file {tmp_path / 'm.data'} is missing")
    (tmp_path / "m.data").mkdir()
    assert_bad_input(run_cli("lower", source, "-o", tmp_path / "o.onnx"), "m.data is not a regular file")


@pytest.mark.parametrize("command", [
    ["expand", "{long}", "-o", "o.onnx"], ["fuse", "{long}", "-o", "o.onnx"], ["advise", "{long}"],
    ["verify", "{model}", "{long}"], ["gen-tests", "{long}"], ["run-tests", "{long}"],
])
def test_a_path_part_past_the_systems_limit_is_one_line(tmp_path, monkeypatch, command):
    """A name of 256 bytes: the system refuses it (ENAMETOOLONG) wherever a command first looks at it."""
    monkeypatch.chdir(tmp_path)
    long = "a" * 256
    run = run_cli(*(part.format(long=long, model=MODELS / "mlp_dynamic.onnx") for part in command))
    assert_bad_input(run, long)


def test_more_input_sets_than_verify_can_hold_are_refused_before_one_is_made(tmp_path):
    """10^8 sets of a small input: refused by their count at once (it made a label for each first, 7 GiB and on)."""
    rewritten = tmp_path / "r.onnx"
    assert run_cli("expand", MODELS / "mlp_dynamic.onnx", "-o", rewritten).returncode == 0
    run = run_cli("verify", MODELS / "mlp_dynamic.onnx", rewritten, "--samples", "100000000", timeout=20)
    assert_bad_input(run, "(100,000,004 input sets")


@pytest.mark.parametrize("options, message", [
    (["--dim", "batch=2", "--dim", "batch=3"], "--dim batch is given twice (2 and 3)"),
    (["--input", "input={array}", "--dim", "batch=5"], "dims['batch'] = 5, but the given input arrays have batch = 2"),
])
def test_sizes_given_two_ways_that_disagree_are_refused(tmp_path, options, message):
    """They were taken silently: the last --dim won, and a --dim that a given array contradicts did nothing."""
    array = tmp_path / "x.npy"
    np.save(array, np.ones((2, 64), np.float32))
    rewritten = tmp_path / "r.onnx"
    assert run_cli("expand", MODELS / "mlp_dynamic.onnx", "-o", rewritten).returncode == 0
    run = run_cli("verify", MODELS / "mlp_dynamic.onnx", rewritten, *(o.format(array=array) for o in options))
    assert_bad_input(run, message)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a limit on file sizes set by setrlimit: Linux")
def test_a_data_file_cut_short_says_what_ran_out(tmp_path):
    """numpy's short write said only "8192 requested and 1760 written", on a full disk as under `ulimit -f`
    (Python ignores SIGXFSZ: the write fails with EFBIG, here in this process)."""
    import resource

    source = tmp_path / "m.onnx"
    onnx.save_model(onnx.load(MODELS / "mlp_dynamic.onnx"), source, save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, limits[1]))
    try:
        run = run_cli("lower", source, "-o", tmp_path / "out.onnx", "--weights", "float")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
    assert_bad_input(run, "the disk is full, or a limit on the size of files was reached (8192 requested and ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


def test_a_negative_external_data_offset_is_named(tmp_path):
    """onnx_ir wraps its reason in "Error calling _deserialize_graph with: mlp", which named only the graph."""
    source = tmp_path / "m.onnx"
    onnx.save_model(onnx.load(MODELS / "mlp_dynamic.onnx"), source, save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    model = onnx.load(source, load_external_data=False)
    entries = {entry.key: entry for entry in model.graph.initializer[0].external_data}
    if "offset" in entries:
        entries["offset"].value = "-5"
    else:
        model.graph.initializer[0].external_data.add(key="offset", value="-5")
    onnx.save(model, source)
    run = run_cli("expand", source, "-o", tmp_path / "out.onnx")
    assert_bad_input(run, "cannot load the model: ")
    assert "offset" in run.stderr and "-5" in run.stderr and "_deserialize_graph" not in run.stderr
