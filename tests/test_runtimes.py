"""Every runtime adapter: bit-exact through --target on the catalogue and on inputs built apart
from it, each known difference stated and measured; a runtime that is not installed is skipped,
saying which extra installs it and why CI leaves it out."""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import LEFT_OUT_OF_CI, assert_bits_equal, independent_inputs, installed, reciprocal_rewrite, sample

import dql_pass
from dql_pass import decomposition, inputs, runtimes
from dql_pass.compare import WORST, SiteDifference, compare_site
from dql_pass.runtimes.base import RuntimeFailure
from dql_pass.files import read_model
from dql_pass.graph.walk import ops_used
from dql_pass.op import MIN_OPSET, one_node_model
from dql_pass.reference import dynamic_quantize_linear
from dql_pass.runtimes import sessions, worker_main
from dql_pass.runtimes.web import WebRuntime

OPSET = 21
_F = np.float32


def every_runtime() -> list:
    """Each runtime's name; the browser's only with ``pytest -m web`` (SwiftShader takes minutes for
    the catalogue; tests/test_web_runtimes.py runs a subset on them by default)."""
    return [pytest.param(name, marks=pytest.mark.web) if isinstance(runtime, WebRuntime) else name
            for name, runtime in runtimes.RUNTIMES.items()]


def opset(name: str, variant: str) -> int:
    """The newest opset up to OPSET at which ``name`` lacks none of the variant's ops."""
    ops = {("", op_type) for op_type in decomposition.variant(variant).op_types}
    return next(o for o in range(OPSET, MIN_OPSET - 1, -1) if not runtimes.lacking(name, ops, o))


@functools.cache
def _session(name: str, variant: str, rank: int) -> runtimes.Session:
    # Symbolic dimensions: one model per rank serves every shape (compilers build one per shape).
    model = one_node_model([f"d{i}" for i in range(rank)], opset(name, variant))
    return runtimes.get(name).load(dql_pass.expand(model, variant=variant, runtime=None)[0])


def _differs(name: str, variant: str, x: np.ndarray) -> SiteDifference | None:
    """How the outputs of ``x`` on ``name`` through ``variant`` differ from the reference; None: same bits."""
    try:
        return compare_site(_session(name, variant, x.ndim).run({"x": x}), dynamic_quantize_linear(x))
    except runtimes.RuntimeFailure as error:
        return SiteDifference(WORST, str(error))


def _unexplained(name: str, arrays: list[np.ndarray]) -> list[str]:
    """The inputs whose outputs differ from the reference with no known difference of the target
    naming each output that differs to explain it."""
    runtime = runtimes.get(name)
    found = []
    for i, x in enumerate(arrays):
        diff = _differs(name, runtime.variant, x)
        if diff is not None and not runtime.differences(x, runtime.variant, "onnxruntime", diff.outputs):
            found.append(f"input {i} {list(x.shape)}: {diff.detail}")
    return found


def test_ci_installs_every_runtime_but_those_it_says_why_it_leaves_out():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and newer
    with open(Path(__file__).resolve().parent.parent / "pyproject.toml", "rb") as f:
        test_extra = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    in_ci = {extra for requirement in test_extra if requirement.startswith("dql_pass[")
             for extra in requirement.removeprefix("dql_pass[").removesuffix("]").split(",")}
    with_extra = {runtime.name: runtime.extra for runtime in runtimes.RUNTIMES.values() if runtime.extra}
    assert set(LEFT_OUT_OF_CI) <= set(runtimes.RUNTIMES)
    assert {name for name, extra in with_extra.items() if extra not in in_ci} == set(LEFT_OUT_OF_CI) & set(with_extra)
    # Without an extra, a runtime CI leaves out is one no pip install gives (onnxruntime-gpu replaces onnxruntime).
    assert {name for name in LEFT_OUT_OF_CI if name not in with_extra} == {"onnxruntime-cuda"}


