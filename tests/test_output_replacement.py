"""An output of a command is the complete old file set or the complete new one: links at the output
are replaced, not followed; special files are never replaced; a failure between any two steps of a
write, a full disk or a concurrent writer leaves one whole pair and no debris; permissions carry over."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import (
    STEP_FAILURE_DRIVER, assert_bad_input, assert_tidy, computed, digest, dql_model, referenced, run_cli,
    signals_as_by_default, weighted_model,
)

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


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
    run = run_cli("expand", source, "-o", out)
    assert run.returncode == 0, run.stderr
    assert {p: digest(p) for p in before} == before
    assert not out.is_symlink() and out.is_file()
    assert computed(out) == 2.0


def test_an_output_linked_to_the_input_replaces_the_link(tmp_path):
    source = weighted_model(tmp_path, "a.onnx", 1.0, 1.0)
    link = tmp_path / "link.onnx"
    link.symlink_to(source)
    before = digest(source), digest(source.with_name("a.onnx.data"))
    assert run_cli("expand", source, "-o", link).returncode == 0
    assert (digest(source), digest(source.with_name("a.onnx.data"))) == before
    assert not link.is_symlink() and computed(link) == 2.0


def test_an_output_over_the_inputs_data_is_refused_even_through_a_link(tmp_path):
    (tmp_path / "out").mkdir()
    source = weighted_model(tmp_path, "a.onnx", 1.0, 1.0)
    data = source.with_name("a.onnx.data")
    before = digest(data)
    assert_bad_input(run_cli("expand", source, "-o", data), "external data")
    (tmp_path / "out" / "d").symlink_to(tmp_path)
    assert_bad_input(run_cli("expand", source, "-o", tmp_path / "out" / "d" / "a.onnx"), "input path")
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
            run = run_cli("verify", source, source, "--json", path, timeout=120)
        else:
            run = run_cli(command, source, "-o", path, timeout=120)
        assert_bad_input(run, "not a regular file")
        assert os.lstat(path).st_mode == mode, kind
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.onnx", *(p.name for p in specials.values())])


@pytest.mark.parametrize("output", ["", ".", "./", "sub/"])
def test_an_output_that_names_no_file_is_one_line(tmp_path, output):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    (tmp_path / "sub").mkdir()
    assert_bad_input(run_cli("expand", source, "-o", output, cwd=tmp_path), "")



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
    assert run_cli("expand", old, "-o", out).returncode == 0
    args = ["expand", str(new), "-o", str(out)]
    run = subprocess.run([sys.executable, "-c", STEP_FAILURE_DRIVER, json.dumps(args), str(out.parent),
                          str(tmp_path / "snapshots"), mode],
                         capture_output=True, text=True, check=True, timeout=300, preexec_fn=signals_as_by_default)
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
    assert run_cli("expand", new, "-o", out).returncode == 0
    assert_tidy(out.parent, "out.onnx")
    assert computed(out) == 7.0


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs, for a real full disk; mounting one needs root and the mount capability."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True,
                             check=False)
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
    assert run_cli("expand", old, "-o", out).returncode == 0
    before = {p.name: digest(p) for p in small_disk.iterdir()}
    assert_bad_input(run_cli("expand", tmp_path / "big.onnx", "-o", out), "No space left")
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

def test_an_output_linked_to_a_folder_is_refused_like_a_folder(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outlink").symlink_to(tmp_path / "outdir")
    assert_bad_input(run_cli("expand", source, "-o", tmp_path / "outlink"), "links to a folder")
    assert (tmp_path / "outlink").is_symlink()

def test_private_weights_stay_private(tmp_path):
    (tmp_path / "out").mkdir()
    source = weighted_model(tmp_path, "a.onnx", 3.0, 1.0)
    os.chmod(source.with_name("a.onnx.data"), 0o600)
    os.chmod(source, 0o640)
    out = tmp_path / "out" / "o.onnx"
    assert run_cli("expand", source, "-o", out).returncode == 0
    (data,) = referenced(out)
    assert stat.S_IMODE(os.stat(out.parent / data).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640

# Outputs beside each other, and beside the inputs.

def test_an_output_beside_another_outputs_data_gets_its_own(tmp_path):
    """fuse b -o c beside b once referred to b's data file, which the next write of b removed."""
    (tmp_path / "out").mkdir()
    source = weighted_model(tmp_path, "a.onnx", 3.0, 1.0)
    b, c = tmp_path / "out" / "b.onnx", tmp_path / "out" / "c.onnx"
    assert run_cli("expand", source, "-o", b).returncode == 0
    assert run_cli("fuse", b, "-o", c).returncode == 0
    assert referenced(c).isdisjoint(referenced(b))
    assert run_cli("expand", source, "-o", b).returncode == 0
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
        run = run_cli("expand", source, "-o", link, timeout=60)
    else:
        run = run_cli("verify", source, source, "--json", link, timeout=60)
    assert_bad_input(run, "links to a device, FIFO or socket")
    assert link.is_symlink() and stat.S_ISFIFO(os.stat(link).st_mode)


def test_the_report_never_overwrites_an_input_array(tmp_path):
    source = tmp_path / "m.onnx"
    onnx.save(dql_model(13), source)
    array = tmp_path / "x.npy"
    np.save(array, np.linspace(-1, 1, 8, dtype=np.float32))
    before = digest(array)
    assert_bad_input(run_cli("verify", source, source, "--input", f"x={array}", "--json", array), "input array")
    assert digest(array) == before


def test_an_output_with_a_long_name_is_written(tmp_path):
    (tmp_path / "out").mkdir()
    source = weighted_model(tmp_path, "a.onnx", 3.0, 1.0)
    out = tmp_path / "out" / ("m" * 245 + ".onnx")
    for _ in range(2):  # the second write sweeps what the first left
        run = run_cli("expand", source, "-o", out)
        assert run.returncode == 0, run.stderr
        assert computed(out) == 4.0
        assert_tidy(out.parent, out.name)


