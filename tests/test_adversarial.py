"""The command line as an adversarial user drives it, as a real process: nothing lost, nothing falsely passed.

Every test here runs ``python -m dql_pass`` (or the CLI entry point in a forked child with injected
failures) and checks what is on disk afterwards: the input untouched, the output the complete old
model with its data or the complete new one, no debris, one line and exit 2 for bad input.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from helpers import MODELS, constant_node, dangling_dql_rewrite, digest, dql_model, session, value_map
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import suites

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _limit_memory() -> None:
    # Well above what any command needs (about 2.5 GB of address space with ORT loaded), so that a
    # process reading /dev/zero to the end fails its test instead of the machine.
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def dql_pass_cli(*args: str | os.PathLike, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m dql_pass ARGS``, with a timeout (a wait on a FIFO fails the test) and a memory cap."""
    return subprocess.run([sys.executable, "-m", "dql_pass", *map(str, args)], capture_output=True, text=True,
                          check=False, cwd=cwd, timeout=timeout, preexec_fn=_limit_memory)


def assert_bad_input(run: subprocess.CompletedProcess, message: str) -> None:
    """Exit 2, nothing on stdout, one line on stderr that holds ``message``, no traceback."""
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert run.stdout == "" and "Traceback" not in run.stderr and run.stderr.count("\n") == 1, run.stderr
    assert run.stderr.startswith("dql-pass: error: ") and message in run.stderr, run.stderr


def weighted_model(folder: Path, name: str, weight: float, offset: float, *, data: str | None = None) -> Path:
    """x -> DQL, and out = w + offset with w (16 KiB) in external data ``data`` (default ``name.data``).

    Models with different ``offset`` compute different outputs from the same weights, so an old
    model read with new weights gives a third answer, not either model's.
    """
    w = onnx.numpy_helper.from_array(np.full((64, 64), weight, np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"]),
         helper.make_node("Add", ["w", "k"], ["out"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [4]),
         helper.make_tensor_value_info("out", TensorProto.FLOAT, [64, 64])],
        initializer=[w, onnx.numpy_helper.from_array(np.array(offset, np.float32), "k")],
    )
    path = folder / name
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path,
              save_as_external_data=True, location=data or f"{name}.data", size_threshold=1024)
    return path


def computed(path: Path) -> float:
    """What the model at ``path`` computes for ``out`` (one value: w + offset everywhere)."""
    out = session(onnx.load(path)).run({"x": np.ones(4, np.float32)}, ["out"])[0]
    assert np.unique(out).size == 1, "a torn model: its weights are not one value"
    return float(out.flat[0])


def referenced(path: Path) -> set[str]:
    model = onnx.load(path, load_external_data=False)
    return {entry.value for tensor in onnx.external_data_helper._get_all_tensors(model)
            for entry in tensor.external_data if entry.key == "location"}


def assert_tidy(folder: Path, model: str, *others: str) -> None:
    """``folder`` holds the model, the data it refers to, ``others``, and nothing else."""
    assert sorted(p.name for p in folder.iterdir()) == sorted({model, *referenced(folder / model), *others})


# Links: no write of ours goes through one, and none reaches a file the input consists of.

def test_links_at_the_output_and_its_old_data_name_are_replaced_not_followed(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "cache").mkdir()
    source = weighted_model(tmp_path / "in", "a.onnx", 1.0, 1.0)
    cached = tmp_path / "cache" / "shared.bin"
    cached.write_bytes(b"a file in a shared model cache")
    out = tmp_path / "out" / "x.onnx"
    # The old data name, and a likely one, point to the input model and to the cache.
    (tmp_path / "out" / "x.onnx.data").symlink_to(source)
    (tmp_path / "out" / "x.onnx.000000000000.data").symlink_to(cached)
    out.symlink_to(cached)
    before = {p: digest(p) for p in (source, source.with_name("a.onnx.data"), cached)}
    run = dql_pass_cli("expand", source, "-o", out)
    assert run.returncode == 0, run.stderr
    assert {p: digest(p) for p in before} == before
    assert not out.is_symlink() and out.is_file()
    assert computed(out) == 2.0


def test_an_output_linked_to_the_input_replaces_the_link(tmp_path):
    source = weighted_model(tmp_path, "a.onnx", 1.0, 1.0)
    link = tmp_path / "link.onnx"
    link.symlink_to(source)
    before = digest(source), digest(source.with_name("a.onnx.data"))
    assert dql_pass_cli("expand", source, "-o", link).returncode == 0
    assert (digest(source), digest(source.with_name("a.onnx.data"))) == before
    assert not link.is_symlink() and computed(link) == 2.0


def test_an_output_over_the_inputs_data_is_refused_even_through_a_link(tmp_path):
    (tmp_path / "out").mkdir()
    source = weighted_model(tmp_path, "a.onnx", 1.0, 1.0)
    data = source.with_name("a.onnx.data")
    before = digest(data)
    assert_bad_input(dql_pass_cli("expand", source, "-o", data), "external data")
    (tmp_path / "out" / "d").symlink_to(tmp_path)
    assert_bad_input(dql_pass_cli("expand", source, "-o", tmp_path / "out" / "d" / "a.onnx"), "input path")
    assert digest(data) == before


# Special files are never replaced.