@pytest.mark.parametrize("name", every_runtime())
def test_the_target_variant_is_exact_on_the_catalogue(name):
    installed(name)
    assert _unexplained(name, [c.x for c in inputs.cases() if c.comparable]) == []


@pytest.mark.parametrize("name", every_runtime())
def test_the_target_variant_is_exact_on_inputs_built_apart(name):
    installed(name)
    assert _unexplained(name, independent_inputs()) == []


@pytest.mark.parametrize("name", every_runtime())
def test_every_known_difference_of_the_target_is_seen(name):
    """A known difference is measured, not hoped for: some input shows it."""
    runtime = installed(name)
    stated = [d for d in runtime.known_differences if runtime.variant in d.forms and d.policy in (None, "onnxruntime")]
    seen = set()
    for x in [c.x for c in inputs.cases() if c.comparable] + independent_inputs():
        diff = _differs(name, runtime.variant, x)
        if diff is not None:
            seen |= set(runtime.differences(x, runtime.variant, "onnxruntime", diff.outputs))
    assert [d.reason for d in stated if d.reason not in seen] == []


@pytest.mark.parametrize("name", every_runtime())
@pytest.mark.parametrize("shape", [(0,), (2, 0), (3,), ()])
def test_the_target_variant_runs_fixed_shapes_empty_ones_included(name, shape):
    """Suites declare each input's shape as it is, 0 included (OpenVINO failed to read [0])."""
    runtime = installed(name)
    x = np.asarray(np.arange(np.prod(shape), dtype=_F).reshape(shape) - _F(1.5))
    one_node = one_node_model(list(shape), opset(name, runtime.variant))
    model = dql_pass.expand(one_node, variant=runtime.variant, runtime=None)[0]
    assert compare_site(runtime.load(model).run({"x": x}), dynamic_quantize_linear(x)) is None


@pytest.mark.parametrize("name", every_runtime())
def test_an_initializer_listed_among_the_inputs_is_not_fed(name):
    """Models below IR version 4 list their initializers as graph inputs too."""
    runtime = installed(name)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, [3]) for v in ("x", "w")],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
        [onnx.numpy_helper.from_array(np.ones(3, _F), "w")],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=7)
    session = runtime.load(model)
    assert session.input_names == ["x"]
    assert session.run({"x": np.arange(3, dtype=_F)})[0].tobytes() == np.arange(1, 4, dtype=_F).tobytes()
    # An input not fed is the runtime's refusal, which verify reports (a REWRITTEN that takes an input
    # ORIGINAL does not): the compiling adapters raised a KeyError, a traceback.
    with pytest.raises(RuntimeFailure, match="the model takes inputs it was not given: x"):
        session.run({"w": np.ones(3, _F)})


@pytest.mark.parametrize("name", every_runtime())
def test_a_model_file_in_the_onnxtxt_form_loads_quietly(name, tmp_path):
    """A path is read in any form onnx reads (runtimes read protobuf only), without onnx's warning that onnxtxt is
    experimental."""
    runtime = installed(name)
    path = tmp_path / "model.onnxtxt"
    onnx.save(dql_pass.expand(one_node_model([3], opset(name, runtime.variant)), variant=runtime.variant,
                              runtime=None)[0], path)
    x = np.array([-1.5, 0.25, 2], _F)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = runtime.load(path).run({"x": x})
    assert compare_site(got, dynamic_quantize_linear(x)) is None


@pytest.mark.parametrize("name", ["tvm", "iree", "onnx2torch", "onnx2pytorch"])
def test_a_converter_gets_the_external_weights_of_a_model_in_memory_from_their_file(name, tmp_path, monkeypatch):
    """A converter reads no files: a weight that stays external for ORT (past 1 MiB; past 0 bytes here) reaches it
    from its own data file, never from a file of that name in the current folder."""
    runtime = installed(name)
    monkeypatch.setattr(sessions, "_IN_MEMORY_BYTES", 0)
    weight = np.arange(16, dtype=_F)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [16])],
        [onnx.numpy_helper.from_array(weight, "w")])
    (tmp_path / "model").mkdir()
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)]),
              tmp_path / "model" / "m.onnx", save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    (tmp_path / "m.onnx.data").write_bytes(bytes(weight.nbytes))  # a decoy of zeros where a relative path leads
    monkeypatch.chdir(tmp_path)
    (y,) = runtime.load(read_model(tmp_path / "model" / "m.onnx")).run({"x": np.ones(16, _F)})
    assert y.tobytes() == (weight + _F(1)).tobytes()


