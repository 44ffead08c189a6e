"""The LiteRT runtimes (onnx2tf in an environment of its own, then ai-edge-litert): a missing piece
is one line saying what to do; the converter reaches no network, starts no process (pip among
them), never writes the model it is given, and its refusals, crashes and hangs are the runtime's
refusals. What needs the converter is skipped where it is not set up: CI leaves it out
(tests/helpers.py says why); ``python -m tools.runtimes --runtime litert --runtime
litert-xnnpack`` measures the whole catalogue."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import MODELS, Result, installed, run_cli

import dql_pass
from dql_pass import inputs, runtimes
from dql_pass.compare import compare_site
from dql_pass.op import one_node_model
from dql_pass.reference import dynamic_quantize_linear
from dql_pass.runtimes import isolated, litert
from dql_pass.runtimes.litert import __main__ as litert_command

_F = np.float32


def _check_or_setup(command: str, capsys: pytest.CaptureFixture[str]) -> Result:
    """``python -m dql_pass.runtimes.litert COMMAND`` in this process."""
    code = litert_command.main([command])
    out, err = capsys.readouterr()
    return Result(code, out, err)


def _one_line(run: Result) -> str:
    """The one line of a refusal: exit 2, no traceback."""
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
    return run.stderr


def test_without_the_converter_check_and_verify_say_what_to_do_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(litert.CACHE_VARIABLE, str(tmp_path))
    line = _one_line(_check_or_setup("check", capsys))
    assert "pip install 'dql_pass[litert]'" in line or litert.SETUP in line
    model = MODELS / "relu_dql.onnx"
    line = _one_line(run_cli("verify", model, model, "--runtime", "litert"))
    assert "litert" in line and ("dql_pass[litert]" in line or litert.SETUP in line)


def test_setup_without_a_python_new_enough_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(litert.CACHE_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setenv("DQL_PASS_LITERT_PYTHON", str(tmp_path / "no-python"))
    line = _one_line(_check_or_setup("setup", capsys))
    assert "Python >= 3.12" in line and "DQL_PASS_LITERT_PYTHON" in line
    assert not any((tmp_path / "cache").glob("onnx2tf-*"))


def test_the_converter_process_can_connect_nowhere_and_start_nothing():
    """The converter's audit hook, installed before onnx2tf is imported: a connection to a server
    that listens is refused before it leaves, and so is every new process (pip's too)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        script = textwrap.dedent(f"""
            import os, socket, subprocess, sys
            sys.path.insert(0, {str(Path(litert.__file__).parent)!r})
            import convert
            sys.addaudithook(convert._refuse)
            attempts = {{
                "connect": lambda: socket.create_connection(("127.0.0.1", {port}), timeout=5),
                "resolve": lambda: socket.getaddrinfo("localhost", 80),
                "pip": lambda: subprocess.run([sys.executable, "-m", "pip", "--version"]),
                "system": lambda: os.system("true"),
            }}
            for what, attempt in attempts.items():
                try:
                    attempt()
                    print(what, "went through")
                except PermissionError:
                    print(what, "refused")
        """)
        done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60)
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing arrived
    assert done.stdout.split("\n")[:-1] == ["connect refused", "resolve refused", "pip refused", "system refused"], done


def _portable(shape) -> onnx.ModelProto:
    return dql_pass.expand(one_node_model(list(shape), 21), variant="portable", runtime=None)[0]


def test_the_conversion_runs_in_a_network_namespace_of_its_own(monkeypatch):
    """Where the system allows one, the converter runs with no network at all: from inside, a
    server on this machine's loopback cannot be reached; the conversion works there."""
    installed("litert")
    prefix = isolated.network_off()
    if not prefix:
        pytest.skip("this system allows no network namespace (unshare --net): the audit hook alone guards")
    with socket.create_server(("127.0.0.1", 0)) as server:
        probe = f"import socket; socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), timeout=5)"
        assert subprocess.run([*prefix, sys.executable, "-c", probe], capture_output=True).returncode != 0
    commands = []
    run = subprocess.run
    monkeypatch.setattr(litert.subprocess, "run", lambda command, **kw: commands.append(command) or run(command, **kw))
    litert._converted.clear()
    x = np.array([-1.5, 0.25, 3.0], _F)
    got = runtimes.get("litert").load(_portable(["n"])).run({"x": x})
    assert compare_site(got, dynamic_quantize_linear(x)) is None
    assert [command[:len(prefix)] for command in commands] == [list(prefix)]


def test_the_model_given_and_its_folder_are_never_written(tmp_path, monkeypatch):
    installed("litert")
    path = tmp_path / "model.onnx"
    onnx.save(_portable(["n"]), path)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    handed = []
    convert = litert.convert
    monkeypatch.setattr(litert, "convert", lambda p, timeout: handed.append(p) or convert(p, timeout))
    litert._converted.clear()
    x = np.linspace(-3, 7, 5, dtype=_F)
    assert compare_site(runtimes.get("litert").load(path).run({"x": x}), dynamic_quantize_linear(x)) is None
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()} == before
    assert len(handed) == 1 and tmp_path not in handed[0].parents  # the converter got a copy


