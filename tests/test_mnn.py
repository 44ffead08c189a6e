"""The MNN adapter: its converter runs apart (no network, no writes outside its folder, a crash is a
refusal with a reason), its sessions survive MNN's crashes, ``--target mnn`` is bit-exact, and
``lower --target mnn`` leaves ConvInteger alone, as MNN's Conv is not exact on integers.

tests/test_runtimes.py checks the target on the catalogue and on inputs built apart, for every
installed runtime; the full matrix is ``python -m tools.runtimes --runtime mnn``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import installed, sample

import dql_pass
from dql_pass import inputs, runtimes
from dql_pass.compare import compare_site
from dql_pass.op import one_node_model
from dql_pass.reference import dynamic_quantize_linear
from dql_pass.runtimes import mnn

_F = np.float32
OPSET = 21


@pytest.fixture(scope="module")
def target_session() -> runtimes.Session:
    installed("mnn")
    return runtimes.get("mnn").load(dql_pass.expand(one_node_model(["n"], OPSET), target="mnn")[0])


def _model(tmp_path: Path, model: onnx.ModelProto) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def test_the_target_variant_is_exact_on_every_kind_of_input_built_apart(target_session):
    flat = [x.reshape(-1) for _, x in inputs.independent_inputs(300, seed=20)]
    differ = [i for i, x in enumerate(flat) if compare_site(target_session.run({"x": x}), dynamic_quantize_linear(x))]
    assert differ == []


def test_empty_outputs_of_any_shape_come_back():
    """MNN's read fails on an empty output of shape [2, 0]: the adapter builds it from its shape."""
    runtime = installed("mnn")
    session = runtime.load(dql_pass.expand(one_node_model(["a", "b"], OPSET), target="mnn")[0])
    for shape in [(2, 0), (0, 3)]:
        x = np.zeros(shape, _F)
        assert compare_site(session.run({"x": x}), dynamic_quantize_linear(x)) is None


def test_a_crash_of_mnn_fails_that_run_only():
    """MNN crashes on some inputs (an empty tensor into a reduction, after other runs): the run
    fails with the reason, and the next run gets a new worker."""
    import os
    import signal

    session = installed("mnn").load(dql_pass.expand(one_node_model(["n"], OPSET), target="mnn")[0])
    x = np.array([-1, 0.5, 3, 254.5], _F)
    # A crash in the middle of a run, as MNN's: the worker dies after the session last saw it alive.
    worker = session._worker
    os.kill(worker._process.pid, signal.SIGSEGV)
    worker._process.wait()
    worker._process.poll = lambda: None
    with pytest.raises(runtimes.RuntimeFailure, match=r"MNN crashed \(SIGSEGV\) on this input"):
        session.run({"x": x})
    assert compare_site(session.run({"x": x}), dynamic_quantize_linear(x)) is None


def test_a_crash_of_the_converter_is_a_refusal_with_its_reason():
    """QuantizeLinear with a run-time scale segfaults MNN's converter."""
    runtime = installed("mnn")
    with pytest.raises(runtimes.RuntimeFailure, match=r"converter crashed \(SIGSEGV\)"):
        runtime.load(dql_pass.expand(one_node_model(["n"], OPSET), variant="quantizelinear", runtime=None)[0])
    [lack] = runtimes.lacking("mnn", [("", "QuantizeLinear")], OPSET)
    assert "SIGSEGV" in lack.reason


def test_an_op_the_converter_lacks_is_named():
    with pytest.raises(runtimes.RuntimeFailure, match="ConvInteger"):
        installed("mnn").load(sample("conv_dynamic"))


def test_the_converter_never_imports_mnn_tools(tmp_path):
    """``import MNN.tools`` pip-installs a logging SDK and uploads usage logs; the worker calls ``_tools``."""
    installed("mnn")
    source = _model(tmp_path, one_node_model(["n"], OPSET))
    executable, *rest = mnn.worker_command("convert", str(source), str(tmp_path / "model.mnn"))
    done = subprocess.run([executable, "-X", "importtime", *rest], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "_tools" in imported
    assert [name for name in imported if name.startswith(("MNN", "aliyun", "urllib.request"))] == []


def test_the_conversion_reaches_no_network_and_writes_only_its_folder(tmp_path):
    """The converter under strace: no socket is opened, and every file opened for writing is in
    the folder it converts in; the input's bytes and times stay as they were."""
    installed("mnn")
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt-get install strace)")
    source = _model(tmp_path, dql_pass.expand(one_node_model(["n"], OPSET), target="mnn")[0])
    before = (source.read_bytes(), source.stat().st_mtime_ns)
    work = tmp_path / "work"
    work.mkdir()
    trace = tmp_path / "trace"
    subprocess.run(["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=%network,openat,creat,rename,unlink,mkdir",
                    *mnn.worker_command("convert", str(source), str(work / "model.mnn"))],
                   cwd=work, check=True, capture_output=True, timeout=300)
    calls = trace.read_text().splitlines()
    assert [c for c in calls if "socket(" in c or "connect(" in c] == []
    written = [c for c in calls if "openat(" in c and ("O_WRONLY" in c or "O_RDWR" in c or "O_CREAT" in c)]
    # Relative paths are in its working folder, ``work`` (the converter writes a scratch file there).
    paths = [c.split('"')[1] for c in written]
    assert paths and [p for p in paths if p.startswith("/") and not p.startswith((f"{work}/", "/dev/"))] == []
    assert (work / "model.mnn").is_file()
    assert (source.read_bytes(), source.stat().st_mtime_ns) == before


