"""``python -m dql_pass.runtimes.litert setup``: make the LiteRT runtimes' converter environment, once.

onnx2tf 2.x needs Python >= 3.12: the setup takes ``$DQL_PASS_LITERT_PYTHON``, else the Python
running it when it is new enough, else the newest ``python3.N`` (N >= 12) on PATH or among
pyenv's versions, and makes a virtual environment of it in the cache folder
(``$DQL_PASS_LITERT_CACHE``, default ``~/.cache/dql_pass/litert``) with ``pip install
onnx2tf==<pinned>`` (onnx2tf pins each of its own dependencies; its size is in docs/phones.md).
The environment is made in place (a virtual environment cannot be moved) and counts only once its
last file is written; a half-made one is removed and made again.

``python -m dql_pass.runtimes.litert check`` says what is missing (exit 2) or that all is there.
A missing piece or a failed step is one line and exit code 2. LiteRT itself comes with the extra:
``pip install 'dql_pass[litert]'``.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from dql_pass.errors import MissingDependency
from dql_pass.runtimes import setup_command
from dql_pass.runtimes.litert import ONNX2TF, READY, converter, environment, missing

_log = logging.getLogger("dql_pass.runtimes.litert")
PYTHON_VARIABLE = "DQL_PASS_LITERT_PYTHON"
MIN_PYTHON = (3, 12)


def _candidates() -> Iterator[str]:
    if os.environ.get(PYTHON_VARIABLE):
        yield os.environ[PYTHON_VARIABLE]
        return
    yield sys.executable
    found = [shutil.which(f"python3.{minor}") for minor in range(30, MIN_PYTHON[1] - 1, -1)]
    yield from (path for path in found if path)
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv", "versions")
    yield from sorted(glob.glob(str(pyenv / "3.*" / "bin" / "python")), key=_version_key, reverse=True)


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", Path(path).parent.parent.name))


def base_python() -> str:
    """A Python >= 3.12 to make the environment with; MissingDependency when there is none."""
    for python in _candidates():
        try:
            done = subprocess.run([python, "-c", "import sys, venv; print(*sys.version_info[:2])"],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue  # not a program, or not one that answers
        if done.returncode == 0 and tuple(map(int, done.stdout.split())) >= MIN_PYTHON:
            return python
    raise MissingDependency(f"onnx2tf {ONNX2TF} needs Python >= {'.'.join(map(str, MIN_PYTHON))} and none was found: "
                            f"install one, or name it in ${PYTHON_VARIABLE}")


def _run(command: list[str]) -> None:
    _log.info("running %s", " ".join(command))
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit {done.returncode}"]
        raise MissingDependency(f"`{' '.join(command)}` failed: {last[0]}")


def setup() -> None:
    """Make the converter's environment, unless it is there."""
    if converter() is None:
        folder = environment()
        if folder.exists():
            shutil.rmtree(folder)  # a setup that stopped half-way
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            _run([base_python(), "-m", "venv", str(folder)])
            _run([str(folder / "bin" / "python"), "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                  f"onnx2tf=={ONNX2TF}"])
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        (folder / READY).write_text(f"onnx2tf=={ONNX2TF}\n")
    if (problem := missing()) is not None:
        raise MissingDependency(problem)


def main(argv: Sequence[str] | None = None) -> int:
    return setup_command.main("dql_pass.runtimes.litert", __doc__.split("\n\n")[0], setup, missing,
                              lambda: f"the LiteRT runtimes are ready: onnx2tf {ONNX2TF} in {environment()}", argv)


if __name__ == "__main__":
    sys.exit(main())
