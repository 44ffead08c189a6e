"""tools.family_runtimes --merge: the rows of a runtime measured elsewhere, put into the family's
sections of a report that holds the others, which stay as they were."""

from __future__ import annotations

import pytest

from tools import family_runtimes as tool

HEAD = "# Runtimes\n\n## Per runtime\n\nkept as it is\n\n"


def _sections(rows: dict[str, str], opsets: str = "10", seconds: int = 7, not_installed: str = "") -> str:
    lines = [tool.HEADING, "", f"Written by `python -m tools.family_runtimes` in {seconds} s: `dql-pass gen-tests "
             f"--ops {','.join(tool.FAMILY)}` at opsets {opsets}, run with `dql-pass run-tests --runtime ...`.", ""]
    for op in tool.FAMILY:
        lines += [f"### {op}", "", *tool._TABLE, *(f"| {name} | 1.0 | {cells} |" for name, cells in rows.items()), ""]
    return "\n".join(lines + ([f"Not installed here: {not_installed}", ""] if not_installed else []))


def test_merged_rows_replace_their_own_and_keep_every_other_row_and_section(monkeypatch):
    monkeypatch.setattr(tool.harness, "machine", lambda: "CPU with GPU A")
    kept = {"onnxruntime": "9 | 0 | 1 | 0 | ", "openvino": "5 | 5 | 0 | 0 | `x`: y differs",
            "tract": "1 | 0 | 0 | 9 | 9 x refused"}
    report = HEAD + _sections(kept, not_installed="onnxruntime-cuda (not installed)")
    run = _sections({"onnxruntime-cuda": "8 | 2 | 0 | 0 | `y`: y differs"}, seconds=31)
    merged = tool.merge(report, run, ["onnxruntime-cuda"])
    assert merged.startswith(HEAD)
    for op in tool.FAMILY:
        table = merged.split(f"### {op}\n")[1].split("\n\n")[0].strip().splitlines()[2:]
        names = [row.split(" | ")[0].removeprefix("| ") for row in table]
        assert names == ["onnxruntime", "onnxruntime-cuda", "openvino", "tract"]
        assert table[1] == "| onnxruntime-cuda | 1.0 | 8 | 2 | 0 | 0 | `y`: y differs |"
        assert table[2] == "| openvino | 1.0 | 5 | 5 | 0 | 0 | `x`: y differs |"
    assert "Not installed here" not in merged
    assert "Rows of onnxruntime-cuda: `python -m tools.family_runtimes --runtime onnxruntime-cuda --merge`" in merged
    assert "(CPU with GPU A), in 31 s; the other rows are from the run above" in merged and "in 7 s:" in merged
    again = tool.merge(merged, run, ["onnxruntime-cuda"])  # a second merge: the same text but its run's time

    def apart_from_the_run(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("Rows of ")]

    assert apart_from_the_run(again) == apart_from_the_run(merged) and again.count("Rows of onnxruntime-cuda") == 1


def test_a_merge_of_another_suite_or_of_a_runtime_not_installed_is_refused():
    report = HEAD + _sections({"onnxruntime": "9 | 0 | 1 | 0 | "})
    with pytest.raises(ValueError, match="another suite"):
        tool.merge(report, _sections({"onnxruntime-cuda": "8 | 2 | 0 | 0 | "}, opsets="10, 21"), ["onnxruntime-cuda"])
    with pytest.raises(ValueError, match="onnxruntime-cuda not installed here"):
        tool.merge(report, _sections({}, not_installed="onnxruntime-cuda (not installed: pip ...)"),
                   ["onnxruntime-cuda"])
    with pytest.raises(ValueError, match="no section"):
        tool.merge(HEAD, _sections({}), ["onnxruntime-cuda"])