def _runnable_model(name: str) -> onnx.ModelProto:
    """The MLP sample, or the one-node DQL model where the runtime lacks one of the MLP's other ops."""
    model = sample("mlp_dynamic")
    expanded = dql_pass.expand(model, target=name)[0]
    if runtimes.lacking(name, ops_used(ir.from_proto(expanded)), expanded.opset_import[0].version):
        model = one_node_model(["n"], opset(name, runtimes.get(name).variant))
    return model


@pytest.mark.parametrize("name", every_runtime())
def test_verify_on_a_runtime_passes_its_target_expansion_and_fails_a_reciprocal(name):
    installed(name)
    model = _runnable_model(name)
    report = dql_pass.verify(model, dql_pass.expand(model, target=name)[0], runtime=name, samples=1)
    assert report.verdict == "PASS", report.format()
    assert dql_pass.verify(model, reciprocal_rewrite(model), runtime=name, samples=1).verdict == "FAIL"

# --- adapters: tract, openvino, tinygrad ---


def _target_session(name: str, rank: int = 1) -> runtimes.Session:
    return _session(name, installed(name).variant, rank)


def _assert_reference_bits(session: runtimes.Session, x: np.ndarray) -> None:
    """The reference's bits, and the declared types: uint8 comes back as uint8."""
    got = session.run({"x": x})
    assert [a.dtype for a in got] == [np.uint8, np.float32, np.uint8]
    assert compare_site(got, dynamic_quantize_linear(x)) is None


def test_tract_compiles_once_per_input_shape():
    """In its worker module, run here: tract fixes every input fact, so a second shape needs a second compile."""
    installed("tract")
    tract_worker = worker_main._module("tract")
    expanded = dql_pass.expand(one_node_model(["n"], OPSET), variant="float64", runtime=None)[0]
    with sessions.as_file(expanded) as path:
        tract_worker.load(0, str(path))
        shapes = [3, 5, 0, 3]
        for size in shapes:
            x = np.linspace(-2, 7, size, dtype=_F)
            assert compare_site(tract_worker.run(0, [x]), dynamic_quantize_linear(x)) is None
        assert len(tract_worker._models[0][1]) == len(set(shapes))


def test_tract_refuses_quantizelinear_with_a_computed_scale_without_a_stack_trace(monkeypatch):
    installed("tract")
    monkeypatch.setenv("RUST_BACKTRACE", "1")  # tract appends a stack trace to its errors where it is set
    runtimes.get("tract").worker().stop()  # a new worker, started with it set here
    session = runtimes.get("tract").load(dql_pass.expand(one_node_model(["n"], OPSET), runtime=None)[0])
    with pytest.raises(runtimes.RuntimeFailure, match="y_scale must be a const") as failure:
        session.run({"x": np.ones(3, _F)})
    assert "Stack backtrace" not in str(failure.value)


def test_a_panic_in_tract_fails_the_run_with_its_message_and_the_next_run_goes_on():
    """tract aborts the process it runs in on an allocation it cannot make: it took the command with it."""
    installed("tract")
    # 4 PB: past any address space, whatever the system's overcommit setting (40 TB fits 128 TiB)
    shape = onnx.helper.make_tensor("shape", onnx.TensorProto.INT64, [3], [1000000, 1000000, 1000])
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Expand", ["x", "shape"], ["e"]), onnx.helper.make_node("ReduceSum", ["e"], ["y"])],
        "huge", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [shape])
    huge = runtimes.get("tract").load(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)]))
    fine = runtimes.get("tract").load(dql_pass.expand(one_node_model(["n"], OPSET), variant="float64", runtime=None)[0])
    with pytest.raises(runtimes.RuntimeFailure, match=r"tract crashed \(SIGABRT\) on this input: failed to allocate"):
        huge.run({"x": np.ones(1, _F)})
    _assert_reference_bits(fine, np.linspace(-2, 7, 5, dtype=_F))  # loaded again, in a new worker


