"""RUNTIMES.md states the runtimes left out and why (issue 20: ncnn)."""

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
