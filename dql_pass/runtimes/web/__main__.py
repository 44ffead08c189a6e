"""``python -m dql_pass.runtimes.web setup``: install what the web runtimes need, once.

- Debian's Chromium (``apt-get install chromium``), unless a Chromium is on PATH; npm too
  (``apt-get install nodejs npm``), unless npm is on PATH;
- onnxruntime-web at the pinned version, unpacked into the cache folder (``$DQL_PASS_WEB_CACHE``,
  default ``~/.cache/dql_pass/web``). ``npm pack`` fetches the one package tarball, which npm checks
  against the registry's integrity, and the setup against the integrity pinned here; no install
  script runs, and nothing else comes in: the dist bundles are self-contained.

``python -m dql_pass.runtimes.web check`` says what is missing (exit 2) or that all is there.
A missing piece or a failed step is one line and exit code 2.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dql_pass.errors import MissingDependency
from dql_pass.files import put_folder
from dql_pass.runtimes import setup_command
from dql_pass.runtimes.web import ORT_WEB, cache, dist, missing
from dql_pass.runtimes.web.installation import BUNDLES
from dql_pass.runtimes.web.browser import chromium

_log = logging.getLogger("dql_pass.runtimes.web")
# The sha512 the npm registry publishes for onnxruntime-web-1.30.0.tgz.
INTEGRITY = "sha512-q0y+JrrtukXSzsBWEMccVfqX25LRmosXHF+CaRJmg8pZClzcV7svNc4rKY3jL02Vb7QmRMDs1SigqR4CXAfKYQ=="


def _apt_install(packages: Sequence[str]) -> None:
    if shutil.which("apt-get") is None:
        raise MissingDependency(f"no apt-get here: install {' and '.join(packages)} with this system's package manager")
    if os.geteuid() != 0:
        raise MissingDependency(
            f"installing {' '.join(packages)} needs root: run `sudo apt-get install {' '.join(packages)}`")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
        _log.info("running %s", " ".join(command))
        done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit {done.returncode}"]
            raise MissingDependency(f"`{' '.join(command)}` failed: {last[0]}")


def _unpack_ort_web() -> None:
    """onnxruntime-web's package folder in the cache, in place at once (a rename) or not at all."""
    target = dist().parent
    cache().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dql_pass.setup.", dir=cache()) as folder:
        command = ["npm", "pack", f"onnxruntime-web@{ORT_WEB}", "--ignore-scripts", "--silent", "--pack-destination",
                   folder]
        _log.info("running %s", " ".join(command))
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=folder)
        tarball = Path(folder, f"onnxruntime-web-{ORT_WEB}.tgz")
        if done.returncode != 0 or not tarball.is_file():
            last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit {done.returncode}"]
            raise MissingDependency(f"`{' '.join(command)}` failed: {last[0]}")
        digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
        if digest != INTEGRITY:
            raise MissingDependency(f"onnxruntime-web-{ORT_WEB}.tgz has {digest}, not the pinned {INTEGRITY}")
        unpacked = Path(folder, "unpacked")
        with tarfile.open(tarball) as archive:
            archive.extractall(unpacked, filter="data")  # no links out, no absolute paths, no devices
        # In one step where the system can; the old install comes here and goes with the folder.
        put_folder(unpacked / "package", target)


def setup() -> None:
    """Install Chromium, npm and onnxruntime-web, each only when missing."""
    unpacked = (dist() / BUNDLES["webgpu"]).is_file()
    apt = [] if chromium() else ["chromium"]
    if not unpacked and shutil.which("npm") is None:
        apt += ["nodejs", "npm"]
    if apt:
        _apt_install(apt)
    if not unpacked:
        _unpack_ort_web()
    if (problem := missing()) is not None:
        raise MissingDependency(problem)


def main(argv: Sequence[str] | None = None) -> int:
    def ready() -> str:
        return f"the web runtimes are ready: {chromium()}, onnxruntime-web {ORT_WEB} in {dist().parent}"

    return setup_command.main("dql_pass.runtimes.web", __doc__.split("\n\n")[0], setup, missing, ready, argv)


if __name__ == "__main__":
    sys.exit(main())
