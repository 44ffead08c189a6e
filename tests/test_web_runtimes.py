"""The web runtimes (onnxruntime-web in headless Chromium): a few catalogue inputs through their
targets, tensors of every kind passed as their bits, a hung or failed run followed by a good one,
the copy the browser gets, where the nodes ran, and one line for a missing piece.

SwiftShader is slow, so this is a subset; tests/test_runtimes.py runs the whole catalogue on them
with ``pytest -m web``. Without the setup, the browser tests skip naming the setup command.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
import pytest
from helpers import digest, short_tmpdir
from onnx import TensorProto, helper

import dql_pass
from dql_pass import inputs, runtimes
from dql_pass.compare import compare_site
from dql_pass.op import one_node_model
from dql_pass.reference import dynamic_quantize_linear
from dql_pass.runtimes import web
from dql_pass.runtimes.web import session as web_session

_F = np.float32
WEB = ["webgpu", "wasm"]
needs_browser = pytest.mark.skipif(web.missing() is not None,
                                   reason=f"the web runtimes are not set up: {web.missing()}")
# A few of each kind the catalogue has, of rank 1 (a browser and a model load per rank): ties,
# reciprocal traps, zeros, an empty tensor, a subnormal scale, infinities, random values.
SUBSET = ("spec_example", "tie_zero_point_odd", "tie_reciprocal_trap", "zeros", "empty", "subnormal_scale",
          "negative_inf_mixed", "random_4")


def _model(*nodes, inputs, outputs, opset: int = 21) -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@functools.cache
def _session(name: str, form: str, rank: int) -> runtimes.Session:
    model = one_node_model([f"d{i}" for i in range(rank)], 21)
    return runtimes.get(name).load(model if form == "native" else dql_pass.expand(model, variant=form, runtime=None)[0])


def test_the_subset_names_catalogue_cases():
    assert set(SUBSET) <= {case.name for case in inputs.cases()}


@needs_browser
@pytest.mark.parametrize("name", WEB)
@pytest.mark.parametrize("form", ["target", "native"])
def test_a_subset_of_the_catalogue_is_exact_or_a_known_difference(name, form):
    runtime = runtimes.get(name)
    form = runtime.variant if form == "target" else form
    unexplained = []
    for case in (c for c in inputs.cases() if c.name in SUBSET):
        try:
            diff = compare_site(_session(name, form, case.x.ndim).run({"x": case.x}), dynamic_quantize_linear(case.x))
        except runtimes.RuntimeFailure as error:
            diff = error
        if diff is not None and not runtime.differences(case.x, form, "onnxruntime"):
            unexplained.append(f"{case.name}: {diff}")
    assert unexplained == []


@needs_browser
def test_a_known_difference_of_webgpu_shows_on_the_subset():
    """An empty tensor through quantizelinear: WebGPU's reductions refuse it (the run fails), wasm's do not."""
    x = np.zeros((0,), _F)
    with pytest.raises(runtimes.RuntimeFailure, match="reduction"):
        _session("webgpu", "quantizelinear", 1).run({"x": x})
    assert runtimes.get("webgpu").differences(x, "quantizelinear", "onnxruntime")
    assert compare_site(_session("wasm", "quantizelinear", 1).run({"x": x}), dynamic_quantize_linear(x)) is None


_KINDS = {
    # float32 bits that a conversion through a number would change: a NaN payload, -0, a subnormal.
    TensorProto.FLOAT: np.array([0x7FC00011, 0x80000000, 0x00000001, 0xFF800000, 0x7F7FFFFF], np.uint32).view(_F),
    TensorProto.UINT8: np.array([0, 1, 127, 128, 255], np.uint8),
    TensorProto.INT8: np.array([-128, -1, 0, 127], np.int8),
    TensorProto.INT32: np.array([-(2**31), -1, 2**31 - 1], np.int32),
    TensorProto.INT64: np.array([-(2**63), 2**53 + 1, 2**63 - 1], np.int64),
    TensorProto.DOUBLE: np.array([np.pi, 2.0**-1074, -0.0]),
    TensorProto.BOOL: np.array([True, False, True]),
}


@needs_browser
@pytest.mark.parametrize("name", WEB)
def test_tensors_pass_as_their_bits_and_type(name):
    """Identity of every kind comes back as the same bytes, dtype and shape: 0-d and empty tensors
    too, and a view that is not contiguous."""
    kinds = dict(_KINDS)
    if name == "webgpu":  # the /webgpu build's CPU provider has no double
        del kinds[TensorProto.DOUBLE]
    nodes, inputs, outputs, feeds = [], [], [], {}
    for kind, values in kinds.items():
        for shape in [(5,), (), (0,), (2, 0), (3, 2)]:
            if shape == (3, 2):
                x = np.resize(values, (2, 3)).astype(values.dtype).T
            else:
                x = np.resize(values, shape).astype(values.dtype)
            i, o = f"x{kind}_{len(feeds)}", f"y{kind}_{len(feeds)}"
            nodes.append(helper.make_node("Identity", [i], [o]))
            inputs.append(helper.make_tensor_value_info(i, kind, list(shape)))
            outputs.append(helper.make_tensor_value_info(o, kind, list(shape)))
            feeds[i] = x
    got = runtimes.get(name).load(_model(*nodes, inputs=inputs, outputs=outputs)).run(feeds)
    for x, y in zip(feeds.values(), got):
        assert (y.dtype, y.shape, y.tobytes()) == (x.dtype, x.shape, x.tobytes())


def _loop_model() -> onnx.ModelProto:
    """y = x + n: a Loop of n iterations that adds 1; a huge n does not end in any reasonable time."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond"], ["cond_out"]), helper.make_node("Add", ["v", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )
    return _model(
        helper.make_node("Constant", [], ["true"], value=helper.make_tensor("true", TensorProto.BOOL, [], [True])),
        helper.make_node("Loop", ["n", "true", "x"], ["y"], body=body),
        inputs=[helper.make_tensor_value_info("n", TensorProto.INT64, []),
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )


@needs_browser
def test_a_run_that_hangs_times_out_and_the_next_run_gets_a_fresh_browser(monkeypatch):
    runtime = runtimes.get("wasm")
    monkeypatch.setattr(runtime, "run_timeout", 3)
    session = runtime.load(_loop_model())
    one = np.ones(1, _F)
    assert session.run({"n": np.array(2, np.int64), "x": one})[0].tolist() == [3.0]
    first = session.browser_pid
    with pytest.raises(runtimes.RuntimeFailure, match="within 3 s"):
        session.run({"n": np.array(2**62, np.int64), "x": one})
    assert session.run({"n": np.array(4, np.int64), "x": one})[0].tolist() == [5.0]
    assert session.browser_pid != first


@needs_browser
@pytest.mark.parametrize("name", WEB)
def test_a_failed_run_is_the_runtimes_refusal_and_the_next_run_starts_afresh(name):
    model = _model(
        helper.make_node("Add", ["x", "w"], ["y"]),
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.arange(3, dtype=_F), "w"))
    session = runtimes.get(name).load(model)
    first = session.browser_pid
    with pytest.raises(runtimes.RuntimeFailure):
        session.run({"x": np.ones(4, _F)})  # 4 and 3 do not broadcast
    assert session.run({"x": np.ones(3, _F)})[0].tolist() == [1.0, 2.0, 3.0]
    assert session.browser_pid != first
    with pytest.raises(runtimes.RuntimeFailure, match="the model takes inputs it was not given: x"):
        session.run({})


@needs_browser
def test_a_model_that_does_not_load_is_a_refusal_and_leaves_no_browser(monkeypatch):
    started = []

    class Recorded(web_session.Browser):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            started.append(self)

    monkeypatch.setattr(web_session, "Browser", Recorded)
    model = _model(helper.make_node("NoSuchOp", ["x"], ["y"]),
                   inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                   outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    with pytest.raises(runtimes.RuntimeFailure, match="NoSuchOp"):
        runtimes.get("wasm").load(model)
    assert len(started) == 1 and not started[0].alive()


@needs_browser
def test_the_page_reaches_no_host_but_its_server():
    session = _session("wasm", "native", 1)
    browser = session._page.browser
    assert browser.evaluate("fetch('./page.mjs').then(r => r.status)") == 200
    assert browser.evaluate("fetch('/page.mjs').then(r => r.status)") == 404  # only under the server's secret
    assert browser.evaluate("fetch('http://example.com/').then(() => 'reached', () => 'refused')") == "refused"


@needs_browser
def test_the_browser_gets_a_copy_of_the_model_with_its_external_data(tmp_path):
    weights = np.arange(1 << 12, dtype=_F)
    model = _model(
        helper.make_node("Add", ["x", "w"], ["y"]),
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [weights.size])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [weights.size])],
    )
    model.graph.initializer.append(onnx.numpy_helper.from_array(weights, "w"))
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)
    before = {file.name: digest(file) for file in tmp_path.iterdir()}
    session = runtimes.get("wasm").load(path)
    assert session.path.parent != tmp_path and session.path.exists()
    assert session.run({"x": np.ones(weights.size, _F)})[0].tobytes() == (weights + 1).tobytes()
    copy = session.path.parent
    session.close()
    assert not copy.exists()
    assert {file.name: digest(file) for file in tmp_path.iterdir()} == before


