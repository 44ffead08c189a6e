"""The environment of a third-party tool's process (dql_pass.runtimes.isolated)."""

from __future__ import annotations

import os
import sys

from dql_pass.runtimes import isolated


def test_a_worker_finds_what_the_caller_installed_in_its_user_site(tmp_path, monkeypatch):
    """`pip install --user 'dql_pass[tract]'`: the worker's home is its folder, where Python looks for no user site."""
    user = str(tmp_path / "user-site")
    monkeypatch.setattr(isolated.site, "ENABLE_USER_SITE", True)
    monkeypatch.setattr(isolated.site, "getusersitepackages", lambda: user)
    monkeypatch.setattr(isolated.sys, "path", [*sys.path, user])
    monkeypatch.setenv("PYTHONPATH", "/given")
    assert isolated.worker_environ(tmp_path)["PYTHONPATH"] == os.pathsep.join(["/given", user])
    monkeypatch.setattr(isolated.sys, "path", [p for p in sys.path if p != user])
    assert isolated.worker_environ(tmp_path)["PYTHONPATH"] == "/given"