def test_a_converter_that_hangs_or_crashes_is_a_refusal_and_the_session_runs_on(monkeypatch, tmp_path):
    installed("litert")
    litert._converted.clear()
    session = runtimes.get("litert").load(_portable(["n"]))
    monkeypatch.setattr(runtimes.get("litert"), "conversion_timeout", 0.01)
    with pytest.raises(runtimes.RuntimeTimeout,
                       match="did not finish in 0.01 s; --runtime-timeout SECONDS gives it longer"):
        session.run({"x": np.ones(3, _F)})
    monkeypatch.undo()
    crash = tmp_path / "crash.py"
    crash.write_text("import os\nos.abort()\n")
    monkeypatch.setattr(litert, "_WORKER", crash)
    with pytest.raises(runtimes.RuntimeFailure, match="did not convert the model: signal 6") as failure:
        session.run({"x": np.ones(4, _F)})
    assert str(failure.value).startswith("onnx2tf")  # the adapter's line as it is, not re-wrapped
    monkeypatch.undo()
    x = np.array([2.0, -1.0, 0.5], _F)
    assert compare_site(session.run({"x": x}), dynamic_quantize_linear(x)) is None


def test_an_op_onnx2tf_cannot_make_is_a_refusal_in_one_line():
    installed("litert")
    unknown = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Mystery", ["x"], ["y"], domain="example.org")], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
    ), opset_imports=[onnx.helper.make_opsetid("", 21), onnx.helper.make_opsetid("example.org", 1)])
    # onnx2tf makes it a custom op, which LiteRT cannot resolve.
    with pytest.raises(runtimes.RuntimeFailure, match="unresolved custom op: ONNX_MYSTERY"):
        runtimes.get("litert").load(unknown).run({"x": np.ones(3, _F)})


def test_scalars_keep_rank_0_and_empty_inputs_run_on_both():
    installed("litert")
    for name in ("litert", "litert-xnnpack"):
        for x in (np.array(-0.75, _F), np.zeros((2, 0, 3), _F)):
            got = runtimes.get(name).load(_portable([None] * x.ndim)).run({"x": x})
            assert compare_site(got, dynamic_quantize_linear(x)) is None, (name, x.shape)
            assert got[0].shape == x.shape and got[1].shape == ()


def test_an_overflowing_range_is_a_class_of_its_own():
    names = [c.name for c in inputs.cases() if c.comparable and "range overflows" in c.classes("onnxruntime")]
    assert names == ["range_overflow", "range_overflow_mixed"]
    assert "range overflows" not in inputs.input_classes(np.array([np.inf, 1.0], _F), "onnxruntime")


def test_xnnpack_flushes_subnormals_where_the_builtin_kernels_do_not():
    """The measured difference that makes two runtimes of one LiteRT: the same .tflite, one delegate."""
    installed("litert")
    x = next(c.x for c in inputs.cases() if c.name == "subnormal_scale")
    expected = dynamic_quantize_linear(x)
    assert compare_site(runtimes.get("litert").load(_portable(["n"])).run({"x": x}), expected) is None
    assert compare_site(runtimes.get("litert-xnnpack").load(_portable(["n"])).run({"x": x}), expected) is not None
    assert runtimes.get("litert-xnnpack").differences(x, "portable", "onnxruntime")


@pytest.mark.parametrize("name", ["litert", "litert-xnnpack"])
def test_the_lowered_sample_cnn_gives_ort_s_bits_on_the_original(name, tmp_path):
    installed(name)
    from tools import models

    original = onnx.load(MODELS / "conv_dynamic.onnx")
    lowered, _ = dql_pass.lower(original, target=name)
    feeds = models.random_feeds(original, np.random.default_rng(0), size=2)
    expected = runtimes.get("onnxruntime").load(original).run(feeds)
    for got, want in zip(runtimes.get(name).load(lowered).run(feeds), expected):
        assert got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