@needs_browser
def test_placement_names_the_provider_of_each_node():
    webgpu = runtimes.get("webgpu")
    dql = one_node_model(["n"], 21)
    dql.graph.node[0].name = "dql"
    assert webgpu.placement(dql) == {"CPUExecutionProvider": ["DynamicQuantizeLinear (dql)"]}
    add = _model(helper.make_node("Add", ["x", "x"], ["y"], name="twice"),
                 inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                 outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    assert webgpu.placement(add) == {"WebGpuExecutionProvider": ["Add (twice)"]}
    assert runtimes.get("wasm").placement(add) == {"CPUExecutionProvider": ["Add (twice)"]}
    # The residual expansion leaves Round and Sign on the CPU: WebGPU has no kernel for them.
    placed = webgpu.placement(dql_pass.expand(dql, variant="residual", runtime=None)[0])
    assert {node.split(" ")[0] for node in placed["CPUExecutionProvider"]} == {"Round", "Sign"}


@needs_browser
@pytest.mark.parametrize("opset", [11, 21])
def test_every_node_of_the_webgpu_target_runs_on_the_gpu(opset):
    webgpu = runtimes.get("webgpu")
    expanded = dql_pass.expand(one_node_model(["n"], opset), target="webgpu")[0]
    assert list(webgpu.placement(expanded)) == ["WebGpuExecutionProvider"]


def test_a_missing_setup_is_one_line_naming_the_setup_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(web.CACHE_VARIABLE, str(tmp_path / "empty"))
    assert not runtimes.get("webgpu").installed()
    with pytest.raises(dql_pass.InputError, match=r"webgpu is not installed; .*python -m dql_pass.runtimes.web setup"):
        runtimes.get("webgpu").load(one_node_model(["n"], 21))
    from dql_pass.cli import main

    assert main(["verify", "models/mlp_dynamic.onnx", "models/mlp_dynamic.onnx", "--runtime", "wasm"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "python -m dql_pass.runtimes.web setup" in err
    from dql_pass.runtimes.web.__main__ import main as web_main

    assert web_main(["check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "python -m dql_pass.runtimes.web setup" in err


def test_a_browser_that_cannot_start_leaves_no_pipe_or_profile(tmp_path, monkeypatch):
    from dql_pass.runtimes.web.browser import Browser

    import tempfile

    with short_tmpdir() as short:
        monkeypatch.setenv("TMPDIR", str(short))
        monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
        before = set(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError):
            Browser(str(tmp_path / "no-chromium"), "http://127.0.0.1:9/")
        assert set(os.listdir("/proc/self/fd")) <= before
        assert os.listdir(short) == []



@needs_browser
def test_the_cost_of_an_inference_is_a_dispatch_per_gpu_kernel_and_a_readback_per_copy_to_the_cpu():
    """mlp_dynamic (3 DQL sites), before and after the portable expansion: per warm inference one
    dispatch per node on WebGPU but those that launch none (here the Reshape of each portable site),
    one readback per MemcpyToHost and one for the output (computed on WebGPU), and at least a
    submit per readback. The original's DQL and MatMulInteger
    run on the CPU; the expansion moves its 3 DQL onto WebGPU at some 95 nodes each."""
    model = onnx.load("models/mlp_dynamic.onnx")
    feeds = {"input": np.random.default_rng(0).standard_normal((2, 64), _F)}
    costs = {}
    for form, form_model in [("original", model),
                             ("portable", dql_pass.expand(model, variant="portable", runtime=None)[0])]:
        cost = costs[form] = runtimes.get("webgpu").cost(form_model, feeds)
        gpu = [node.split(" ")[0] for node in cost.placement["WebGpuExecutionProvider"]]
        launching = [op_type for op_type in gpu if op_type not in (*web.COPIES, *web.WebGpu.no_dispatch)]
        assert cost.inference.dispatches == len(launching), form
        assert cost.inference.readbacks == gpu.count("MemcpyToHost") + len(model.graph.output), form
        assert (cost.inference.readbacks <= cost.inference.submits
                <= cost.inference.dispatches + cost.inference.readbacks)
        assert cost.creation.dispatches == 0  # loading uploads the weights, it runs no kernel
    assert costs["original"].nodes == {"WebGpuExecutionProvider": 15, "CPUExecutionProvider": 6}
    assert costs["portable"].nodes["CPUExecutionProvider"] == 3  # the MatMulInteger
    assert costs["portable"].inference.dispatches > costs["original"].inference.dispatches + 3 * 90
# --- a timeout is a timeout -------------------------------------------------------------------------------------------

class _Silent:
    """A browser that starts and never answers a page: every evaluation times out."""

    pid = None

    def __init__(self, executable, url):
        self.console = []

    def evaluate(self, expression, *, timeout=60):
        raise web.browser.BrowserTimeout(f"no answer from the browser within {timeout:g} s to Runtime.evaluate; "
                                         "it was stopped")

    def alive(self):
        return True

    def close(self):
        pass


@needs_browser
def test_a_browser_that_does_not_answer_in_time_is_a_timeout_naming_the_option_that_lengthens_it(monkeypatch):
    monkeypatch.setattr(web_session, "Browser", _Silent)
    monkeypatch.setattr(runtimes.get("webgpu"), "timeout", 0.5)
    with pytest.raises(runtimes.RuntimeTimeout) as raised:
        runtimes.get("webgpu").load(one_node_model(["n"], 21))
    assert str(raised.value) == ("a timeout: webgpu gave no answer within 0.5 s; "
                                 "--runtime-timeout SECONDS gives it longer")


def test_lower_for_a_runtime_that_times_out_notes_it_unchecked_and_does_not_say_it_blocks(tmp_path, monkeypatch,
                                                                                          capsys):
    from dql_pass import cli

    timeout = runtimes.RuntimeTimeout("a timeout: webgpu gave no answer within 60 s; "
                                      "--runtime-timeout SECONDS gives it longer")

    def load(model, *, threads, optimize):
        raise timeout

    monkeypatch.setattr(web.WebGpu, "installed", lambda self: True)
    monkeypatch.setattr(runtimes.get("webgpu"), "_load", load)
    model = os.path.join(os.path.dirname(__file__), "..", "models", "relu_dql.onnx")
    code = cli.main(["lower", model, "-o", str(tmp_path / "lowered.onnx"), "--target", "webgpu"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"dql-pass: note: not checked whether webgpu loads it: {timeout}" in err
    assert "still blocks" not in err and "cannot" not in err


def test_the_runtime_timeout_option_sets_the_runtimes_limit(tmp_path, monkeypatch):
    from dql_pass import cli

    monkeypatch.setattr(runtimes.get("wasm"), "timeout", None)
    seen = []
    monkeypatch.setattr(web.Wasm, "installed", lambda self: True)

    def load(model, *, threads, optimize):
        seen.append(runtimes.get("wasm").timeout)
        raise runtimes.RuntimeTimeout("a timeout")

    monkeypatch.setattr(runtimes.get("wasm"), "_load", load)
    model = os.path.join(os.path.dirname(__file__), "..", "models", "relu_dql.onnx")
    assert cli.main(["lower", model, "-o", str(tmp_path / "l.onnx"), "--target", "wasm", "--runtime-timeout",
                     "2.5"]) == 0
    assert seen == [2.5]
    assert cli.main(["lower", model, "-o", str(tmp_path / "l.onnx"), "--target", "wasm", "--runtime-timeout", "0"]) == 2


@needs_browser
def test_recycling_hands_a_closed_sessions_browser_to_the_next_and_stops_every_one_on_leaving():
    runtime = runtimes.get("wasm")
    x = np.array([-1.0, 0.5, 2.0], _F)
    with runtime.recycling():
        first = runtime.load(one_node_model(["n"], 21))
        expected, pid = first.run({"x": x}), first.browser_pid
        first.close()
        with pytest.raises(runtimes.RuntimeFailure, match="closed"):
            first.run({"x": x})  # the page is the next session's now
        # Another model on the same page: its own answer, not the first model's (whose y is uint8).
        second = runtime.load(_model(helper.make_node("Neg", ["x"], ["y"]),
                                     inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                                     outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])]))
        assert second.browser_pid == pid
        assert second.run({"x": x})[0].tobytes() == (-x).tobytes() != expected[0].tobytes()
        second.close()
        third = runtime.load(dql_pass.expand(one_node_model(["n"], 21), variant="lean", runtime=None)[0])
        assert third.browser_pid == pid
        assert [a.tobytes() for a in third.run({"x": x})] == [e.tobytes() for e in expected]
        # A page started with the verbose log (placement's) serves placement only: the log is there.
        placed = runtime.placement(one_node_model(["n"], 21))
        assert [node.split(" ")[0] for node in placed["CPUExecutionProvider"]] == ["DynamicQuantizeLinear"]
        assert runtime._idle[True].browser.pid != pid
        browser = third._page.browser
        third.close()
        assert browser.alive()
    assert not browser.alive() and runtime._idle is None


@needs_browser
def test_recycling_hands_on_no_browser_that_failed():
    model = _model(
        helper.make_node("Add", ["x", "w"], ["y"]),
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.arange(3, dtype=_F), "w"))
    runtime = runtimes.get("wasm")
    with runtime.recycling():
        session = runtime.load(model)
        failed = session._page.browser
        with pytest.raises(runtimes.RuntimeFailure):
            session.run({"x": np.ones(4, _F)})  # 4 and 3 do not broadcast
        session.close()
        assert not failed.alive()
        again = runtime.load(model)
        assert again._page.browser is not failed and again.run({"x": np.ones(3, _F)})[0].tolist() == [1.0, 2.0, 3.0]
        again.close()


@needs_browser
def test_recycling_hands_on_no_page_whose_call_was_interrupted(monkeypatch):
    class Interrupted(_Silent):
        def evaluate(self, expression, *, timeout=60):
            raise KeyboardInterrupt  # the page may still be loading: its model could land in the next session

    monkeypatch.setattr(web_session, "Browser", Interrupted)
    runtime = runtimes.get("wasm")
    with runtime.recycling():
        with pytest.raises(KeyboardInterrupt):
            runtime.load(one_node_model(["n"], 21))
        assert runtime._idle == {}


def test_the_server_serves_only_under_its_secret_and_quietly_to_a_browser_that_goes_away(tmp_path, capfd):
    """Any user of the machine reaches 127.0.0.1: a model copy (private weights) is not served at a path one can
    guess. A browser stopped mid-download (a timeout) printed the server's traceback on stderr."""
    import socket
    import threading
    import urllib.error
    import urllib.request

    from dql_pass.runtimes.web.browser import Server

    weights = tmp_path / "model.onnx.data"
    weights.write_bytes(os.urandom(16 << 20))
    server = Server()
    try:
        url = server.serve("/m1/model.onnx.data", weights)
        assert urllib.request.urlopen(url).read() == weights.read_bytes()
        for guess in ("/m1/model.onnx.data", "/", url.removeprefix(server.origin)[:-1]):
            with pytest.raises(urllib.error.HTTPError, match="404"):
                urllib.request.urlopen(server.origin + guess)
        with socket.create_connection(server.origin.removeprefix("http://").split(":")) as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            client.sendall(f"GET {url.removeprefix(server.origin)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            client.recv(1)
        for thread in threading.enumerate():  # the server's threads meet the reset and end: then stderr is read
            if thread.name.endswith("(process_request_thread)"):
                thread.join(timeout=30)
                assert not thread.is_alive()
    finally:
        server.close()
    assert "Traceback" not in capfd.readouterr().err


def test_a_temporary_folder_too_long_for_chromium_is_named_with_what_to_do(tmp_path, monkeypatch):
    """Under pytest's own TMPDIR Chromium closed its pipe at once: 'Chromium did not start', and its profile stayed."""
    import tempfile

    from dql_pass.runtimes.web.browser import Browser, BrowserFailure

    long = tmp_path / ("t" * 40)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    with pytest.raises(BrowserFailure, match="set TMPDIR to a folder of at most 35 bytes"):
        Browser("/nonexistent/chromium", "about:blank")
    assert list(long.iterdir()) == []


@needs_browser
def test_chromium_starts_with_the_longest_profile_path_the_adapter_allows(monkeypatch):
    """The limit the adapter states is measured: a profile path of exactly that many bytes starts."""
    import tempfile

    from dql_pass.runtimes.web import browser

    # A folder of its own (mkdtemp adds 8 characters), so that a run killed before its cleanup leaves no obstacle.
    length = browser._LONGEST_PROFILE - len("/tmp/") - len("/dql_pass.chromium.12345678")
    with short_tmpdir(prefix="d" * (length - 8)) as folder:
        monkeypatch.setattr(tempfile, "tempdir", str(folder))
        started = browser.Browser(browser.chromium(), "about:blank")
        try:
            assert len(os.fsencode(started._profile.name)) == browser._LONGEST_PROFILE
            assert started.evaluate("1 + 1") == 2
        finally:
            started.close()
