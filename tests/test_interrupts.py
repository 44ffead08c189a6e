"""Ctrl-C, SIGTERM and SIGHUP (dql_pass.interrupts), sent to a real process: at any moment, from the
interpreter's start to the write, a command ends with one line, the exit code of the signal, no
traceback and no debris. Each child starts with the signals at their defaults, however pytest runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import MODELS, dql_model, signals_as_by_default

MLP = MODELS / "mlp_dynamic.onnx"


# The process says when the command line starts (Python's own start-up is not ours to make quiet): the entry
# point as the dql-pass script runs it, with the line said just before cli.run. From then on every moment is
# covered: the lazy imports, the rewrite, the write and verify (a signal right after the line once got a traceback).
_STARTED = """
from dql_pass import __main__, cli
command = cli.run
def started():
    print('started', flush=True)
    command()
cli.run = started
__main__.run()
"""


def _started(folder: Path) -> subprocess.Popen:
    """`expand MLP --verify` into ``folder``, once it has said that the command line starts."""
    process = subprocess.Popen([sys.executable, "-c", _STARTED, "expand", str(MLP), "-o", str(folder / "o.onnx"),
                                "--verify"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=signals_as_by_default)
    assert process.stdout.readline() == "started\n"
    return process


@pytest.fixture(scope="module")
def command_seconds(tmp_path_factory) -> float:
    """How long the command runs here, from its start line to its end, the shorter of two runs: the signals
    below land within it."""
    runs = []
    for _ in range(2):
        process = _started(tmp_path_factory.mktemp("timed"))
        start = time.monotonic()
        process.communicate(timeout=120)
        assert process.returncode == 0
        runs.append(time.monotonic() - start)
    return min(runs)


# Moments as parts of the command's own run, each before its end: the signal must interrupt it.
@pytest.mark.parametrize("part", [0.0, 0.02, 0.1, 0.25, 0.4, 0.55, 0.7])
def test_ctrl_c_at_any_moment_prints_no_traceback(tmp_path, command_seconds, part):
    process = _started(tmp_path)
    time.sleep(part * command_seconds)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert (process.returncode, err.splitlines()[-1:]) == (130, ["dql-pass: interrupted"]), err
    assert not [p for p in tmp_path.iterdir() if p.name != "o.onnx"]  # no debris


def _hooked(tmp_path: Path, sitecustomize: str, **variables: str) -> dict[str, str]:
    """The environment of a child that runs ``sitecustomize`` (written to tmp_path/hook) as it starts, with
    ``variables`` set: a signal at a chosen moment, every time."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(sitecustomize)
    return {**os.environ, **variables,
            "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}


# A sitecustomize that sends the process a signal as it first opens a file in a stage folder to write:
# a signal while the write is under way, every time (a signal after a wait for the stage came too late
# under load: the write had ended).
_SIGNAL_AT_STAGE_WRITE = textwrap.dedent('''
    import os, signal, sys

    fired = []

    def signal_at_stage_write(event, args):
        if event != "open" or fired or ".stage" + os.sep not in os.fsdecode(args[0]):
            return
        mode, flags = args[1], args[2]
        writes = any(c in mode for c in "wax+") if mode is not None else flags & (os.O_WRONLY | os.O_RDWR)
        if writes:
            fired.append(True)
            os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL"]))

    sys.addaudithook(signal_at_stage_write)
''')


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_real_interrupt_says_so_and_leaves_nothing(tmp_path, sig, code):
    for folder in ("in", "out"):
        (tmp_path / folder).mkdir()
    env = _hooked(tmp_path, _SIGNAL_AT_STAGE_WRITE, SIGNAL=sig.name)
    w = onnx.numpy_helper.from_array(np.ones((4096, 1024), np.float32), "w")  # 16 MiB to stream
    model = dql_model(13)
    model.graph.initializer.append(w)
    onnx.save(model, tmp_path / "in" / "big.onnx", save_as_external_data=True, location="big.data")
    run = subprocess.run([sys.executable, "-m", "dql_pass", "expand", str(tmp_path / "in" / "big.onnx"),
                          "-o", str(tmp_path / "out" / "o.onnx")], capture_output=True, text=True, env=env,
                         timeout=120, preexec_fn=signals_as_by_default)
    assert (run.returncode, run.stderr) == (code, "dql-pass: interrupted\n")
    assert list((tmp_path / "out").iterdir()) == []


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
    ("module", "SIGINT", "dql_pass.interrupts"), ("module", "SIGINT", "dql_pass.cli"),
    ("module", "SIGINT", "argparse"), ("module", "SIGINT", "dql_pass.variants"), ("module", "SIGINT", "onnx"),
    ("script", "SIGINT", "dql_pass.interrupts"), ("script", "SIGINT", "json"),
    ("module", "SIGTERM", "logging"), ("script", "SIGHUP", "dql_pass.cli"),
])
def test_a_signal_while_the_command_line_loads_ends_it_with_one_line(tmp_path, entry, name, at):
    env = _hooked(tmp_path, _SIGNAL_AT_IMPORT, SIGNAL_AT=at, SIGNAL=name)
    source = tmp_path / "in.onnx"
    onnx.save(dql_model(13), source)
    command = [sys.executable, *_ENTRY_POINTS[entry], "expand", str(source), "-o", str(tmp_path / "out.onnx")]
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120,
                         preexec_fn=signals_as_by_default)
    assert (run.returncode, run.stderr) == (128 + getattr(signal, name), "dql-pass: interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hook", "in.onnx"]



