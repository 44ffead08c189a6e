"""RUNTIMES.md states the runtimes left out and why (ncnn)."""

from __future__ import annotations

from tools import runtimes as tool


def test_the_report_has_a_left_out_section_with_the_ncnn_row_and_its_reason():
    text = tool.render([tool.RuntimeResult("onnxruntime", "1.32.0", None, "quantizelinear")], "quick",
                       tool.CONFIGS["quick"], 1.0)
    section = text.split("## Left out\n", 1)[1].split("\n## ", 1)[0]
    assert text.index("## Summary") < text.index("## Left out") < text.index("## Per runtime")
    assert "not re-run by this tool" in section
    assert ("| `ncnn` | pnnx 20261020 | nothing loads, not even the expansions: no Equal, Less, Where or uint8 Cast "
            "layers, division up to 2 ulp off, a float literal pnnx cannot parse back |") in section.splitlines()


class _Found:
    """A runtime whose package is found but does not import (onnx2torch without torchvision)."""

    extra, variant = "torch", "float64"

    def __init__(self, module: str) -> None:
        self.module = module

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