def _special_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    found = {"fifo": fifo}
    if IS_ROOT:
        null = tmp_path / "null"
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
        found["device"] = null
    return found


@pytest.mark.parametrize("command", ["expand", "fuse", "verify --json"])
def test_special_files_are_never_replaced(tmp_path, command):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    specials = _special_files(tmp_path)  # a FIFO, and a device node where we are root
    for kind, path in specials.items():
        mode = os.lstat(path).st_mode
        if command == "verify --json":
            run = dql_pass_cli("verify", source, source, "--json", path, timeout=120)
        else:
            run = dql_pass_cli(command, source, "-o", path, timeout=120)
        assert_bad_input(run, "not a regular file")
        assert os.lstat(path).st_mode == mode, kind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.onnx", *(p.name for p in specials.values())])


@pytest.mark.parametrize("output", ["", ".", "./", "sub/"])
def test_an_output_that_names_no_file_is_one_line(tmp_path, output):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    (tmp_path / "sub").mkdir()
    assert_bad_input(dql_pass_cli("expand", source, "-o", output, cwd=tmp_path), "")


# Injected failures between any two steps of a write.

_DRIVER = textwrap.dedent(r'''
    import errno, json, os, shutil, signal, sys
    from dql_pass import cli

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

_EXPECTED_CODE = {"kill": -signal.SIGKILL, "full": 2, "SIGINT": 130, "SIGTERM": 143}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the driver forks one child per injected step")
@pytest.mark.parametrize("mode", list(_EXPECTED_CODE))
def test_a_failure_between_any_two_steps_keeps_a_whole_pair(tmp_path, mode):
    """Replace out.onnx (model a, data A) by model b (data B), failing at step 1, 2, 3, ... of the write.

    After each failure out.onnx is the whole old pair or the whole new one, and where the process
    could still clean up (a full disk, Ctrl-C, SIGTERM) and the old pair stayed, it left nothing
    else behind. A kill -9, or a failure after the new model is in place, may leave an unreferenced
    file; the next successful run removes it.
    """
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "snapshots").mkdir()
    old = weighted_model(tmp_path / "in", "a.onnx", 1.0, 1.0)
    new = weighted_model(tmp_path / "in", "b.onnx", 5.0, 2.0)
    out = tmp_path / "out" / "out.onnx"
    assert dql_pass_cli("expand", old, "-o", out).returncode == 0
    args = ["expand", str(new), "-o", str(out)]
    run = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(args), str(out.parent), str(tmp_path / "snapshots"), mode],
                         capture_output=True, text=True, check=True, timeout=300)
    codes = json.loads(run.stdout.splitlines()[-1])
    assert len(codes) >= 8, codes  # every step of the write was hit
    states = []
    for n, code in enumerate(codes, 1):
        snapshot = tmp_path / "snapshots" / str(n)
        state = computed(snapshot / "out.onnx")
        assert state in (2.0, 7.0), f"step {n}: a model read with data not its own ({state})"
        states.append(state)
        if mode != "kill":
            assert code in (_EXPECTED_CODE[mode], 0), (n, code)
            if state == 2.0:  # the write undid itself (once the new model is in, tidying up may be cut short)
                assert_tidy(snapshot, "out.onnx")
    assert states[0] == 2.0 and states[-1] == 7.0
    assert all(code == _EXPECTED_CODE[mode] for code, state in zip(codes, states) if state == 2.0)
    # The next run clears whatever the kills left.
    assert dql_pass_cli("expand", new, "-o", out).returncode == 0
    assert_tidy(out.parent, "out.onnx")
    assert computed(out) == 7.0


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs, for a real full disk; mounting one needs root and the mount capability."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


def test_a_real_full_disk_keeps_the_old_pair_and_leaves_nothing(tmp_path, small_disk):
    old = weighted_model(tmp_path, "a.onnx", 1.0, 1.0)
    w = onnx.numpy_helper.from_array(np.full((512, 512), 5.0, np.float32), "w")  # 1 MiB: more than the disk
    model = onnx.load(old)
    model.graph.initializer[0].CopyFrom(w)
    model.graph.output[1].type.tensor_type.shape.dim[0].dim_value = 512
    model.graph.output[1].type.tensor_type.shape.dim[1].dim_value = 512
    onnx.save(model, tmp_path / "big.onnx", save_as_external_data=True, location="big.data", size_threshold=1024)
    out = small_disk / "out.onnx"
    assert dql_pass_cli("expand", old, "-o", out).returncode == 0
    before = {p.name: digest(p) for p in small_disk.iterdir()}
    assert_bad_input(dql_pass_cli("expand", tmp_path / "big.onnx", "-o", out), "No space left")
    assert {p.name: digest(p) for p in small_disk.iterdir()} == before
    assert computed(out) == 2.0


def test_concurrent_writers_leave_one_whole_pair(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    inputs = [weighted_model(tmp_path / "in", f"m{i}.onnx", float(i), 100.0 * i) for i in range(1, 4)]
    out = tmp_path / "out" / "out.onnx"
    procs = [subprocess.Popen([sys.executable, "-m", "dql_pass", "expand", str(inputs[i % 3]), "-o", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(6)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 6, [p.stderr.read() for p in procs]
    assert computed(out) in {101.0 * i for i in range(1, 4)}
    assert_tidy(out.parent, "out.onnx")


def _wait_for_stage(folder: Path, process: subprocess.Popen) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if any(p.name.endswith(".stage") for p in folder.iterdir()):
            return True
        time.sleep(0.002)
    return False


def _signals_as_by_default() -> None:
    """In a child before it starts: the stopping signals at their defaults, though pytest runs in
    the background (SIGINT ignored) or under nohup (SIGHUP ignored), which the child would inherit."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_real_interrupt_says_so_and_leaves_nothing(tmp_path, sig, code):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    w = onnx.numpy_helper.from_array(np.ones((4096, 4096), np.float32), "w")  # 64 MiB to stream
    model = dql_model(13)
    model.graph.initializer.append(w)
    onnx.save(model, tmp_path / "in" / "big.onnx", save_as_external_data=True, location="big.data")
    for _ in range(5):  # the write must be under way when the signal lands
        process = subprocess.Popen([sys.executable, "-m", "dql_pass", "expand", str(tmp_path / "in" / "big.onnx"),
                                    "-o", str(tmp_path / "out" / "o.onnx")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, preexec_fn=_signals_as_by_default)
        if _wait_for_stage(tmp_path / "out", process):
            process.send_signal(sig)
            _, err = process.communicate(timeout=60)
            assert process.returncode == code, err
            assert err == "dql-pass: interrupted\n"
            assert list((tmp_path / "out").iterdir()) == []
            return
        process.communicate(timeout=60)
        for path in (tmp_path / "out").iterdir():
            path.unlink()
    pytest.fail("the write never got under way before it finished")


# A sitecustomize that sends the process a signal as it starts to import a given module: a
# Ctrl-C at a chosen moment of the start, every time.
_SIGNAL_AT_IMPORT = textwrap.dedent('''
    import os, signal, sys

    class SignalAtImport:
        def find_spec(self, name, path=None, target=None):
            if name == os.environ["SIGNAL_AT"]:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL"]))
            return None

    sys.meta_path.insert(0, SignalAtImport())
''')
_ENTRY_POINTS = {"module": ["-m", "dql_pass"],
                 "script": ["-c", "import sys; from dql_pass.__main__ import run; sys.argv[0] = 'dql-pass'; run()"]}


@pytest.mark.parametrize("entry, name, at", [
    ("module", "SIGINT", "dql_pass.interrupts"), ("module", "SIGINT", "dql_pass.cli"), ("module", "SIGINT", "argparse"),
    ("module", "SIGINT", "dql_pass.variants"), ("module", "SIGINT", "onnx"), ("script", "SIGINT", "dql_pass.interrupts"),
    ("script", "SIGINT", "json"), ("module", "SIGTERM", "logging"), ("script", "SIGHUP", "dql_pass.cli"),
])
def test_a_signal_while_the_command_line_loads_ends_it_with_one_line(tmp_path, entry, name, at):
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(_SIGNAL_AT_IMPORT)
    source = tmp_path / "in.onnx"
    onnx.save(dql_model(13), source)
    env = {**os.environ, "SIGNAL_AT": at, "SIGNAL": name,
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "hook"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run([sys.executable, *_ENTRY_POINTS[entry], "expand", str(source), "-o", str(tmp_path / "out.onnx")],
                         capture_output=True, text=True, env=env, timeout=120, preexec_fn=_signals_as_by_default)
    assert (run.returncode, run.stderr) == (128 + getattr(signal, name), "dql-pass: interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hook", "in.onnx"]


# External data and permissions.

def test_an_external_tensor_with_only_a_location_is_read_from_offset_zero(tmp_path):
    source = weighted_model(tmp_path, "a.onnx", 3.0, 1.0)
    model = onnx.load(source, load_external_data=False)
    for tensor in model.graph.initializer:
        if tensor.external_data:
            del tensor.external_data[1:]  # location only
    onnx.save(model, tmp_path / "loc.onnx")
    (tmp_path / "out").mkdir()
    for command in ("expand", "fuse"):
        out = tmp_path / "out" / f"{command}.onnx"
        run = dql_pass_cli(command, tmp_path / "loc.onnx", "-o", out)
        assert run.returncode == 0, run.stderr
        assert computed(out) == 4.0
    run = dql_pass_cli("verify", tmp_path / "loc.onnx", tmp_path / "out" / "expand.onnx")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stdout + run.stderr


@pytest.mark.parametrize("length", ["16", "4000000000"])
def test_a_declared_length_that_is_not_the_tensors_size_is_refused(tmp_path, length):
    source = weighted_model(tmp_path, "a.onnx", 3.0, 1.0)
    model = onnx.load(source, load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "length":
                entry.value = length
    onnx.save(model, tmp_path / "bad.onnx")
    (tmp_path / "out").mkdir()
    assert_bad_input(dql_pass_cli("expand", tmp_path / "bad.onnx", "-o", tmp_path / "out" / "o.onnx"), "bytes")
    assert list((tmp_path / "out").iterdir()) == []


def test_an_output_linked_to_a_folder_is_refused_like_a_folder(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outlink").symlink_to(tmp_path / "outdir")
    assert_bad_input(dql_pass_cli("expand", source, "-o", tmp_path / "outlink"), "links to a folder")
    assert (tmp_path / "outlink").is_symlink()


def test_an_unsupported_onnxscript_is_one_line_for_fuse(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    code = ("import sys, onnxscript; onnxscript.__version__ = '0.9.0'; from dql_pass import cli; "
            f"sys.argv = ['dql-pass', 'fuse', {str(source)!r}, '-o', {str(tmp_path / 'o.onnx')!r}]; cli.run()")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120)
    assert_bad_input(run, "onnxscript 0.9.0 is installed")


def test_private_weights_stay_private(tmp_path):
    (tmp_path / "out").mkdir()
    source = weighted_model(tmp_path, "a.onnx", 3.0, 1.0)
    os.chmod(source.with_name("a.onnx.data"), 0o600)
    os.chmod(source, 0o640)
    out = tmp_path / "out" / "o.onnx"
    assert dql_pass_cli("expand", source, "-o", out).returncode == 0
    (data,) = referenced(out)
    assert stat.S_IMODE(os.stat(out.parent / data).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640


def test_an_npy_header_larger_than_its_file_is_one_line(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    header = tmp_path / "huge.npy"
    with open(header, "wb") as file:
        np.lib.format.write_array_header_1_0(file, {"descr": "<f4", "fortran_order": False, "shape": (10**12,)})
        file.write(bytes(16))
    assert_bad_input(dql_pass_cli("verify", source, source, "--input", f"x={header}"), "declares 4,000,000,000,000 bytes")


def test_a_sparse_npy_beyond_what_verify_allows_is_refused_before_it_is_read(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    sparse = tmp_path / "sparse.npy"
    with open(sparse, "wb") as file:  # a valid header over 8 GiB of holes: nothing is read
        np.lib.format.write_array_header_1_0(file, {"descr": "<f4", "fortran_order": False, "shape": (2**31,)})
        file.truncate(file.tell() + 4 * 2**31)
    assert_bad_input(dql_pass_cli("verify", source, source, "--input", f"x={sparse}"), "GiB verify allows")


def test_an_opset_ort_cannot_run_for_the_variant_is_refused_naming_one_it_can(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(28), source)
    assert_bad_input(dql_pass_cli("expand", source, "-o", tmp_path / "o.onnx"), "the variant arithmetic or float64 or residual or portable or lean runs there")
    assert not (tmp_path / "o.onnx").exists()
    assert dql_pass_cli("expand", source, "-o", tmp_path / "o.onnx", "--variant", "arithmetic").returncode == 0
    session(onnx.load(tmp_path / "o.onnx"))


# Every output of a rewriting command loads in ORT whenever its input does.

def _clashing_names_model() -> onnx.ModelProto:
    """Node names that are the names expand and fuse derive for the DQL's nodes."""
    model = dql_model(13)
    model.graph.node[0].name = "q"
    taken = ["q/ReduceMin", "q/QuantizeLinear", "q/Cast", "q/Div", "q_1", "q_2", "DynamicQuantizeLinear"]
    for i, name in enumerate(taken):
        model.graph.node.append(helper.make_node("Identity", ["y_scale" if i == 0 else f"i{i - 1}"], [f"i{i}"], name=name))
    model.graph.output.append(helper.make_tensor_value_info(f"i{len(taken) - 1}", TensorProto.FLOAT, []))
    return model


@pytest.mark.parametrize("source", sorted(MODELS.glob("*.onnx")), ids=lambda p: p.stem)
def test_expanded_and_fused_samples_load_in_ort(source):
    session(onnx.load(source))
    for variant in dql_pass.VARIANTS:
        for mode in dql_pass.MODES:
            expanded = dql_pass.expand(onnx.load(source), variant=variant, mode=mode)[0]
            session(expanded)
            session(dql_pass.fuse(expanded)[0])


def test_names_that_clash_with_derived_ones_still_load_in_ort(tmp_path):
    source = tmp_path / "clash.onnx"
    model = _clashing_names_model()
    assert len({n.name for n in model.graph.node}) == len(model.graph.node)
    onnx.save(model, source)
    session(model)
    for variant in dql_pass.VARIANTS:
        expanded, fused = tmp_path / f"{variant}.onnx", tmp_path / f"{variant}_fused.onnx"
        assert dql_pass_cli("expand", source, "-o", expanded, "--variant", variant).returncode == 0
        session(onnx.load(expanded))
        assert dql_pass_cli("fuse", expanded, "-o", fused).returncode == 0
        session(onnx.load(fused))


# Siblings found in a second round.

def test_an_output_beside_another_outputs_data_gets_its_own(tmp_path):
    """fuse b -o c beside b once referred to b's data file, which the next write of b removed."""
    (tmp_path / "out").mkdir()
    source = weighted_model(tmp_path, "a.onnx", 3.0, 1.0)
    b, c = tmp_path / "out" / "b.onnx", tmp_path / "out" / "c.onnx"
    assert dql_pass_cli("expand", source, "-o", b).returncode == 0
    assert dql_pass_cli("fuse", b, "-o", c).returncode == 0
    assert referenced(c).isdisjoint(referenced(b))
    assert dql_pass_cli("expand", source, "-o", b).returncode == 0
    assert computed(c) == 4.0


@pytest.mark.parametrize("command", ["expand", "verify --json"])
def test_a_link_to_a_special_file_is_never_replaced(tmp_path, command):
    """/dev/stdout is a link to /proc/self/fd/1: replacing it would break the machine."""
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    os.mkfifo(tmp_path / "fifo")
    link = tmp_path / "stdout"
    link.symlink_to(tmp_path / "fifo")
    if command == "expand":
        run = dql_pass_cli("expand", source, "-o", link, timeout=60)
    else:
        run = dql_pass_cli("verify", source, source, "--json", link, timeout=60)
    assert_bad_input(run, "links to a device, FIFO or socket")
    assert link.is_symlink() and stat.S_ISFIFO(os.stat(link).st_mode)


def test_the_report_never_overwrites_an_input_array(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    array = tmp_path / "x.npy"
    np.save(array, np.linspace(-1, 1, 8, dtype=np.float32))
    before = digest(array)
    assert_bad_input(dql_pass_cli("verify", source, source, "--input", f"x={array}", "--json", array), "input array")
    assert digest(array) == before


def test_an_input_array_that_is_a_fifo_is_refused_without_waiting(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    os.mkfifo(tmp_path / "x.npy")
    assert_bad_input(dql_pass_cli("verify", source, source, "--input", f"x={tmp_path / 'x.npy'}", timeout=60),
                     "not a regular file")


@pytest.mark.parametrize("option", [["--seed", "-1"], ["--samples", "-3"], ["--dim", "d0=\u00b2"]])
def test_numbers_that_are_not_whole_numbers_are_one_line(tmp_path, option):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    assert_bad_input(dql_pass_cli("verify", source, source, *option), "whole number")


def test_an_output_with_a_long_name_is_written(tmp_path):
    (tmp_path / "out").mkdir()
    source = weighted_model(tmp_path, "a.onnx", 3.0, 1.0)
    out = tmp_path / "out" / ("m" * 245 + ".onnx")
    for _ in range(2):  # the second write sweeps what the first left
        run = dql_pass_cli("expand", source, "-o", out)
        assert run.returncode == 0, run.stderr
        assert computed(out) == 4.0
        assert_tidy(out.parent, out.name)


# Hostile conformance suites: run-tests and gen-tests answer, never hang, never read without bound,
# never show what lies outside the suite, and never lose a user's file.

SPEC = "test_dynamicquantizelinear_spec_example_opset13"
SECRET = b"SECRET-BYTES-OUTSIDE-THE-SUITE"
# The most spec_example's input file may hold: x is float32[6], 16 bytes an element at most, plus 64 KiB.
X_LIMIT = 65536 + len("x") + 16 * 6


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("pristine") / "dql"
    suites.generate_suite(path, opsets=(13,), forms=("native",), names=("spec_example",))
    return path


@pytest.fixture()
def suite(pristine, tmp_path):
    """The pristine suite copied beside secret.bin, a file that run-tests must never show."""
    path = tmp_path / "dql"
    shutil.copytree(pristine, path)
    (tmp_path / "secret.bin").write_bytes(SECRET)
    return path


def _external(path, location: str) -> None:
    """Make the TensorProto file ``path`` keep its data at ``location``."""
    tensor = onnx.load_tensor(path)
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    path.write_bytes(tensor.SerializeToString())


def _external_zero(model_path, location: str) -> None:
    """Make the model add a zero, read from external data at ``location``, to x before its DQL."""
    model = onnx.load(model_path)
    zero = numpy_helper.from_array(np.zeros((), np.float32), "zero")
    zero.ClearField("raw_data")
    zero.data_location = TensorProto.EXTERNAL
    entry = zero.external_data.add()
    entry.key, entry.value = "location", location
    model.graph.initializer.append(zero)
    model.graph.node[0].input[0] = "x_plus_zero"
    model.graph.node.insert(0, helper.make_node("Add", ["x", "zero"], ["x_plus_zero"]))
    model_path.write_bytes(model.SerializeToString())


def _replace(path, make) -> None:
    path.unlink()
    make(path)


def _x_beside(data_set) -> None:
    x = numpy_helper.to_array(onnx.load_tensor(data_set / "input_0.pb"))
    (data_set / "x.bin").write_bytes(x.tobytes())
    _external(data_set / "input_0.pb", "x.bin")


def _zero_beside(folder) -> None:
    (folder / "zero.bin").write_bytes(bytes(4))
    _external_zero(folder / "model.onnx", "zero.bin")


def _no_outputs(folder, data_set) -> None:
    """A test that compares nothing: a model without graph outputs, and no output files."""
    model = onnx.load(folder / "model.onnx")
    del model.graph.output[:]
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    for path in data_set.glob("output_*.pb"):
        path.unlink()


# Each hostile folder: how its copy of spec_example is edited (given the folder and its data set), and its outcome,
# "STATUS" or "STATUS: detail"; a detail ending in "..." is the start of a refusal worded by onnx or ORT. What the
# backends word differently is a dict.
HOSTILE = {
    "missing_output": (lambda f, d: (d / "output_2.pb").unlink(), "FAIL: test_data_set_0/output_2.pb is missing"),
    "missing_input": (lambda f, d: (d / "input_0.pb").unlink(), "FAIL: test_data_set_0/input_0.pb is missing"),
    "fifo_input": (lambda f, d: _replace(d / "input_0.pb", os.mkfifo), "FAIL: test_data_set_0/input_0.pb is not a regular file"),
    "fifo_model": (lambda f, d: _replace(f / "model.onnx", os.mkfifo), "FAIL: model.onnx is not a regular file"),
    "symlink_to_dev_zero": (
        lambda f, d: _replace(d / "output_0.pb", lambda p: p.symlink_to("/dev/zero")),
        "FAIL: test_data_set_0/output_0.pb is outside the suite (through a symlink)",
    ),
    "symlink_outside": (
        lambda f, d: _replace(d / "output_0.pb", lambda p: p.symlink_to("../../../secret.bin")),
        "FAIL: test_data_set_0/output_0.pb is outside the suite (through a symlink)",
    ),
    "oversized_input": (
        lambda f, d: os.truncate(d / "input_0.pb", 2 << 30),  # sparse: costs no disk, and must not be read
        f"FAIL: test_data_set_0/input_0.pb holds {2 << 30} bytes, more than the {X_LIMIT} it may hold",
    ),
    # secret.bin is in the folder run-tests is started from, where it once looked.
    "external_from_current_folder": (
        lambda f, d: _external(d / "output_0.pb", "secret.bin"), "FAIL: test_data_set_0/output_0.pb: external data refused: ...",
    ),
    "external_escaping": (
        lambda f, d: _external(d / "output_0.pb", "../../../secret.bin"),
        "FAIL: test_data_set_0/output_0.pb: external data refused: ...",
    ),
    "external_absolute": (
        lambda f, d: _external(d / "output_0.pb", os.fspath(f.parent.parent / "secret.bin")),
        "FAIL: test_data_set_0/output_0.pb: external data refused: ...",
    ),
    "no_outputs": (_no_outputs, "FAIL: the model has no outputs"),
    "external_beside": (lambda f, d: _x_beside(d), "PASS"),
    "model_external_beside": (lambda f, d: _zero_beside(f), "PASS"),
    "model_external_escaping": (
        lambda f, d: _external_zero(f / "model.onnx", "../../secret.bin"),
        {
            "onnxruntime": "FAIL: Fail: [ONNXRuntimeError] : 1 : FAIL : External data path validation failed for "
                           "initializer: zero. Error: External data path escapes model directory...",
            "reference": "FAIL: ValidationError: Data of TensorProto ( tensor name: zero) should be file inside ...",
        },
    ),
}


def _device_node(folder, data_set) -> None:
    # A copy of /dev/zero's node (char 1,5) inside the suite: reading it would never end.
    _replace(data_set / "output_0.pb", lambda p: os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 5)))


if os.geteuid() == 0:  # making a device node takes root
    HOSTILE["device_node"] = (_device_node, "FAIL: test_data_set_0/output_0.pb is not a regular file")


@pytest.mark.parametrize("backend", ["onnxruntime", "reference"])
def test_hostile_files_fail_their_own_test_only(suite, backend):
    for name, (edit, _) in HOSTILE.items():
        folder = suite / f"test_hostile_{name}"
        shutil.copytree(suite / SPEC, folder)
        edit(folder, folder / "test_data_set_0")
    run = dql_pass_cli("run-tests", str(suite), "--backend", backend, cwd=suite.parent)
    assert run.stderr == "" and run.returncode == 1, (run.returncode, run.stderr)
    *lines, summary = run.stdout.splitlines()
    got = {}
    for line in lines:
        status, _, rest = line.partition(" ")
        if status not in ("PASS", "FAIL", "XFAIL", "SKIP"):
            continue  # the table of counts per form
        folder, _, detail = rest.partition(": ")
        got[folder] = f"{status}: {detail}" if detail else status
    expected = {f"test_hostile_{name}": want[backend] if isinstance(want, dict) else want for name, (_, want) in HOSTILE.items()}
    expected[SPEC] = "PASS"
    assert sorted(got) == sorted(expected)
    for folder, want in expected.items():
        matches = got[folder].startswith(want[:-3]) if want.endswith("...") else got[folder] == want
        assert matches, (folder, got[folder], want)
    passed = sum(want == "PASS" for want in expected.values())
    assert summary == f"{passed} passed, {len(expected) - passed} failed"
    assert "SECRET" not in run.stdout and "expected" not in run.stdout  # nothing read outside the suite is shown


# --- manifest.json: the suite as a whole is bad input ---


@pytest.mark.parametrize("make, reason", [
    (os.mkfifo, "manifest.json is not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "manifest.json is outside the suite (through a symlink)"),
])
def test_a_special_manifest_is_bad_input(suite, make, reason):
    _replace(suite / suites.MANIFEST, make)
    assert_bad_input(dql_pass_cli("run-tests", str(suite)), f"{suite}: {reason}")


# --- gen-tests: what it did not write is never lost ---


def test_gen_tests_keeps_a_file_the_user_added(suite):
    notes = suite / SPEC / "test_data_set_0" / "notes.txt"
    notes.write_text("mine")
    run = dql_pass_cli("gen-tests", str(suite), "--opsets", "13", "--variants", "native", "--no-large")
    assert_bad_input(run, (
        f"{suite}: the suite there holds 1 file(s) that gen-tests did not write ({SPEC}/test_data_set_0/notes.txt); "
        "move them away, or force the replacement"
    ))
    assert notes.read_text() == "mine"


def test_gen_tests_over_a_fifo_manifest_does_not_hang(suite):
    _replace(suite / suites.MANIFEST, os.mkfifo)
    run = dql_pass_cli("gen-tests", str(suite), "--opsets", "13", "--variants", "native", "--no-large")
    assert_bad_input(run, f"{suite}: a non-empty folder that holds no dql_pass suite; choose another output folder")
    assert stat.S_ISFIFO(os.lstat(suite / suites.MANIFEST).st_mode)


# --- gen-tests: OUTDIR is the whole old suite or the whole new one, even under kill -9 ---

# Run before _DRIVER: one catalogue case, so that each forked gen-tests writes one folder.
_ONE_CASE = textwrap.dedent('''
    from dql_pass import inputs

    one_case = [c for c in inputs.cases() if c.name == "spec_example"]
    inputs.cases = lambda **options: one_case
''')


def _tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the driver forks one child per injected step")
def test_gen_tests_killed_at_any_step_keeps_a_whole_suite(pristine, tmp_path):
    """Replace a suite at opset 13 by one at opset 11, with a kill -9 at step 1, 2, 3, ... of gen-tests.

    After each kill OUTDIR is the whole old suite or the whole new one (the two are swapped in one
    step), and the next run removes what the kills left. Failures and interrupts, and the two
    renames that stand in where there is no one-step swap, are covered in test_suites.py.
    """
    (tmp_path / "snapshots").mkdir()
    path = tmp_path / "out" / "dql"
    shutil.copytree(pristine, path)
    old = _tree(path)
    args = ["gen-tests", str(path), "--opsets", "11", "--variants", "native", "--no-large"]
    run = subprocess.run([sys.executable, "-c", _ONE_CASE + _DRIVER, json.dumps(args), str(path.parent),
                          str(tmp_path / "snapshots"), "kill"], capture_output=True, text=True, check=True, timeout=300)
    codes = json.loads(run.stdout.splitlines()[-1])
    assert len(codes) >= 30 and set(codes) == {-signal.SIGKILL}, codes  # every step was hit
    new = _tree(path)  # written by the run that went past every step
    assert new != old and sorted(p.name for p in path.parent.iterdir()) == ["dql"]  # it cleared what the kills left
    states = []
    for n in range(1, len(codes) + 1):
        tree = _tree(tmp_path / "snapshots" / str(n) / "dql")
        assert tree in (old, new), f"step {n}: neither the old suite nor the new one"
        states.append("old" if tree == old else "new")
    assert states[0] == "old" and states[-1] == "new", states


# verify against false verdicts: 1 for a wrong rewrite, 2 for bad input.

MLP = MODELS / "mlp_dynamic.onnx"


def _assert_exit(result: subprocess.CompletedProcess, code: int, verdict: str = "FAIL") -> None:
    """Exit ``code``; for 1 the last line says ``verdict``."""
    if code == 2:
        assert_bad_input(result, "")
        return
    assert result.returncode == code, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout.rstrip().splitlines()[-1].startswith("PASS" if code == 0 else verdict), result.stdout


def _save(model: onnx.ModelProto | ir.Model, path: Path) -> Path:
    onnx.save(model if isinstance(model, onnx.ModelProto) else ir.to_proto(model), path)
    return path


def test_readers_rewired_away_from_a_dangling_dql_fail_even_with_many_samples(tmp_path):
    model = onnx.load(MLP)
    rewritten = _save(dangling_dql_rewrite(model), tmp_path / "dangling.onnx")
    result = dql_pass_cli("verify", MLP, rewritten, "--samples", "50")
    _assert_exit(result, 1)
    assert "input_QuantizeLinear" in result.stdout and "tie" in result.stdout


def test_an_extra_graph_output_fails(tmp_path):
    model = onnx.load(MODELS / "relu_dql.onnx")
    rewritten = ir.from_proto(dql_pass.expand(model)[0])
    extra = value_map(rewritten)["relu_out"]
    extra.type, extra.shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape(["batch", 16])
    rewritten.graph.outputs.append(extra)
    result = dql_pass_cli("verify", MODELS / "relu_dql.onnx", _save(rewritten, tmp_path / "extra.onnx"), "--samples", "0")
    _assert_exit(result, 1)
    assert "final output 'relu_out' differs: an output that ORIGINAL does not have (output 4)" in result.stdout


def _embedding_model(rows: int) -> onnx.ModelProto:
    """Token ids [batch, sequence], the only input, through an embedding of ``rows`` rows, then a DQL."""
    embedding = numpy_helper.from_array(np.random.default_rng(0).standard_normal((rows, 8)).astype(np.float32), "embedding")
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["embedded"]),
        helper.make_node("DynamicQuantizeLinear", ["embedded"], ["q", "q_scale", "q_zero_point"], name="dql"),
    ]
    outputs = [
        helper.make_tensor_value_info(name, dtype, shape)
        for name, dtype, shape in (("q", TensorProto.UINT8, ["batch", "sequence", 8]), ("q_scale", TensorProto.FLOAT, []),
                                   ("q_zero_point", TensorProto.UINT8, []))
    ]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])]
    graph = helper.make_graph(nodes, "embedding", inputs, outputs, [embedding])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_samples_zero_on_integer_inputs_is_bad_input_not_a_pass(tmp_path):
    model = _save(_embedding_model(16), tmp_path / "ids.onnx")
    result = dql_pass_cli("verify", model, model, "--samples", "0")
    _assert_exit(result, 2)
    assert "samples=0" in result.stderr


def test_a_zeroed_embedding_row_beyond_sixteen_fails(tmp_path):
    original = _embedding_model(64)
    table = numpy_helper.to_array(original.graph.initializer[0]).copy()
    table[40] = 0
    changed = onnx.ModelProto()
    changed.CopyFrom(original)
    changed.graph.initializer[0].CopyFrom(numpy_helper.from_array(table, "embedding"))
    result = dql_pass_cli("verify", _save(original, tmp_path / "ids.onnx"), _save(dql_pass.expand(changed)[0], tmp_path / "zeroed.onnx"))
    _assert_exit(result, 1)


def test_a_rewrite_that_fixes_the_batch_to_one_fails(tmp_path):
    rewritten = dql_pass.expand(onnx.load(MLP))[0]
    for value in [*rewritten.graph.input, *rewritten.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "batch":
                dim.dim_value = 1
    result = dql_pass_cli("verify", MLP, _save(rewritten, tmp_path / "batch_one.onnx"))
    _assert_exit(result, 1)
    assert "onnxruntime cannot run REWRITTEN" in result.stdout


def test_inputs_too_large_to_synthesize_are_bad_input():
    result = dql_pass_cli("verify", MLP, MLP, "--dim", "batch=100000000")
    _assert_exit(result, 2)
    assert "would need 143.1 GiB" in result.stderr


def test_a_scale_doubled_on_large_inputs_fails(tmp_path):
    """y_scale doubled when x has over 1000 elements: every catalogue case is smaller."""
    model = dql_model(13, rank=3)
    rewritten = ir.from_proto(dql_pass.expand(model)[0])
    x, scale = rewritten.graph.inputs[0], value_map(rewritten)["y_scale"]
    readers = list(scale.uses())
    scale.name = "y_scale_right"
    big = ir.node("Greater", [ir.node("Size", [x]).outputs[0], constant_node(np.array(1000, np.int64)).outputs[0]])
    doubled = ir.node("Mul", [scale, constant_node(np.float32(2)).outputs[0]])
    chosen = ir.node("Where", [big.outputs[0], doubled.outputs[0], scale])
    chosen.outputs[0].name = "y_scale"
    chosen.outputs[0].type, chosen.outputs[0].shape = ir.TensorType(ir.DataType.FLOAT), ir.Shape([])
    for use in readers:
        use.node.replace_input_with(use.idx, chosen.outputs[0])
    rewritten.graph.outputs[1] = chosen.outputs[0]
    new = [big.inputs[0].producer(), big.inputs[1].producer(), big, doubled.inputs[1].producer(), doubled, chosen]
    rewritten.graph.insert_after(scale.producer(), new)
    result = dql_pass_cli("verify", _save(model, tmp_path / "dql.onnx"), _save(rewritten, tmp_path / "doubled.onnx"),
                     "--samples", "0", "--dim", "d0=1", "--dim", "d1=4", "--dim", "d2=4")
    _assert_exit(result, 1)
    assert "large_ties_80400 (near tie)" in result.stdout  # the worst case, with its input classes


def test_a_sequence_output_is_compared_not_a_traceback(tmp_path):
    model = dql_model(13)
    model.graph.node.append(helper.make_node("SequenceConstruct", ["x", "x"], ["both"]))
    model.graph.output.append(helper.make_tensor_sequence_value_info("both", TensorProto.FLOAT, None))
    path = _save(model, tmp_path / "sequence_out.onnx")
    _assert_exit(dql_pass_cli("verify", path, path, "--samples", "1"), 0)


def test_a_flipped_weight_on_empty_inputs_is_not_a_pass(tmp_path):
    model = onnx.load(MLP)
    bias = next(t for t in model.graph.initializer if t.name == "B1")
    array = numpy_helper.to_array(bias).copy()
    array.view(np.uint32)[0] ^= 1 << 22
    bias.CopyFrom(numpy_helper.from_array(array, "B1_changed"))
    node = next(n for n in model.graph.node if "B1" in n.input)  # node and weight renamed: only the models show it
    node.name += "_changed"
    node.input[:] = ["B1_changed" if i == "B1" else i for i in node.input]
    changed = _save(model, tmp_path / "changed.onnx")
    np.save(tmp_path / "empty.npy", np.zeros((0, 64), np.float32))
    for options in (["--dim", "batch=0"], ["--input", f"input={tmp_path / 'empty.npy'}"]):
        result = dql_pass_cli("verify", MLP, changed, *options)
        _assert_exit(result, 1, "INCOMPLETE")
        assert "nothing was compared" in result.stdout


def test_expand_verify_on_an_input_verify_cannot_make_writes_and_says_incomplete(tmp_path):
    model = dql_model(13)
    model.graph.node.insert(0, helper.make_node("SequenceAt", ["xs", "zero"], ["x"]))
    model.graph.initializer.append(numpy_helper.from_array(np.int64(0), "zero"))
    model.graph.input[0].CopyFrom(helper.make_tensor_sequence_value_info("xs", TensorProto.FLOAT, ["d0"]))
    output = tmp_path / "out.onnx"
    result = dql_pass_cli("expand", _save(model, tmp_path / "sequence_in.onnx"), "-o", output, "--verify")
    _assert_exit(result, 1, "INCOMPLETE")
    assert "cannot synthesize model input 'xs'" in result.stdout and output.exists()
