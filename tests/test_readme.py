"""The README's examples run as written: its Python blocks, and its command lines on the sample models.

Each runs in a temporary folder that holds what the examples name: `model.onnx` (a copy of
models/mlp_dynamic.onnx), `models/` (a copy of the sample models) and, for the suite loader's
example, a small suite in `conformance/dql`. The command lines run in this process through
:func:`dql_pass.cli.main`, in the README's order, so that one can read what an earlier one wrote.
Lines for the browser runtimes and for whole suites are left to tests/test_web_runtimes.py and
tests/test_suites.py: they take minutes.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from dql_pass import cli, runtimes

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
# The two commands a new user types first: they stay exactly as they are.
FIRST_COMMANDS = ("pip install . && dql-pass expand models/mlp_dynamic.onnx -o expanded.onnx", "pip install '.[test]' && pytest")


def _blocks(language: str) -> list[str]:
    """The README's fenced blocks of ``language`` ('' for a plain block), in order."""
    return [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```", README, re.S | re.M) if m.group(1) == language]


def _command_lines() -> list[str]:
    """Every concrete `dql-pass ...` line of the plain blocks: synopses (placeholders in capitals,
    options in brackets) are left out, and so is what comes before `&&` and after `#`."""
    lines = []
    for block in _blocks(""):
        for line in block.splitlines():
            line = line.split("&&")[-1].split(" #")[0].strip()
            if line.startswith("dql-pass ") and "[" not in line and not re.search(r"\b[A-Z]{3,}\b", line):
                lines.append(line)
    return lines


def _left_out(line: str) -> str | None:
    """Why a command line is not run here, if it is not."""
    if re.search(r"\b(webgpu|wasm)\b", line):
        return "a browser runtime: tests/test_web_runtimes.py"
    if "conformance/" in line:
        return "a whole suite: tests/test_suites.py"
    runtime = re.search(r"--(?:target|runtime) (\S+)", line)
    if runtime and not runtimes.get(runtime.group(1)).installed():
        return f"{runtime.group(1)} is not installed"
    return None


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(ROOT / "models", tmp_path / "models")
    shutil.copy(ROOT / "models" / "mlp_dynamic.onnx", tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_first_commands_are_as_they_were():
    for command in FIRST_COMMANDS:
        assert f"```\n{command}\n```" in README


def test_the_python_blocks_run(folder: Path, capsys: pytest.CaptureFixture[str]):
    blocks = _blocks("python")
    assert len(blocks) == 2, "the README's Python blocks changed: update this test's setup for them"
    # The suite loader's block reads conformance/dql: a small suite, one opset, no large input.
    (folder / "conformance").mkdir()
    assert cli.main(["-q", "gen-tests", "--opsets", "21", "--no-large", "--variants", "native,portable", "conformance/dql"]) == 0
    for number, block in enumerate(blocks):
        # A block that raises fails the test, with the block's own line numbers in the traceback.
        exec(compile(block, f"README.md python block {number + 1}", "exec"), {"__name__": f"readme_{number}"})
    assert (folder / "expanded.onnx").is_file()


def test_the_command_lines_run(folder: Path, capsys: pytest.CaptureFixture[str]):
    lines = _command_lines()
    run = [line for line in lines if _left_out(line) is None]
    assert "dql-pass expand models/mlp_dynamic.onnx -o expanded.onnx" in run
    assert len(run) >= 6, f"only {len(run)} runnable command lines found: {run}"
    for line in run:
        argv = shlex.split(line)[1:]
        code = cli.main(argv)
        out, err = capsys.readouterr()
        assert code == 0, f"`{line}` exited {code}:\n{out}\n{err}"
        if argv[:1] == ["verify"]:
            assert out.splitlines()[-1].startswith("PASS"), f"`{line}`:\n{out}"
        for i, word in enumerate(argv):
            if word in ("-o", "--json"):
                assert (folder / argv[i + 1]).is_file(), f"`{line}` wrote no {argv[i + 1]}"
