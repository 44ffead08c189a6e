"""The README's and docs/' examples run as written: their Python blocks, and their command lines on
the sample models; every `dql_pass.` name they use exists, and every relative link leads somewhere.

Each runs in a temporary folder that holds what the examples name: `model.onnx` (a copy of
models/mlp_dynamic.onnx), `models/` (a copy of the sample models) and, for the suite loader's
example, a small suite in `conformance/dql`. The command lines run in this process through
:func:`dql_pass.cli.main`, in the order of :data:`PAGES`, so that one can read what an earlier one wrote.
Lines for the browser runtimes and for whole suites are left to tests/test_web_runtimes.py and
tests/test_suites.py: they take minutes.
"""

from __future__ import annotations

import importlib
import re
import shlex
import shutil
from pathlib import Path

import pytest

from dql_pass import cli, runtimes

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
# The manual, in reading order: the README first (its "Try it" writes expanded.onnx), then docs/.
PAGES = [ROOT / "README.md", *(ROOT / "docs" / name for name in (
    "cli.md", "verify.md", "lower.md", "suites.md", "targets.md", "browser.md", "phones.md", "api.md", "files.md",
    "performance.md", "architecture.md", "GLOSSARY.md", "SEMANTICS.md", "RUNTIMES.md", "BENCHMARKS.md"))]
MANUAL = "\n".join(page.read_text(encoding="utf-8") for page in PAGES)
# The two commands a new user types first: they stay exactly as they are.
FIRST_COMMANDS = ("pip install . && dql-pass expand models/mlp_dynamic.onnx -o expanded.onnx",
                  "pip install '.[test]' && pytest")


def _blocks(language: str) -> list[str]:
    """The manual's fenced blocks of ``language`` ('' for a plain block), in order."""
    return [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```", MANUAL, re.S | re.M) if m.group(1) == language]


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
    assert len(blocks) == 2, "the manual's Python blocks changed: update this test's setup for them"
    # The suite loader's block reads conformance/dql: a small suite, one opset, no large input.
    (folder / "conformance").mkdir()
    assert cli.main(["-q", "gen-tests", "--opsets", "21", "--no-large", "--variants", "native,portable",
                     "conformance/dql"]) == 0
    for number, block in enumerate(blocks):
        # A block that raises fails the test, with the block's own line numbers in the traceback.
        exec(compile(block, f"the manual's python block {number + 1}", "exec"), {"__name__": f"readme_{number}"})
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


def test_every_page_of_the_manual_is_read_here():
    pages = {ROOT / "README.md", *(ROOT / "docs").glob("*.md")}
    assert pages == set(PAGES), "add the new page to PAGES"


def test_the_readme_is_short_and_starts_with_the_runtime_table():
    assert len(README.encode()) <= 12 * 1024
    first_screen = "\n".join(README.splitlines()[:40])
    for where in ("transformers.js", "phones", "CUDA", "TensorRT", "CoreML", "onnx2torch", "a runtime you are writing"):
        assert where in first_screen, where


_NAME = re.compile(r"\bdql_pass(?:\.[A-Za-z_]\w*)+")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _resolves(name: str) -> bool:
    """Whether ``name`` (dql_pass.a.b.c) is a module, or an attribute of the longest module it starts with."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attribute in parts[cut:]:
                value = getattr(value, attribute)
        except AttributeError:
            return False
        return True
    return False


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _broken(page: Path, text: str) -> list[str]:
    """The stale `dql_pass.` names and the relative links that lead nowhere in ``text`` (a page at ``page``)."""
    broken = [f"{page.name}: no such name {name}" for name in sorted(set(_NAME.findall(text))) if not _resolves(name)]
    for link in _LINK.findall(text):
        if re.match(r"\w+:", link):
            continue  # https:, mailto:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{page.name}: no such file {link}")
        elif anchor and target.suffix == ".md":
            headings = re.findall(r"^#+ (.*)$", target.read_text(encoding="utf-8"), re.M)
            if anchor not in {_slug(h) for h in headings}:
                broken.append(f"{page.name}: no heading #{anchor} in {path or page.name}")
    return broken


def test_every_name_and_link_of_the_manual_exists():
    assert [problem for page in PAGES for problem in _broken(page, page.read_text(encoding="utf-8"))] == []


def test_a_stale_name_or_link_is_found():
    stale = "`dql_pass.catalogue.cases()`, `dql_pass.inputs.no_such`, [x](no/such.md), [y](cli.md#no-such)"
    assert _broken(ROOT / "docs" / "api.md", stale) == [
        "api.md: no such name dql_pass.catalogue.cases", "api.md: no such name dql_pass.inputs.no_such",
        "api.md: no such file no/such.md", "api.md: no heading #no-such in cli.md",
    ]
    assert _broken(ROOT / "docs" / "api.md",
                   "`dql_pass.inputs.cases()` [v](verify.md) [s](SEMANTICS.md#the-formula-to-the-bit)") == []


def test_the_suites_page_names_every_variant_and_counts_every_form():
    """It said six forms and 1,686 folders long after lean made seven."""
    from dql_pass import inputs, suites, variants

    text = (Path(__file__).parent.parent / "docs" / "suites.md").read_text()
    usage = re.search(r"--variants ([a-z0-9,]+)\]", text).group(1).split(",")
    assert sorted(usage) == sorted(["native", *variants.NAMES])
    table = re.search(r"```\nform .*?\n(.*?)\n(\d+) passed", text, re.S)
    rows = [line.split() for line in table.group(1).splitlines()]
    assert sorted(row[0] for row in rows) == sorted(usage)
    opsets = len(suites.DEFAULT_OPSETS)
    per_form = {int(row[1]) for row in rows}  # every case at every opset, and the large input at the newest
    assert per_form == {len(inputs.cases()) * opsets + 1} and int(table.group(2)) == per_form.pop() * len(rows)