def test_tract_gemm_reads_a_subnormal_operand_as_zero_where_mul_keeps_it():
    """tract's known difference on lean, whose scale is rounded in two Gemms (onnxscript_bodies): c - 256 * q
    with q subnormal, on tract's Gemm and on its Mul and Sub."""
    installed("tract")
    tract_worker = worker_main._module("tract")
    q, c = np.array([[7.8e-41]], _F), np.array([[2e-38]], _F)
    factor = onnx.numpy_helper.from_array(np.array([[256]], _F), "factor")
    make = onnx.helper.make_node
    nodes = {"gemm": [make("Gemm", ["q", "factor", "c"], ["y"], alpha=-1.0)],
             "mul": [make("Mul", ["q", "factor"], ["p"]), make("Sub", ["c", "p"], ["y"])]}
    values = [onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT, [1, 1]) for v in ("q", "c", "y")]
    results = {}
    for key, (name, graph_nodes) in enumerate(nodes.items()):
        model = onnx.helper.make_model(onnx.helper.make_graph(graph_nodes, name, values[:2], values[2:], [factor]),
                                       opset_imports=[onnx.helper.make_opsetid("", OPSET)])
        with sessions.as_file(model) as path:
            tract_worker.load(key, str(path))
            results[name] = tract_worker.run(key, [q, c])[0]
            tract_worker.drop(key)
    assert_bits_equal(results["mul"], c - q * _F(256))
    assert_bits_equal(results["gemm"], c)  # q * 256 read as 0
    assert any(d.forms == ("lean",) and d.inputs == "subnormal" for d in runtimes.get("tract").known_differences)


def test_openvino_runs_float32_not_bf16():
    """An identity MatMul of values bf16 cannot hold (8 significant bits): on a CPU with AMX the
    plugin's default precision gives 1.0 for each."""
    installed("openvino")
    x = (1 + np.arange(16, dtype=_F) * _F(2**-10)).reshape(1, 16)
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "identity",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 16])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 16])],
            [onnx.numpy_helper.from_array(np.eye(16, dtype=_F), "w")],
        ),
        opset_imports=[onnx.helper.make_opsetid("", OPSET)],
    )
    (y,) = runtimes.get("openvino").load(model).run({"x": x})
    np.testing.assert_array_equal(y.view(np.uint32), x.view(np.uint32))


@pytest.mark.parametrize("name", ["tract", "openvino"])
def test_empty_and_rank_0_inputs_run(name):
    for x in (np.zeros(0, _F), np.zeros((2, 0), _F), np.array(-1.5, _F)):
        _assert_reference_bits(_target_session(name, x.ndim), x)


def test_openvino_starts_without_its_telemetry():
    """openvino-telemetry, where installed, writes a client id and usage stats under $HOME/intel and sends an
    "import" event: the worker, whose home is its own folder, must never start it."""
    (session,) = _served_sessions("openvino", 1)
    _assert_reference_bits(session, np.linspace(-2, 7, 5, dtype=_F))
    home = Path(os.readlink(f"/proc/{runtimes.get('openvino').worker()._process.pid}/cwd"))
    assert not (home / "intel").exists(), sorted(p.name for p in home.iterdir())