def test_the_conversion_runs_with_the_network_off(tmp_path):
    installed("mnn")
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode:
        pytest.skip("unshare -n is not available")
    source = _model(tmp_path, one_node_model(["n"], OPSET))
    subprocess.run(["unshare", "-n", *mnn.worker_command("convert", str(source), str(tmp_path / "model.mnn"))],
                   cwd=tmp_path, check=True, capture_output=True, timeout=300)
    assert (tmp_path / "model.mnn").is_file()


def test_lower_for_mnn_leaves_conv_integer_alone_and_lowers_matmul_integer():
    installed("mnn")
    _, report = dql_pass.lower(sample("conv_dynamic"), target="mnn")
    alone = {n.op_type: n.reason for n in report.left_alone}
    assert set(alone) == {"ConvInteger"} and "not exact on mnn" in alone["ConvInteger"]
    assert "MatMulInteger" in {n.op_type for n in report.lowered}
    assert "ConvInteger" in {lack.op_type for lack in report.lacking}
    _, report = dql_pass.lower(sample("conv_dynamic"))  # no target: lowered as before
    assert "ConvInteger" in {n.op_type for n in report.lowered}


def test_list_targets_says_what_lower_leaves_alone_for_mnn():
    from dql_pass.runtimes.listing import format_targets

    lines = format_targets(verbose=True).splitlines()
    assert any(line.startswith("  lower leaves ConvInteger alone: MNN's float32 Conv") for line in lines)


@pytest.mark.parametrize("weights", ["integer", "float"])
def test_the_lowered_mlp_runs_on_mnn_with_orts_bits(weights):
    """MatMul is exact on MNN's integer sums (kept as MatMul: the 1x1 Conv it would become is not),
    with the weights kept as int8 or stored as float32 (mnn's default: its converter folds them anyway)."""
    from tools import models

    runtime = installed("mnn")
    original = sample("mlp_dynamic")
    feeds = models.random_feeds(original, np.random.default_rng(0), size=2)
    expected = runtimes.get("onnxruntime").load(original).run(feeds)
    got = runtime.load(dql_pass.lower(original, target="mnn", weights=weights)[0]).run(feeds)
    assert [g.tobytes() for g in got] == [e.tobytes() for e in expected]


def test_matmul_near_two_to_the_24_is_exact_and_conv_is_not():
    """The measurements behind :attr:`Mnn.inexact_products`, on integer-valued float32 operands.
    At this size a MatMul by a constant that the converter turned into a 1x1 Conv was 1 off on
    146,880 of its 2,097,152 sums."""
    runtime = installed("mnn")
    rng = np.random.default_rng(0)
    x = np.where(rng.random((2048, 512)) < 0.5, -255, 255).astype(_F)
    w = np.where(rng.random((512, 1024)) < 0.5, -128, 127).astype(_F)
    x[:1024], w[:, :512] = 255, 127  # sums up to 255 * 127 * 512, just below 2^24
    exact = x.astype(np.float64) @ w.astype(np.float64)  # integers below 2^53: exact
    (got,) = runtime.load(_product("MatMul", w)).run({"x": x})
    assert np.array_equal(got, exact)
    x = rng.integers(-255, 256, (1, 16, 32, 32)).astype(_F)
    w = rng.integers(-128, 128, (32, 16, 3, 3)).astype(_F)
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.int64), (3, 3), axis=(2, 3))
    exact = np.einsum("nchwij,mcij->nmhw", windows, w.astype(np.int64))
    (got,) = runtime.load(_product("Conv", w)).run({"x": x})
    assert (got != exact).mean() > 0.5


def _product(op_type: str, w: np.ndarray) -> onnx.ModelProto:
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node(op_type, ["x", "w"], ["y"])], op_type,
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, None)],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])



def test_a_converter_or_worker_past_the_runtime_timeout_is_a_timeout_naming_the_option(monkeypatch, tmp_path):
    installed("mnn")
    model = dql_pass.expand(one_node_model(["n"], OPSET), target="mnn")[0]
    onnx.save(model, tmp_path / "m.onnx")
    mnn.convert(tmp_path / "m.onnx", tmp_path / "m.mnn")  # with the default limit, for the worker below
    monkeypatch.setattr(runtimes.get("mnn"), "timeout", 0.001)
    with pytest.raises(runtimes.RuntimeTimeout, match=r"^a timeout: MNN's converter did not finish in 0\.001 s; "
                       r"--runtime-timeout SECONDS gives it longer$"):
        runtimes.get("mnn").load(model)
    monkeypatch.setattr(mnn, "convert", lambda source, target, seconds: shutil.copy(tmp_path / "m.mnn", target))
    with pytest.raises(runtimes.RuntimeTimeout,
                       match=r"^a timeout: MNN did not answer within 0\.001 s loading the model; "):
        runtimes.get("mnn").load(model)