# A sitecustomize that sends a signal from inside the first dataclass field's __set_name__ in a given module:
# Python 3.11 wraps an exception raised there in a RuntimeError, whose traceback a Ctrl-C during verify's lazy
# import once printed.
_SIGNAL_IN_SET_NAME = textwrap.dedent('''
    import dataclasses, os, signal

    set_name = dataclasses.Field.__set_name__
    fired = []

    def signal_in_set_name(self, owner, name):
        if not fired and owner.__module__ == os.environ["SIGNAL_IN"]:
            fired.append(owner)
            os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL"]))
        return set_name(self, owner, name)

    dataclasses.Field.__set_name__ = signal_in_set_name
''')


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_inside_a_class_definition_ends_the_command_with_one_line(tmp_path, name):
    env = _hooked(tmp_path, _SIGNAL_IN_SET_NAME, SIGNAL_IN="dql_pass.verification.report", SIGNAL=name)
    run = subprocess.run([sys.executable, "-m", "dql_pass", "expand", str(MLP), "-o", str(tmp_path / "o.onnx"),
                          "--verify", "-q"], capture_output=True, text=True, env=env, timeout=120,
                         preexec_fn=signals_as_by_default)
    assert (run.returncode, run.stderr) == (128 + getattr(signal, name), "dql-pass: interrupted\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hook", "o.onnx"]  # written whole before verify began
    onnx.checker.check_model(tmp_path / "o.onnx", full_check=True)



def _cli_running(main_body: str, **options) -> subprocess.CompletedProcess:
    """``cli.run()`` in a fresh process, its command replaced by ``main_body`` (returning the exit code)."""
    code = ("import socket, sys\nfrom dql_pass.cli import process\ndef main(argv=None):\n"
            + textwrap.indent(textwrap.dedent(main_body), "    ") + "\nprocess.main = main\nprocess.run()\n")
    return subprocess.run([sys.executable, "-c", code], preexec_fn=signals_as_by_default, timeout=60, **options)


def test_a_peer_that_closes_its_socket_is_an_error_the_command_sees_not_its_death():
    """The web server writing to a browser stopped by a timeout: with SIGPIPE at its default the command died,
    exit 141 and no verdict."""
    run = _cli_running("""
        page, browser = socket.socketpair()
        browser.close()
        try:
            page.sendall(b"x" * (1 << 20))
        except BrokenPipeError:
            return 0
        return 5
    """, capture_output=True, text=True)
    assert run.returncode == 0, (run.returncode, run.stderr)


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """`dql-pass run-tests SUITE | head`: the exit code SIGPIPE would give, and no traceback."""
    reader, writer = os.pipe()
    os.close(reader)
    run = _cli_running("""
        for _ in range(100000):
            print("PASS test_a_long_line_of_a_long_report")
        return 0
    """, stdout=writer, stderr=subprocess.PIPE, text=True)
    os.close(writer)
    assert run.returncode == 128 + signal.SIGPIPE and run.stderr == "", (run.returncode, run.stderr)


def test_a_signal_while_the_command_cleans_up_loses_nothing_of_the_cleanup():
    """A second Ctrl-C while the sessions' copies were being removed skipped the others, left in $TMPDIR."""
    run = _cli_running("""
        import os, signal, tempfile
        from dql_pass.runtimes import sessions

        class Owner:
            pass

        global owners
        owners = [Owner(), Owner()]
        folder = tempfile.mkdtemp()
        sessions.hold(owners[0], os.rmdir, folder)
        sessions.hold(owners[1], os.kill, os.getpid(), signal.SIGINT)  # released first: the last held
        print(folder)
        return 0
    """, capture_output=True, text=True)
    folder = run.stdout.strip()
    assert (run.returncode, run.stderr) == (0, "") and folder and not os.path.exists(folder), (run, folder)