def test_openvino_refuses_to_compile_a_gather_with_empty_indices_and_serves_on():
    """The CPU plugin dies (SIGFPE) compiling a Gather whose indices are empty, as lean's are for an empty x:
    refused before it compiles, the worker lives."""
    session = _loaded("openvino", variant="lean")
    with pytest.raises(runtimes.RuntimeFailure, match="compiling a Gather with empty indices"):
        session.run({"x": np.zeros(0, _F)})
    worker = runtimes.get("openvino").worker()
    _assert_reference_bits(session, np.linspace(-2, 7, 5, dtype=_F))
    assert runtimes.get("openvino").worker() is worker


def _family_op(op_type: str, x: np.ndarray, y_type: int, scale: np.float32, zero_point: int) -> onnx.ModelProto:
    x_type = onnx.helper.np_dtype_to_tensor_dtype(x.dtype)
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node(op_type, ["x", "s", "z"], ["y"])], op_type,
        [onnx.helper.make_tensor_value_info("x", x_type, x.shape)],
        [onnx.helper.make_tensor_value_info("y", y_type, x.shape)],
        [onnx.numpy_helper.from_array(scale, "s"), onnx.numpy_helper.from_array(np.uint8(zero_point), "z")])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])


def _dequantize_otherwise(runtime: runtimes.Runtime) -> list[int]:
    """How many of the 256 uint8 values ``runtime``'s DequantizeLinear gives otherwise than ONNX: with
    all-MiniLM-L6-v2's word-embedding scale and zero point (base.dequantizes_otherwise), and with scale 0.0123 and
    zero point 255."""
    x = np.arange(256, dtype=np.uint8).reshape(4, 64)
    wrong = []
    for scale, zero_point in ((np.float32(0.006104800850152969), 83), (np.float32(0.0123), 255)):
        (y,) = runtime.load(_family_op("DequantizeLinear", x, onnx.TensorProto.FLOAT, scale, zero_point)).run({"x": x})
        want = (x.astype(np.float32) - np.float32(zero_point)) * scale  # both terms exact: one rounding, ONNX's
        wrong.append(int(np.count_nonzero(y.view(np.uint32) != want.view(np.uint32))))
    return wrong


def _quantize_otherwise(runtime: runtimes.Runtime) -> list[int]:
    """How many of 1,024 QuantizeLinear outputs ``runtime`` gives otherwise than ONNX (base.quantizes_otherwise)."""
    scale = np.float32(0.0123)
    ties = (np.arange(-300, 300, dtype=_F) + _F(0.5)) * scale
    x = np.concatenate([ties, np.random.default_rng(0).standard_normal(424).astype(_F) * 2]).reshape(16, 64)
    (y,) = runtime.load(_family_op("QuantizeLinear", x, onnx.TensorProto.UINT8, scale, 128)).run({"x": x})
    want = np.clip(np.rint(x / scale) + 128, 0, 255).astype(np.uint8)  # float32 quotient, half to even
    return [int(np.count_nonzero(y != want))]


@pytest.mark.parametrize("op_type, measure, of", [("DequantizeLinear", _dequantize_otherwise, "the 256"),
                                                  ("QuantizeLinear", _quantize_otherwise, "1,024")])
@pytest.mark.parametrize("name", ["tract", "openvino", "tinygrad", "tvm", "iree", "mnn", "litert", "litert-xnnpack"])
def test_a_runtime_declares_the_quantization_ops_it_computes_otherwise(name, op_type, measure, of):
    """verify lowers, in the ORIGINAL it holds REWRITTEN to on a runtime, the ops that runtime declares it computes
    otherwise than ONNX: one it computes otherwise undeclared made an exact lowering FAIL there. A declaration's
    count is the one measured here."""
    runtime = installed(name)
    wrong = measure(runtime)
    declared = [op.reason for op in runtime.computed_otherwise if op.op_type == op_type]
    assert bool(declared) == any(wrong), (wrong, declared)
    assert all(f": {wrong[0]} of {of} " in reason for reason in declared), (wrong, declared)


