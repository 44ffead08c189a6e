"""verify as a user waits for it: small, stated shapes; progress; the runtime's own verdict when it
cannot run the models; and how far the deployed model is from ORT."""

from __future__ import annotations

import onnx
import pytest
from helpers import MODELS, installed

import dql_pass
from dql_pass.cli import main
from tools.models import TransformerShape, minilm_model, quantize

TINY = TransformerShape(layers=1, hidden=32, heads=2, intermediate=64, seq=None)


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    """A quantize_dynamic encoder whose dimensions are named as exporters often name them: b and s."""
    folder = tmp_path_factory.mktemp("transformer")
    model = minilm_model(TINY)
    for value in [*model.graph.input, *model.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                dim.dim_param = {"batch": "b", "sequence": "s"}[dim.dim_param]
    path = quantize(model, folder, "encoder.onnx")
    expanded = folder / "expanded.onnx"
    dql_pass.expand_file(path, expanded)
    return path, expanded


def test_verify_picks_small_shapes_whatever_the_dimensions_are_called_and_names_them(transformer):
    original, expanded = transformer
    report = dql_pass.verify(original, expanded)
    assert report.verdict == "PASS"
    assert report.dims == {"b": 2, "s": 16}
    assert "over 7 input sets (b=2, s=16)" in report.summary


def test_dims_given_on_expand_and_lower_verify_are_used(transformer, tmp_path):
    original, _ = transformer
    for command in ("expand", "lower"):
        report = tmp_path / f"{command}.json"
        assert main([command, str(original), "-o", str(tmp_path / f"{command}.onnx"), "--verify", "--dim", "s=5",
                     "-q", "--json", str(report)]) == 0
        import json

        assert json.loads(report.read_text())["verify"]["dims"] == {"b": 2, "s": 5}


def test_progress_names_every_stage_in_order(transformer):
    original, expanded = transformer
    seen = []
    dql_pass.verify(original, expanded, progress=lambda stage, done, total: seen.append((stage, done, total)))
    stages = list(dict.fromkeys(stage for stage, _, _ in seen))
    assert stages == ["sites", "input sets", "lowered ops"]  # the integer ops: an expansion keeps them
    sites = [(done, total) for stage, done, total in seen if stage == "sites"]
    assert sites == [(i, len(sites)) for i in range(len(sites))] and len(sites) == 4  # one DQL before each MatMul


def test_progress_goes_to_stderr_as_lines_where_stderr_is_no_terminal(transformer, capsys, monkeypatch):
    from dql_pass.cli import progress

    original, expanded = transformer
    monkeypatch.setattr(progress.Progress, "_EVERY", 0.0)
    assert main(["verify", str(original), str(expanded)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert any(line.startswith("dql-pass: verify: sites 1 of 4 (") for line in lines), lines
    assert any(line.startswith("dql-pass: verify: input sets ") for line in lines), lines
    assert main(["verify", str(original), str(expanded), "-q"]) == 0
    assert capsys.readouterr() == ("", "")


def _verified_on(runtime: str, sample: str, folder, **expansion) -> tuple[dql_pass.VerifyReport, object]:
    """``sample`` from models/ expanded (as ``expansion`` says) and verified on ``runtime``, with the
    expansion's path."""
    installed(runtime)
    original, expanded = MODELS / f"{sample}.onnx", folder / "e.onnx"
    dql_pass.expand_file(original, expanded, **expansion)
    return dql_pass.verify(original, expanded, runtime=runtime), expanded


def test_a_runtime_that_runs_neither_model_is_its_own_verdict_not_a_fail(tmp_path):
    # OpenVINO reads no model-local function: not ORIGINAL's, nor the expansion that keeps it.
    report, _ = _verified_on("openvino", "control_flow", tmp_path, target="openvino")
    assert report.verdict == "CANNOT RUN" and report.exit_code == 3 and not report
    assert "openvino cannot run REWRITTEN" in report.cannot_run and "nor ORIGINAL" in report.cannot_run
    assert "No conversion rule found for operations: local.FakeQuant" in report.cannot_run  # the reason, whole


def test_a_rewrite_the_runtime_cannot_run_while_it_runs_original_is_a_fail(tmp_path):
    # quantizelinear: a QuantizeLinear whose scale is computed, which tract refuses; the native DQL runs.
    report, _ = _verified_on("tract", "mlp_dynamic", tmp_path, variant="quantizelinear")
    assert report.verdict == "FAIL" and report.cannot_run is None
    assert report.model_error.startswith("tract cannot run REWRITTEN")  # the model level failed it, not a site


def test_on_another_runtime_the_report_gives_each_outputs_distance_from_ort(tmp_path):
    report, expanded = _verified_on("tract", "mlp_dynamic", tmp_path, target="tract")
    original = MODELS / "mlp_dynamic.onnx"
    assert [o.name for o in report.from_ort] == [o.name for o in onnx.load(original).graph.output]
    assert "from ORT: final output 'relu3' on tract against ORIGINAL on ORT: " in report.format()
    assert dql_pass.verify(original, expanded).from_ort == []  # on ORT itself, the verdict says it all
