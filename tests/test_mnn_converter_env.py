import os
import sys

from dql_pass.runtimes import mnn


def test_the_converter_has_its_folder_as_home_and_scratch(tmp_path, monkeypatch):
    script = "import os, sys; open(sys.argv[-1], 'w').write(os.environ['HOME'] + ' ' + os.environ['TMPDIR'])"
    monkeypatch.setattr(mnn, "worker_command", lambda *arguments: [sys.executable, "-c", script, *arguments])
    monkeypatch.setenv("HOME", "/nonexistent-home")
    monkeypatch.setenv("TMPDIR", "/nonexistent-tmp")
    target = tmp_path / "model.mnn"
    mnn.convert(tmp_path / "model.onnx", target)
    assert target.read_text() == f"{tmp_path} {tmp_path}"
    assert os.environ["HOME"] == "/nonexistent-home"
