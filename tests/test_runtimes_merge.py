"""tools.runtimes --runtime NAME --merge: the runtimes measured get new rows and sections, the
others keep theirs as the report had them (a column it lacked reads -, each kept section names the
run it came from, what follows the sections stays whole), and what is not such a report is refused.
Also the runs of a form: one session per rank, one open at a time, the outcomes in input order.
No runtime is run: the results are made here."""

from __future__ import annotations

import numpy as np
import pytest

from tools import runtimes as tool
from tools import runtimes_kept

_FAMILY = "## The quantization family on each runtime\n\nkept whole\n"


def _result(name: str, variant: str, passed: int, unknown: int = 0) -> tool.RuntimeResult:
    result = tool.RuntimeResult(name, "1.0", "", variant)
    for form in (tool.NATIVE, *tool.op.VARIANTS):
        form_result = result.forms[(form, 21)] = tool.FormResult()
        form_result.counts["finite"] = [passed, 4]
        if unknown and form == variant:
            form_result.unknown["classes: tie"] = [f"case{i}: differs" for i in range(unknown)]
    return result


def _old_report(monkeypatch) -> str:
    """A report written before the variant `lean` was: its tables have no column for it."""
    with monkeypatch.context() as patched:
        patched.setattr(tool.op, "VARIANTS", tuple(v for v in tool.op.VARIANTS if v != "lean"))
        text = tool.render([_result("onnxruntime", "quantizelinear", 4, unknown=2), _result("webgpu", "portable", 1)],
                           "quick", tool.CONFIGS["quick"], 1.0)
    return text + "\n" + _FAMILY


def test_a_merge_replaces_the_runtimes_measured_and_keeps_the_others_as_they_were(monkeypatch):
    monkeypatch.setattr(tool.harness, "cpu_model", lambda: "CPU 3.2 GHz")
    monkeypatch.setattr(tool.harness, "gpu_models", lambda: ["GPU A", "GPU B"])
    old = _old_report(monkeypatch)
    kept = runtimes_kept.read(old, quick=True)
    text = tool.render([_result("webgpu", "lean", 3)], "quick", tool.CONFIGS["quick"], 1.0, kept)
    summary = text.split("All inputs, opset 21:\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert summary[0].split(" | ")[-3:] == ["portable", "lean", "--target (its variant) |"]
    # The kept row: its cells where they were, "-" under the column its report did not have.
    assert summary[2] == "| `onnxruntime` | 1.0 | 4/4 | 4/4 | 4/4 | 4/4 | 4/4 | 4/4 | - | 4/4 (quantizelinear) |"
    assert summary[3] == "| `webgpu` | 1.0 | " + " | ".join(["**3/4**"] * 8) + " (lean) |"
    assert len(summary) == 4
    ort = text.split("### onnxruntime\n", 1)[1].split("\n### ", 1)[0]
    assert ort == old.split("### onnxruntime\n", 1)[1].split("\n### ", 1)[0]
    assert ort.count(" in the run of ") == 1
    assert "target variant `lean`; measured in 0 s in the run of " in text.split("### webgpu\n", 1)[1]
    # The section measured names its machine; the machine table says whose run it describes.
    assert " on CPU 3.2 GHz with GPU A, GPU B.\n" in text.split("### webgpu\n", 1)[1]
    assert "Of this run (it measured webgpu); each kept section names the run it came from" in text
    assert "| GPU | GPU A, GPU B |" in text
    assert "target variant `portable`" not in text
    assert text.endswith("|\n\n" + _FAMILY)
    assert "`python -m tools.runtimes --quick --runtime webgpu --merge`" in text
    assert "the rows and sections of onnxruntime were kept" in text
    # The UNKNOWN inputs of a kept section still count, and fail the run.
    assert "**2 inputs differ for no known reason (UNKNOWN below).**" in text
    # A section written before sections named their run gets the run of the report it was kept from.
    older = old.replace(ort.split("measured in 0 s")[1].split(".\n")[0], "")
    kept = runtimes_kept.read(older, quick=True)
    text = tool.render([_result("webgpu", "lean", 3)], "quick", tool.CONFIGS["quick"], 1.0, kept)
    assert "measured in 0 s" + kept.run + "." in text.split("### onnxruntime\n", 1)[1]


def test_a_merge_refuses_what_is_not_a_report_of_its_mode(monkeypatch):
    with pytest.raises(ValueError, match="not a report of tools.runtimes"):
        runtimes_kept.read("# Benchmarks\n", quick=False)
    with pytest.raises(ValueError, match="other mode"):
        runtimes_kept.read(_old_report(monkeypatch), quick=False)


def test_merge_needs_runtime_and_a_report_it_can_read(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        tool.main(["--merge", "--out", str(tmp_path / "RUNTIMES.md")])
    assert exited.value.code == 2 and "--merge needs --runtime" in capsys.readouterr().err
    (tmp_path / "RUNTIMES.md").write_text("# Something else\n")
    with pytest.raises(SystemExit) as exited:
        tool.main(["--merge", "--runtime", "onnxruntime", "--out", str(tmp_path / "RUNTIMES.md")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1 and "cannot merge into" in err
    assert (tmp_path / "RUNTIMES.md").read_text() == "# Something else\n"


class _Counting:
    """A runtime that refuses rank 3, fails every run of shape (2,), and counts its sessions and runs."""

    def __init__(self) -> None:
        self.open, self.most, self.loads, self.runs = 0, 0, 0, 0

    def load(self, model):
        if len(model.graph.input[0].type.tensor_type.shape.dim) == 3:
            raise tool.RuntimeFailure("no rank 3")
        self.loads += 1
        self.open += 1
        self.most = max(self.most, self.open)
        runtime = self

        class Session:
            adapter = "fake adapter"

            def run(self, feeds):
                x = feeds["x"]
                runtime.runs += 1
                if x.shape == (2,):
                    raise tool.RuntimeFailure("refused (2,)")
                return [x]

            def close(self):
                runtime.open -= 1

        return Session()


def test_a_form_runs_one_session_per_rank_one_open_at_a_time_with_the_outcomes_in_input_order():
    runtime = _Counting()
    arrays = [np.full(1, i, np.float32) if i % 2 else np.full((1, 1), i, np.float32) for i in range(6)]
    arrays += [np.zeros((1, 1, 1), np.float32)] + [np.full(2, i, np.float32) for i in range(5)]
    outcomes, adapter = tool._run_by_rank(runtime, "lean", 21, arrays)
    assert runtime.loads == 2 and runtime.most == 1 and runtime.open == 0 and adapter == "fake adapter"
    assert [o[0].item() for o in outcomes[:6]] == list(range(6))
    assert outcomes[6] == "does not load: no rank 3"
    # A shape refused three times running is not run again: its last refusal stands for the rest.
    assert outcomes[7:] == ["does not run: refused (2,)"] * 5 and runtime.runs == 6 + 3
