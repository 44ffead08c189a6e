"""Shared test helpers, imported by name: the command line run in this process, a short TMPDIR for
Chromium, a driver that fails a real one at each step, one-node DQL models and a custom op to add to
one, the sample models and edits of their decomposed graphs,
models with external data, sessions through the runtime layer, the skip for a runtime that is not
installed, bitwise comparison."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import io
import logging
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.backend.test.loader
import onnx.inliner
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import inputs, runtimes
from dql_pass.op import MAX_OPSET, one_node_model


MODELS = Path(__file__).resolve().parent.parent / "models"
# Well above what any command needs (about 2.5 GB of address space with ORT loaded), so that a command
# reading /dev/zero to the end fails its test instead of the machine.
MEMORY_CAP = 6 << 30


@dataclasses.dataclass(frozen=True)
class Result:
    """How a command ended: its exit code and what it printed."""

    returncode: int
    stdout: str
    stderr: str


class CommandTimeout(AssertionError):
    """A command ran past its time (a wait on a FIFO, a read without end)."""


# A fresh interpreter's warning filters (Python's defaults): what a user sees on stderr.
_DEFAULT_WARNINGS = [("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, None),
                     ("ignore", PendingDeprecationWarning, None), ("ignore", ImportWarning, None),
                     ("ignore", ResourceWarning, None)]


@contextlib.contextmanager
def _as_a_fresh_process(cwd: str | os.PathLike | None, timeout: float) -> Iterator[None]:
    """Within: the working folder ``cwd``, no logging configured (the command configures its own), the
    warnings a fresh interpreter shows, a memory cap and an alarm after ``timeout`` seconds."""
    root, previous = logging.getLogger(), os.getcwd()
    handlers, level = root.handlers[:], root.level
    limits = resource.getrlimit(resource.RLIMIT_AS)
    used = os.sysconf("SC_PAGE_SIZE") * int(Path("/proc/self/statm").read_text().split()[0])

    def expire(signum: int, frame: object) -> None:
        raise CommandTimeout(f"the command ran past {timeout} s")

    alarm = signal.signal(signal.SIGALRM, expire)
    try:
        root.handlers.clear()
        if cwd is not None:
            os.chdir(cwd)
        if limits[0] == resource.RLIM_INFINITY:
            resource.setrlimit(resource.RLIMIT_AS, (used + MEMORY_CAP, limits[1]))
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(_DEFAULT_WARNINGS):
                warnings.filterwarnings(action, category=category, module=module or "")
            warnings.showwarning = warnings._showwarning_orig
            signal.setitimer(signal.ITIMER_REAL, timeout)
            yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm)
        resource.setrlimit(resource.RLIMIT_AS, limits)
        os.chdir(previous)
        root.handlers[:] = handlers
        root.setLevel(level)


def run_cli(*args: str | os.PathLike, cwd: str | os.PathLike | None = None, timeout: float = 120) -> Result:
    """``dql-pass ARGS`` in this process (``dql_pass.cli.main``), as a fresh process would run it: its
    stdout and stderr, its own logging, a fresh interpreter's warnings; a wait without end fails."""
    from dql_pass.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _as_a_fresh_process(cwd, timeout), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([os.fspath(a) for a in args])
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
    return Result(code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def short_tmpdir(prefix: str = "dql") -> Iterator[Path]:
    """Within: a folder of its own under /tmp (``prefix`` and mkdtemp's 8 characters), removed after. Chromium
    does not start under a TMPDIR as long as pytest's tmp_path (its profile's socket path, 108 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def signals_as_by_default() -> None:
    """In a child before it starts: the stopping signals at their defaults, though pytest runs in
    the background (SIGINT ignored) or under nohup (SIGHUP ignored), which the child would inherit."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


# `python -c STEP_FAILURE_DRIVER ARGS_JSON OUT_DIR SNAPSHOTS MODE` runs the command ARGS in one forked child
# after another, child n failing at its n-th step that touches the disk (MODE: kill, full, SIGINT, SIGTERM),
# copies OUT_DIR to SNAPSHOTS/n after each, until a child ends before its step; it prints the exit codes as JSON.
STEP_FAILURE_DRIVER = textwrap.dedent(r'''
    import errno, json, os, shutil, signal, sys
    from dql_pass import api, cli  # api: imported once, before the forks, not by every child
    from dql_pass.runtimes.ort import import_onnxruntime

    import_onnxruntime()

    import onnx

    args, out_dir, snapshots, mode = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored when pytest runs in the background
    # Every step that touches the disk; a full disk fails only those that take space.
    STEPS = [(os, name) for name in ("mkdir", "rename", "replace", "fsync", "chmod")] + [(onnx, "save_model")]
    if mode != "full":
        STEPS += [(os, name) for name in ("unlink", "rmdir", "scandir", "remove")]

    def child(n):
        calls = [0]
        def wrap(fn):
            def step(*a, **k):
                calls[0] += 1
                if calls[0] == n:
                    if mode == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    elif mode == "full":
                        if fn is real_save:
                            fn(*a, **k)  # the disk fills up as the last bytes go out
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    else:
                        os.kill(os.getpid(), getattr(signal, mode))
                return fn(*a, **k)
            return step
        for module, name in STEPS:
            setattr(module, name, wrap(getattr(module, name)))
        real_exit = os._exit
        os._exit = lambda code: real_exit(99 if calls[0] < n else code)  # 99: the run ended before step n
        sys.argv = ["dql-pass", *args]
        cli.run()

    real_save = onnx.save_model
    codes = []
    for n in range(1, 80):
        pid = os.fork()
        if pid == 0:
            child(n)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code == 99:
            break
        codes.append(code)
        shutil.copytree(out_dir, os.path.join(snapshots, str(n)), symlinks=True)
    print(json.dumps(codes))
''')


def assert_bad_input(run: Result | subprocess.CompletedProcess, message: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr that holds ``message``, no traceback."""
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert run.stdout == "" and "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith("dql-pass: error: ") and message in run.stderr, run.stderr


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def _sample_bytes(name: str) -> bytes:
    return (MODELS / f"{name}.onnx").read_bytes()


def sample(name: str) -> onnx.ModelProto:
    """A fresh copy of models/NAME.onnx (read from disk once)."""
    return onnx.load_from_string(_sample_bytes(name))


def dql_outputs(model: onnx.ModelProto | ir.Model) -> dict[str, list[tuple[str, ...]]]:
    """Graph path -> the output names of its DQL nodes."""
    if isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    return {
        label: sorted(tuple(v.name for v in node.outputs) for node in nodes)
        for label, nodes in dql_pass.find_sites(model).items()
    }


def edit_graph(model: onnx.ModelProto, edit: Callable[[ir.Graph], None]) -> onnx.ModelProto:
    """A copy of ``model`` with ``edit`` applied to its main graph."""
    ir_model = ir.serde.deserialize_model(model)
    edit(ir_model.graph)
    return ir.serde.serialize_model(ir_model)


def site_nodes(graph: ir.Graph, prefix: str = "input_QuantizeLinear/") -> dict[str, ir.Node]:
    """The nodes dql_pass stamped for the DQL named ``input_QuantizeLinear``, by op type and occurrence."""
    nodes: dict[str, ir.Node] = {}
    for node in graph:
        if node.name.startswith(prefix):
            key = node.op_type
            while key in nodes:
                key += "'"
            nodes[key] = node
    return nodes


def without_clip(graph: ir.Graph) -> None:
    """y = Cast(Add(...)) without the Clip to [0, 255] (arithmetic variant): a near miss fusion leaves alone."""
    clip = site_nodes(graph)["Clip"]
    clip.outputs[0].replace_all_uses_with(clip.inputs[0])
    graph.remove(clip, safe=True)


def onnx_body(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every DQL replaced by ONNX's own function body, as onnx's inliner writes it (unguarded)."""
    return onnx.inliner.inline_selected_functions(model, [("", "DynamicQuantizeLinear")], inline_schema_functions=True)


def dql_model(opset: int, rank: int = 1, domain: str = "") -> onnx.ModelProto:
    """A model holding one DynamicQuantizeLinear node on an input of ``rank`` symbolic dims."""
    return one_node_model([f"d{i}" for i in range(rank)], opset, domain=domain)


def with_custom_op(model: onnx.ModelProto, source: str) -> onnx.ModelProto:
    """``model``, changed in place: a node of an unknown domain (com.example's Custom, which ORT cannot load)
    reads ``source``, its output ``o`` a graph output."""
    model.graph.node.append(helper.make_node("Custom", [source], ["o"], domain="com.example"))
    model.graph.output.append(helper.make_tensor_value_info("o", TensorProto.FLOAT, []))
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    return model


def embedding_model(rows: int) -> onnx.ModelProto:
    """Token ids [batch, sequence] (the only input) through an embedding of ``rows`` rows, then a DQL."""
    table = np.random.default_rng(0).standard_normal((rows, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Cast", ["input_ids"], ["ids"], to=TensorProto.INT32),
        helper.make_node("Gather", ["embedding", "ids"], ["embedded"]),
        helper.make_node("DynamicQuantizeLinear", ["embedded"], ["q", "q_scale", "q_zero_point"], name="dql"),
    ]
    outputs = [helper.make_tensor_value_info(n, t, s) for n, t, s in (
        ("q", TensorProto.UINT8, ["batch", "sequence", 8]), ("q_scale", TensorProto.FLOAT, []),
        ("q_zero_point", TensorProto.UINT8, []))]
    inputs_ = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])]
    graph = helper.make_graph(nodes, "embedding", inputs_, outputs, [numpy_helper.from_array(table, "embedding")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model, full_check=True)
    return model


def weighted_model(folder: Path, name: str, weight: float, offset: float, *, data: str | None = None) -> Path:
    """x -> DQL, and out = w + offset with w (16 KiB) in external data ``data`` (default ``name.data``).

    Models with different ``offset`` compute different outputs from the same weights, so an old
    model read with new weights gives a third answer, not either model's.
    """
    w = numpy_helper.from_array(np.full((64, 64), weight, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"]),
         helper.make_node("Add", ["w", "k"], ["out"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [4]),
         helper.make_tensor_value_info("out", TensorProto.FLOAT, [64, 64])],
        initializer=[w, numpy_helper.from_array(np.array(offset, np.float32), "k")],
    )
    path = folder / name
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path,
              save_as_external_data=True, location=data or f"{name}.data", size_threshold=1024)
    return path


def computed(path: Path) -> float:
    """What the weighted model at ``path`` computes for ``out`` (one value: w + offset everywhere)."""
    out = session(onnx.load(path)).run({"x": np.ones(4, np.float32)}, ["out"])[0]
    assert np.unique(out).size == 1, "a torn model: its weights are not one value"
    return float(out.flat[0])


def referenced(path: Path) -> set[str]:
    """The external data files the model at ``path`` refers to."""
    model = onnx.load(path, load_external_data=False)
    return {entry.value for tensor in onnx.external_data_helper._get_all_tensors(model)
            for entry in tensor.external_data if entry.key == "location"}


def assert_tidy(folder: Path, model: str, *others: str) -> None:
    """``folder`` holds the model, the data it refers to, ``others``, and nothing else."""
    assert sorted(p.name for p in folder.iterdir()) == sorted({model, *referenced(folder / model), *others})


def quantized_model(path: Path, location: str, *, kept_weight: bool = False) -> Path:
    """x -> DQL -> MatMulInteger with an int8 weight w in external data ``location``, which lower
    drops; with ``kept_weight`` also out = v + 1 with a float weight v there, which lower keeps."""
    w = numpy_helper.from_array((np.arange(64 * 64) % 251 - 125).astype(np.int8).reshape(64, 64), "w")
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("MatMulInteger", ["q", "w", "z"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 64])]
    initializers = [w]
    if kept_weight:
        initializers += [numpy_helper.from_array(np.full((64, 64), 3.0, np.float32), "v"),
                         numpy_helper.from_array(np.array(1.0, np.float32), "one")]
        nodes.append(helper.make_node("Add", ["v", "one"], ["out"]))
        outputs.append(helper.make_tensor_value_info("out", TensorProto.FLOAT, [64, 64]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])], outputs,
                              initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (path.parent / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path, save_as_external_data=True, location=location, size_threshold=1024)
    return path