def test_tinygrad_runs_on_its_cpu_device_and_leaves_the_default_alone(monkeypatch):
    monkeypatch.delenv("DEV", raising=False)  # tinygrad writes the device it picks by itself here
    session = _target_session("tinygrad")
    from tinygrad.helpers import DEV

    before = repr(DEV)
    for x in (np.zeros(0, _F), np.array([-1, 0.5, 254.5], _F)):
        _assert_reference_bits(session, x)
    assert (repr(DEV), os.environ.get("DEV")) == (before, None)


# --- adapters: tvm, iree, onnx2torch, onnx2pytorch ---


def _loaded(name: str, opset: int = OPSET, shape: tuple = ("n",), variant: str | None = None) -> runtimes.Session:
    """The one-node model of ``shape`` at ``opset``, expanded with ``variant`` (default: the target), on ``name``."""
    runtime = installed(name)
    model = one_node_model(list(shape), opset)
    return runtime.load(dql_pass.expand(model, variant=variant or runtime.variant, runtime=None)[0])


def _counting_compiles(name: str, monkeypatch) -> list:
    """The calls of adapter ``name``'s compile function, from now on."""
    from dql_pass.runtimes import iree, tvm

    installed(name)
    adapter = {"tvm": tvm, "iree": iree}[name]
    compiles = []
    compile_once = adapter._compile
    monkeypatch.setattr(adapter, "_compile", lambda *args: compiles.append(args) or compile_once(*args))
    return compiles


@pytest.mark.parametrize("name", ["tvm", "iree"])
def test_compilers_compile_a_model_once_for_every_input_shape(name, monkeypatch):
    compiles = _counting_compiles(name, monkeypatch)
    session = _loaded(name)
    for size in (3, 5, 0, 3):  # the dimension stays symbolic: no shape compiles again
        _assert_reference_bits(session, np.linspace(-2, 7, size, dtype=_F))
    assert len(compiles) == 1


@pytest.mark.parametrize("name", ["tvm", "iree"])
def test_compilers_compile_a_model_of_unknown_rank_once_per_rank(name, monkeypatch):
    model = dql_pass.expand(one_node_model(["n"], OPSET), variant=installed(name).variant, runtime=None)[0]
    for value in (*model.graph.input, *model.graph.output):  # as verify's site models come
        value.type.tensor_type.ClearField("shape")
    compiles = _counting_compiles(name, monkeypatch)
    session = runtimes.get(name).load(model)
    for shape in [(3,), (2, 2), (5,), (1, 3)]:
        _assert_reference_bits(session, np.linspace(-2, 7, np.prod(shape), dtype=_F).reshape(shape))
    assert len(compiles) == 2


def test_iree_gives_uint8_outputs_as_uint8():
    x = np.array([-1, 0.5, 3, 254.5], _F)  # IREE itself hands y = 255 back as int8 -1
    _assert_reference_bits(_loaded("iree"), x)
    assert dynamic_quantize_linear(x)[0].max() > 127


def test_iree_target_is_exact_on_static_shapes():
    """For 5 to 8 elements of static shape, iree-compile miscompiles Cast(float32 -> uint8), which the
    arithmetic and float64 variants end with (128 to 254 become 127); the target has no such Cast."""
    x = np.linspace(-1, 6, 7, dtype=_F)
    _assert_reference_bits(_loaded("iree", shape=x.shape), x)


@pytest.mark.parametrize("name", ["onnx2torch", "onnx2pytorch"])
def test_torch_converters_run_empty_and_rank_0_inputs_through_float64(name):
    installed(name)
    import torch

    threads = torch.get_num_threads()
    for x in (np.zeros(0, _F), np.zeros((2, 0), _F), np.array(-1.5, _F)):
        # opset 13: onnx2torch has no converter for ReduceMin-18, Reshape-19 or Cast-19.
        session = installed(name).load(dql_pass.expand(
            one_node_model([f"d{i}" for i in range(x.ndim)], 13), variant="float64", runtime=None)[0], threads=1)
        _assert_reference_bits(session, x)
    assert torch.get_num_threads() == threads  # threads=1 holds for the run only


