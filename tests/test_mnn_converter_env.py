import json
import os
import sys

import pytest

from dql_pass.runtimes import isolated, mnn
from dql_pass.runtimes.base import RuntimeFailure

# What the worker sees: its home, scratch and cache folders, and its network namespace.
_SEEN = ("import json, os; seen = json.dumps([os.environ.get(k) for k in ('HOME', 'TMPDIR', 'XDG_CACHE_HOME')] "
         "+ [os.readlink('/proc/self/ns/net')])")


def _expected(folder) -> list[str]:
    here = os.readlink("/proc/self/ns/net")
    return [str(folder)] * 3 + ["another" if isolated.network_off() else here]


def _as_expected(seen: list[str]) -> list[str]:
    return seen[:3] + ["another" if seen[3] != os.readlink("/proc/self/ns/net") else seen[3]]


@pytest.fixture
def caller_env(monkeypatch):
    monkeypatch.setenv("HOME", "/nonexistent-home")
    monkeypatch.setenv("TMPDIR", "/nonexistent-tmp")
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent-cache")


def test_the_converter_has_its_folder_as_home_and_scratch_and_no_network(tmp_path, monkeypatch, caller_env):
    script = _SEEN + "; import sys; open(sys.argv[-1], 'w').write(seen)"
    monkeypatch.setattr(mnn, "worker_command", lambda *arguments: [sys.executable, "-c", script, *arguments])
    target = tmp_path / "model.mnn"
    mnn.convert(tmp_path / "model.onnx", target)
    assert _as_expected(json.loads(target.read_text())) == _expected(tmp_path)
    assert os.environ["HOME"] == "/nonexistent-home"


def test_the_run_worker_has_its_folder_as_home_and_scratch_and_no_network(tmp_path, monkeypatch, caller_env):
    # The worker answers the load with what it sees, as an error that the session raises.
    script = _SEEN + ("; import pickle, sys; pickle.load(sys.stdin.buffer); "
                      "pickle.dump(('error', seen), sys.stdout.buffer)")
    monkeypatch.setattr(mnn, "worker_command", lambda *arguments: [sys.executable, "-c", script, *arguments])
    with pytest.raises(RuntimeFailure) as failure:
        mnn.start_worker(tmp_path / "model.mnn", 1, ["x"], ["y"], 60)
    assert _as_expected(json.loads(str(failure.value))) == _expected(tmp_path)