def files_of(folder: Path) -> dict[str, str]:
    """The regular files of ``folder`` (not links), by name, with their digests."""
    return {p.name: digest(p) for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


def independent_inputs() -> list[np.ndarray]:
    """The inputs built apart from the catalogue, every kind of them (:func:`dql_pass.inputs.independent_inputs`)."""
    return [x for _, x in inputs.independent_inputs(150, seed=2026)]


_TORCHVISION = ("it imports torchvision, which loads only beside torch's CUDA build (5.5 GB), not beside the CPU "
                "wheel of torch 2.13.0 on this machine's disk ('operator torchvision::nms does not exist')")

# Why CI leaves a runtime out of the test extra (pyproject.toml), which installs every other adapter.
LEFT_OUT_OF_CI = {
    "onnxruntime-cuda": "it needs an NVIDIA GPU, and CI has none: python -m tools.runtimes --runtime onnxruntime-cuda "
                        "measures it where there is one",
    "tinygrad": "its CPU device compiles with clang, which pip cannot install (apt-get install clang)",
    "iree": "480 MB and some 45 s of tests, to stay well inside its 10-minute budget",
    "onnx2torch": _TORCHVISION,
    "onnx2pytorch": _TORCHVISION,
    **dict.fromkeys(("litert", "litert-xnnpack"), "onnx2tf's environment takes 660 MB and 80 to 150 s to install, "
                    "and a conversion 1 to 4 s per input shape: python -m tools.runtimes --runtime litert measures it"),
}


def installed(name: str) -> runtimes.Runtime:
    """The runtime ``name``; when it is not installed, the test is skipped, saying how to install it
    and why CI does not."""
    runtime = runtimes.get(name)
    if not runtime.installed():
        why = (f"CI leaves it out: {LEFT_OUT_OF_CI[name]}" if name in LEFT_OUT_OF_CI
               else "CI installs it through the test extra: pip install '.[test]'" if runtime.extra
               else "CI sets it up after the README's test command (.ci/run)")
        pytest.skip(f"{name} is not installed: {runtime.install_hint()} ({why})")
    return runtime


def session(model: onnx.ModelProto | str, *, optimize: bool = True) -> runtimes.Session:
    """One-thread ORT CPU session; ``optimize=False`` runs every node as written (no fusion, no folding)."""
    return runtimes.get("onnxruntime").load(model, threads=1, optimize="all" if optimize else "none")


def assert_outputs_bits_equal(actual, expected) -> None:
    """As many outputs on both sides, each equal in dtype, shape and bits."""
    actual, expected = list(actual), list(expected)
    assert len(actual) == len(expected), (len(actual), len(expected))
    for got, want in zip(actual, expected):
        assert_bits_equal(got, want)


def assert_bits_equal(actual, expected) -> None:
    """Equal dtype, shape and bits (float32 through its uint32 view, so -0.0 and 0.0 differ)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype == np.float32:
        actual, expected = actual.view(np.uint32), expected.view(np.uint32)
    np.testing.assert_array_equal(actual, expected)


@functools.cache
def onnx_node_tests(expanded: bool = False) -> list:
    """ONNX's own DQL node tests (the one-node models, or with ``expanded`` their ``_expanded`` forms), as its
    loader builds them: importing the op's case module alone builds its cases, where the loader builds every op's."""
    cases = importlib.import_module("onnx.backend.test.case.node")
    importlib.import_module("onnx.backend.test.case.node.dynamicquantizelinear")
    tests = getattr(cases, "_NodeTestCases", None)  # where expect() collects them; the loader returns it
    if tests is None:  # a newer onnx keeps them elsewhere: its loader, which builds them all
        tests = onnx.backend.test.loader.load_model_tests(kind="node")
    found = [t for t in tests if t.name.startswith("test_dynamicquantizelinear") and ("expanded" in t.name) == expanded]
    assert len(found) == 3, [t.name for t in found]  # the spec's three examples
    return found


@functools.cache
def newest_ort_opset() -> int:
    """The newest ai.onnx opset at which ORT runs the expanded quantizelinear variant."""
    for opset in range(MAX_OPSET, 10, -1):
        try:
            # The probe asks ORT itself, not the table of what it lacks.
            session(dql_pass.expand(dql_model(opset), runtime=None)[0])
        except runtimes.RuntimeFailure as failure:
            if "NotImplemented" not in str(failure):  # only an opset newer than ORT's kernels is expected
                raise
            continue
        assert opset >= 21, f"the ORT this project needs runs opset 21 and more, not only {opset}"
        return opset
    raise RuntimeError("ORT runs no expanded opset")


@functools.cache
def cached_session(opset: int, rank: int, variant: str | None = None, mode: str = "inline") -> runtimes.Session:
    """ORT session for the one-node model (``variant=None``) or its expansion."""
    model = dql_model(opset, rank)
    return session(model if variant is None else dql_pass.expand(model, variant=variant, mode=mode)[0])


def run_cached(x: np.ndarray, opset: int = 13, variant: str | None = None, mode: str = "inline") -> list:
    return cached_session(opset, x.ndim, variant, mode).run({"x": x})


def site_pairs(model: onnx.ModelProto) -> set[tuple[str, str]]:
    """(input name, y_scale name) of every DQL: the operands of the Div that quantizes x."""
    sites = dql_pass.find_sites(ir.from_proto(model))
    return {(n.inputs[0].name, n.outputs[1].name) for nodes in sites.values() for n in nodes}


def quotients(model: ir.Model, pairs: set[tuple[str, str]]) -> list[ir.Node]:
    return [
        node for node in ir.traversal.RecursiveGraphIterator(model.graph)
        if node.op_type == "Div" and (node.inputs[0].name, node.inputs[1].name) in pairs
    ]


def reciprocal_rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
    """The arithmetic expansion with x * Reciprocal(scale) in place of x / scale."""
    rewritten = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    for div in quotients(rewritten, site_pairs(model)):
        inverse = ir.node("Reciprocal", [div.inputs[1]])
        product = ir.node("Mul", [div.inputs[0], inverse.outputs[0]])
        div.graph.insert_before(div, [inverse, product])
        div.outputs[0].replace_all_uses_with(product.outputs[0])
        div.graph.remove(div, safe=True)
    return ir.to_proto(rewritten)


def constant_node(value: np.ndarray) -> ir.Node:
    return ir.node("Constant", [], attributes={"value": ir.tensor(value)})


def round_half_up(graph: ir.Graph) -> None:
    """Every Round of ``graph`` replaced by Floor(v + 0.5): ties round up, not to even."""
    for node in list(graph):
        if node.op_type == "Round":
            half = constant_node(np.float32(0.5))
            shifted = ir.node("Add", [node.inputs[0], half.outputs[0]])
            floored = ir.node("Floor", [shifted.outputs[0]])
            graph.insert_before(node, [half, shifted, floored])
            node.outputs[0].replace_all_uses_with(floored.outputs[0])
            graph.remove(node, safe=True)


def value_map(model: ir.Model) -> dict[str, ir.Value]:
    values = {v.name: v for v in model.graph.inputs}
    values.update((v.name, v) for node in model.graph for v in node.outputs)
    return values


def dangling_dql_rewrite(model: onnx.ModelProto, *, half_up: bool = True) -> onnx.ModelProto:
    """The arithmetic expansion with its DQL outputs renamed (the readers follow), and the original
    DQL nodes kept under the old names, read by nothing; ``half_up`` breaks the expansion's rounding."""
    rewritten = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    if half_up:
        round_half_up(rewritten.graph)
    values = value_map(rewritten)
    for nodes in dql_pass.find_sites(ir.from_proto(model)).values():
        for site in nodes:
            dangling = ir.node("DynamicQuantizeLinear", [values[site.inputs[0].name]], num_outputs=3, name=site.name)
            for copy, output in zip(dangling.outputs, site.outputs):
                values[output.name].name = f"{output.name}_computed"
                copy.name = output.name
            rewritten.graph.append(dangling)
    return ir.to_proto(rewritten)
