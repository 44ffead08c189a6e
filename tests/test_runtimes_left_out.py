"""The runtimes report states each runtime left out (tools.runtimes.LEFT_OUT) with its version and
reason, in the report the tool writes and in docs/RUNTIMES.md; a runtime found but failing to import
is reported as not installable, with the import error."""

from __future__ import annotations

from pathlib import Path

from tools import runtimes as tool

RUNTIMES_MD = Path(__file__).resolve().parent.parent / "docs" / "RUNTIMES.md"


def _left_out_rows(text: str) -> list[str]:
    section = text.split("## Left out\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_the_report_has_a_left_out_section_with_a_row_per_runtime_left_out_and_its_reason():
    text = tool.render([tool.RuntimeResult("onnxruntime", "1.32.0", "", "quantizelinear")], "quick",
                       tool.CONFIGS["quick"], 1.0)
    assert text.index("## Summary") < text.index("## Left out") < text.index("## Per runtime")
    assert "not re-run by this tool" in text.split("## Left out\n", 1)[1].split("\n## ", 1)[0]
    assert tool.LEFT_OUT, "no runtime left out: the section would be an empty table"
    expected = [f"| `{name}` | {version} | {reason} |" for name, version, reason in tool.LEFT_OUT]
    assert _left_out_rows(text) == expected
    assert _left_out_rows(RUNTIMES_MD.read_text()) == expected  # the committed report says the same


class _Found:
    """A runtime whose package is found but does not import (onnx2torch without torchvision)."""

    variant = "float64"

    def __init__(self, module: str) -> None:
        self.module = module

    def install_hint(self) -> str:
        return "pip install 'dql_pass[torch]'"

    def installed(self) -> bool:
        return True

    def version(self) -> str:
        return "1.5.15"


def test_a_runtime_found_but_failing_to_import_is_not_installable_with_the_import_error(tmp_path, monkeypatch):
    (tmp_path / "found_but_broken.py").write_text("import torchvision_that_is_not_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tool.runtimes, "get", lambda name: _Found("found_but_broken"))
    result = tool.measure_runtime("onnx2torch", tool.CONFIGS["quick"], tmp_path / "unused.onnx")
    assert result.import_error == "ModuleNotFoundError: No module named 'torchvision_that_is_not_here'"
    assert not result.forms and not result.models
    text = tool.render([result], "quick", tool.CONFIGS["quick"], 1.0)
    assert "Runtimes not installable here: onnx2torch." in text
    assert "Not measured: not installed (ModuleNotFoundError: No module named 'torchvision_that_is_not_here')" in text