def test_onnx2torch_refuses_what_it_lacks_with_the_declared_reason():
    runtime = installed("onnx2torch")
    [lack] = runtimes.lacking("onnx2torch", [("", "DynamicQuantizeLinear")], 13)
    with pytest.raises(runtimes.RuntimeFailure) as failure:
        runtime.load(one_node_model(["n"], 13))
    assert str(failure.value) == lack.reason



def test_iree_outputs_outlive_its_buffers():
    """Views of IREE's output buffers read reused memory once the buffers go: 99% of a million y
    were wrong on the synchronous driver before the adapter copied them."""
    x = np.random.default_rng(11).normal(0, 3, (1024, 1024)).astype(_F)
    session = installed("iree").load(dql_pass.expand(one_node_model(["a", "b"], OPSET), runtime=None)[0], threads=1)
    _assert_reference_bits(session, x)


def test_a_reason_stated_for_several_input_classes_is_given_once():
    # tinygrad states its float-algebra rewrites for lean per class; an input in two of them is one
    # difference, counted once in RUNTIMES.md and in verify's report (it was counted twice).
    x = next(c.x for c in inputs.cases() if c.name == "tie_reciprocal_trap")
    assert {"near tie", "reciprocal"} <= inputs.input_classes(x, "onnxruntime")
    reasons = runtimes.get("tinygrad").differences(x, "lean", "onnxruntime")
    assert len(reasons) == 1 and "tinygrad rewrites float algebra" in reasons[0]


def _through_float16() -> ir.Model:
    """x cast to float16, through Relu, cast back: every output rounded to float16 as ONNX defines it."""
    nodes = [onnx.helper.make_node("Cast", ["x"], ["h"], to=onnx.TensorProto.FLOAT16),
             onnx.helper.make_node("Relu", ["h"], ["r"]),
             onnx.helper.make_node("Cast", ["r"], ["y"], to=onnx.TensorProto.FLOAT)]
    x, y = (onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [4]) for name in ("x", "y"))
    graph = onnx.helper.make_graph(nodes, "half", [x], [y])
    return ir.from_proto(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=8))


@pytest.mark.parametrize("name", sorted({*(n for n, r in runtimes.RUNTIMES.items() if r.widens_float16), "reference"}))
def test_a_runtime_said_to_widen_float16_computes_it_in_float32_and_no_other(name):
    # What verify's INCOMPLETE for a REWRITTEN narrowed to float16 rests on (widens_float16).
    runtime = installed(name)
    x = np.array([1.2345678, 100.1234, 0.1, 3.3333], np.float32)
    y = np.asarray(runtime.load(_through_float16()).run({"x": x})[0])
    expected = x if runtime.widens_float16 else x.astype(np.float16).astype(np.float32)
    assert y.tobytes() == expected.tobytes(), (y, expected)


def _served_sessions(name: str, count: int) -> list[runtimes.Session]:
    """``count`` sessions of the one-node model on ``name``, a runtime whose sessions share one worker."""
    runtime = installed(name)
    expanded = dql_pass.expand(one_node_model(["n"], OPSET), variant=runtime.variant, runtime=None)[0]
    return [runtime.load(expanded) for _ in range(count)]


