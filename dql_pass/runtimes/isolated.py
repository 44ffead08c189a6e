"""A third-party tool's process kept apart: no network, and a private temporary folder as its
home and scratch folder, so that whatever it writes (caches, logs, a telemetry id) lands there.

Used by every adapter that runs another package's code in a process of its own (the LiteRT and
MNN converters, the MNN, tract and OpenVINO workers).
"""

from __future__ import annotations

__all__ = ["command", "environ", "network_off", "worker_environ"]

import functools
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

_CLOSED_PORT = "http://127.0.0.1:9"  # the discard port, where nothing listens


@functools.cache
def network_off() -> tuple[str, ...]:
    """The command prefix that runs a process in a network namespace of its own, with no
    interface but a loopback that is down; () where the system allows none."""
    unshare = shutil.which("unshare")
    for prefix in ((unshare, "--net"), (unshare, "--map-root-user", "--net")) if unshare else ():
        if subprocess.run([*prefix, "true"], stdin=subprocess.DEVNULL, capture_output=True).returncode == 0:
            return prefix
    return ()


def command(arguments: Sequence[str]) -> list[str]:
    """``arguments`` run with no network where the system allows it."""
    return [*network_off(), *arguments]


def worker_environ(folder: Path) -> dict[str, str]:
    """A process's environment (:func:`environ`) with the caller's PATH and Python path, which may be where
    the runtime it runs is installed: its user site too (``pip install --user``), which the new home hides."""
    found = environ(folder, os.environ.get("PATH", os.defpath), keep=("LD_LIBRARY_PATH",))
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    paths = [*filter(None, [os.environ.get("PYTHONPATH")]), *([user] if user in sys.path else [])]
    return {**found, "PYTHONPATH": os.pathsep.join(paths)} if paths else found


def environ(folder: Path, path: str, keep: Iterable[str] = ()) -> dict[str, str]:
    """The process's environment variables: nothing of the caller's but the locale and ``keep``,
    ``folder`` as its home and scratch folder, ``path`` as its PATH, and every download pointed
    where it goes nowhere."""
    kept = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "LC_CTYPE", *keep)}
    proxies = {name: _CLOSED_PORT for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                                               "ALL_PROXY")}
    return {
        **kept, **proxies, "no_proxy": "", "NO_PROXY": "", "PATH": path,
        "HOME": str(folder), "TMPDIR": str(folder), "XDG_CACHE_HOME": str(folder),
        "PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": os.devnull, "PYTHONNOUSERSITE": "1",
    }