@pytest.mark.parametrize("name", ["tract", "openvino"])
def test_sessions_of_a_shared_worker_run_from_several_threads(name):
    """One worker serves every session: without a lock, two threads' requests and answers crossed."""
    import threading

    wrong = []

    def runs(session: runtimes.Session, seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(40):
            x = rng.standard_normal(int(rng.integers(1, 64))).astype(_F)
            try:
                if compare_site(session.run({"x": x}), dynamic_quantize_linear(x)) is not None:
                    wrong.append(x.size)
            except Exception as error:  # a crossed answer may also come back as a failure
                wrong.append(repr(error))

    threads = [threading.Thread(target=runs, args=(session, seed))
               for seed, session in enumerate(_served_sessions(name, 3))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()
    assert wrong == []


def test_a_worker_starts_where_its_pipes_cannot_be_widened(monkeypatch):
    """F_SETPIPE_SZ is Linux's: elsewhere the workers keep the default capacity (it raised, leaving the worker
    it had started running)."""
    import fcntl

    installed("tract")
    runtimes.get("tract").worker().stop()
    monkeypatch.delattr(fcntl, "F_SETPIPE_SZ")
    (session,) = _served_sessions("tract", 1)
    _assert_reference_bits(session, np.linspace(-2, 7, 5, dtype=_F))


def test_an_interrupt_while_the_tract_worker_computes_leaves_no_answer_for_the_next_run(monkeypatch):
    """Ctrl-C in a notebook reaches the kernel only: the worker's answer stayed in the pipe, the next run's."""
    from dql_pass.runtimes import worker

    (session,) = _served_sessions("tract", 1)
    answer = worker._answer

    def interrupted(process, seconds):
        monkeypatch.setattr(worker, "_answer", answer)
        raise KeyboardInterrupt

    monkeypatch.setattr(worker, "_answer", interrupted)
    with pytest.raises(KeyboardInterrupt):
        session.run({"x": np.ones(7, _F)})
    _assert_reference_bits(session, np.linspace(-2, 7, 5, dtype=_F))


@pytest.mark.parametrize("name", ["tract", "openvino"])
def test_a_shared_worker_killed_between_runs_is_replaced_and_its_folder_removed(name):
    """The system's OOM killer, say: the next run starts a new worker, and the dead one's pipes and folder go."""
    import gc
    import signal

    (session,) = _served_sessions(name, 1)
    dead = runtimes.get(name).worker()
    folder = Path(os.readlink(f"/proc/{dead._process.pid}/cwd"))
    os.kill(dead._process.pid, signal.SIGKILL)
    dead._process.wait()
    _assert_reference_bits(session, np.linspace(-2, 7, 5, dtype=_F))
    assert runtimes.get(name).worker() is not dead and not dead.alive()
    assert dead._process.stdout.closed  # stopped when replaced, not when collected
    del dead
    gc.collect()
    assert not folder.exists()


@pytest.mark.parametrize("name", ["tract", "openvino"])
def test_an_exception_of_ours_in_a_worker_is_a_bug_with_its_traceback_not_a_refusal(name):
    """The runtime's own errors are its refusals (RuntimeFailure); any other was reported as "NAME cannot run"."""
    from dql_pass.runtimes.worker import WorkerBug

    _served_sessions(name, 1)
    with pytest.raises(WorkerBug, match=r"(?s)Traceback.*KeyError: -1"):
        runtimes.get(name).worker().ask("run", -1, [np.ones(3, _F)], seconds=60, doing="on this input")


def test_a_worker_whose_parent_is_gone_ends_without_finishing_its_request(tmp_path):
    """A command killed outright (SIGKILL) left its worker computing, for up to 600 s, for nobody."""
    import shutil
    import subprocess
    import sys
    import time

    shutil.copy(Path(runtimes.__file__).with_name("worker_main.py"), tmp_path)
    started_work = tmp_path / "working"
    (tmp_path / "slow_worker.py").write_text(
        f"import pathlib, time\n\ndef wait(seconds):\n    pathlib.Path({str(started_work)!r}).touch()\n"
        "    time.sleep(seconds)\n")
    parent = ("import os, pickle, subprocess, sys, time\n"
              f"worker = subprocess.Popen([sys.executable, {str(tmp_path / 'worker_main.py')!r}, 'slow', 'serve'], "
              "stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "
              "'DQL_PASS_WORKER_PARENT': str(os.getpid())})\n"
              "pickle.dump(('wait', (120,), []), worker.stdin)\nworker.stdin.flush()\nprint(worker.pid, flush=True)\n"
              f"while not os.path.exists({str(started_work)!r}):\n    time.sleep(0.05)\n")
    started = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60, check=True)
    pid = int(started.stdout)
    assert started_work.exists()  # the worker was computing when its parent ended
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
