"""Conformance suites: layout, onnx's loader, ORT and onnx.reference runs, known differences, the CLI.

The suites here are reduced (two opsets, no large input) to stay fast; one small generation checks
the large input on its own.
"""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests

from dql_pass import catalogue, conformance
from dql_pass.cli import main
from dql_pass.errors import InputError

FOLDER = re.compile(r"^test_dynamicquantizelinear_[A-Za-z0-9_]+?(_expanded_(quantizelinear|arithmetic))?_opset\d+$")


def _manifest(path):
    return {e["folder"]: e for e in json.loads((path / conformance.MANIFEST).read_text())["cases"]}


def _statuses(report):
    return {o.name: o.status for o in report.outcomes}


@pytest.fixture(scope="module")
def ort_suite(tmp_path_factory):
    """The onnxruntime policy at opsets 11 and 21, NaN inputs included."""
    path = tmp_path_factory.mktemp("ort") / "dql"
    conformance.generate_suite(path, opsets=(11, 21), include_large=False, include_unspecified=True)
    return path


@pytest.fixture(scope="module")
def reference_suite(tmp_path_factory):
    """The onnx-reference policy at opsets 13 and 27."""
    path = tmp_path_factory.mktemp("reference") / "dql"
    conformance.generate_suite(path, opsets=(13, 27), zero_range="onnx-reference", include_large=False)
    return path


@pytest.fixture()
def small_suite(tmp_path):
    """Two inputs, every form, one opset: cheap to edit."""
    path = tmp_path / "dql"
    conformance.generate_suite(path, opsets=(18,), include_large=False, names=("spec_example", "rank_0"))
    return path


def test_the_suite_covers_the_issue_categories(ort_suite):
    manifest = _manifest(ort_suite)
    names = {e["name"] for e in manifest.values() if e["comparable"]}
    assert len(names) >= 40
    assert {
        "spec_example", "spec_max_adjusted", "spec_min_adjusted", "tie_unit_scale", "tie_zero_point_even",
        "tie_zero_point_odd", "odd_zero_point_with_ties", "all_positive", "all_negative", "mixed_signs",
        "signed_zeros", "negative_zero", "single_element", "empty", "magnitude_1e-30", "magnitude_1e30",
        "subnormal_scale", "underflow_scale", "positive_inf", "negative_inf", "range_overflow",
    } <= names
    assert {len(e["shape"]) for e in manifest.values()} >= {0, 1, 2, 3, 4, 5}
    assert any(0 in e["shape"] for e in manifest.values())
    # Every input in every form at every opset, each in its own folder.
    assert {(e["variant"], e["opset"]) for e in manifest.values()} == {
        (f, o) for f in conformance.FORMS for o in (11, 21)
    }
    assert len(manifest) == len({e["name"] for e in manifest.values()}) * 3 * 2


def test_the_manifest_describes_every_folder(ort_suite):
    manifest = _manifest(ort_suite)
    folders = {d.name for d in ort_suite.iterdir() if d.is_dir()}
    assert set(manifest) == folders
    by_name = {c.name: c for c in catalogue.cases(include_nan=True)}
    for folder, entry in manifest.items():
        assert FOLDER.match(folder), folder
        case = by_name[entry["name"]]
        assert entry["policy"] == "onnxruntime"
        assert entry["category"] == case.category and entry["description"].startswith(case.description)
        assert entry["policy_dependent"] == case.zero_range
        assert entry["comparable"] == (entry["category"] != "nan")
    assert any(e["policy_dependent"] for e in manifest.values())


def test_the_suite_loads_with_onnx_loader(ort_suite):
    tests = load_model_tests(data_dir=str(ort_suite.parent), kind=ort_suite.name)
    assert {t.name for t in tests} == set(_manifest(ort_suite))
    for test in tests:
        assert (test.rtol, test.atol) == (0, 0)
        model = onnx.load(f"{test.model_dir}/model.onnx")
        data_set = f"{test.model_dir}/test_data_set_0"
        x = onnx.load_tensor(f"{data_set}/input_0.pb")
        outputs = [onnx.load_tensor(f"{data_set}/output_{i}.pb") for i in range(3)]
        assert [x.name] == [i.name for i in model.graph.input]
        assert [o.name for o in outputs] == [o.name for o in model.graph.output] == ["y", "y_scale", "y_zero_point"]


def test_the_expected_outputs_are_the_reference(ort_suite):
    folder = ort_suite / "test_dynamicquantizelinear_spec_example_opset11" / "test_data_set_0"
    y, y_scale, y_zero_point = (numpy_helper.to_array(onnx.load_tensor(folder / f"output_{i}.pb")) for i in range(3))
    assert np.array_equal(y, np.array([153, 255, 0, 26, 221, 179], np.uint8)) and y.dtype == np.uint8
    assert y_scale.shape == () and y_scale.view(np.uint32) == np.float32(0.019607844).view(np.uint32)
    assert y_zero_point.dtype == np.uint8 and y_zero_point == 153


def test_every_case_passes_on_onnxruntime(ort_suite):
    report = conformance.run_suite(ort_suite, "onnxruntime")
    manifest = _manifest(ort_suite)
    statuses = _statuses(report)
    assert report.failed == 0, [o.line() for o in report.outcomes if o.status == "FAIL"]
    # NaN inputs run without crashing but are not compared; every other folder is a plain pass.
    assert {f for f, s in statuses.items() if s != "PASS"} == {f for f, e in manifest.items() if not e["comparable"]}
    assert set(statuses.values()) == {"PASS", "SKIP"}


def test_expanded_variants_pass_on_onnxruntime_under_the_onnx_reference_policy(reference_suite):
    report = conformance.run_suite(reference_suite, "onnxruntime")
    manifest = _manifest(reference_suite)
    assert report.failed == 0
    not_passed = {f for f, s in _statuses(report).items() if s != "PASS"}
    # Only the native node on a zero range differs: ORT's kernel keeps the scale 1.0.
    assert not_passed == {f for f, e in manifest.items() if e["variant"] == "native" and e["policy_dependent"]}
    assert all(_statuses(report)[f] == "XFAIL" for f in not_passed)


def test_onnx_reference_passes_except_the_listed_differences(reference_suite):
    report = conformance.run_suite(reference_suite, "reference")
    manifest = _manifest(reference_suite)
    statuses = _statuses(report)
    assert report.failed == 0, [o.line() for o in report.outcomes if o.status == "FAIL"]
    listed = {f for f, e in manifest.items() if "reference" in e["known_differences"]}
    # XFAIL means the case really differs on onnx.reference; an unneeded listing would be SKIP.
    assert {f for f, s in statuses.items() if s != "PASS"} == listed
    assert {statuses[f] for f in listed} == {"XFAIL"}
    assert {(manifest[f]["name"], manifest[f]["variant"]) for f in listed} == {
        ("empty", "native"), ("empty_rank_3", "native"),
        ("underflow_scale", "quantizelinear"), ("underflow_scale_signed", "quantizelinear"),
    }
    assert all(manifest[f]["known_differences"]["reference"] for f in listed)


def test_an_edited_expected_output_fails(small_suite, capsys):
    folder = "test_dynamicquantizelinear_spec_example_expanded_arithmetic_opset18"
    path = small_suite / folder / "test_data_set_0" / "output_0.pb"
    tensor = onnx.load_tensor(path)
    y = numpy_helper.to_array(tensor).copy()
    y[2] += 1
    path.write_bytes(numpy_helper.from_array(y, tensor.name).SerializeToString())

    assert main(["run-tests", str(small_suite)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"FAIL {folder}: ") and "y differs in 1 of 6" in line for line in lines)
    assert lines[-1] == "5 passed, 1 failed"


def test_a_one_ulp_scale_edit_fails(small_suite):
    # A tolerance (onnx's default rtol is 1e-3) would let this through; the runner compares bits.
    path = small_suite / "test_dynamicquantizelinear_rank_0_opset18" / "test_data_set_0" / "output_1.pb"
    tensor = onnx.load_tensor(path)
    scale = numpy_helper.to_array(tensor)
    path.write_bytes(numpy_helper.from_array(np.nextafter(scale, np.float32(1)), tensor.name).SerializeToString())
    report = conformance.run_suite(small_suite)
    assert (report.passed, report.failed) == (5, 1)
    assert "y_scale differs" in next(o.detail for o in report.outcomes if o.status == "FAIL")


def test_a_suite_without_manifest_runs(small_suite):
    (small_suite / conformance.MANIFEST).unlink()
    assert conformance.run_suite(small_suite, "reference").summary() == "6 passed, 0 failed"


def test_the_large_input_is_written_at_the_newest_opset_only(tmp_path):
    path = tmp_path / "dql"
    suite = conformance.generate_suite(
        path, opsets=(13, 21), forms=("native", "arithmetic"), names=("large_1m",), include_large=True
    )
    assert sorted(e.folder for e in suite.entries) == [
        "test_dynamicquantizelinear_large_1m_expanded_arithmetic_opset21",
        "test_dynamicquantizelinear_large_1m_opset21",
    ]
    x = onnx.load_tensor(path / "test_dynamicquantizelinear_large_1m_opset21" / "test_data_set_0" / "input_0.pb")
    assert numpy_helper.to_array(x).size == 1 << 20
    assert conformance.run_suite(path).summary() == "2 passed, 0 failed"


def test_the_cli_writes_and_runs_a_suite(tmp_path, capsys):
    path = tmp_path / "suites" / "dql"
    assert main(["gen-tests", str(path), "--opsets", "11", "--variants", "native", "--no-large"]) == 0
    assert capsys.readouterr().out.startswith(f"wrote 56 test folders from 56 inputs to {path}: ")
    assert main(["run-tests", str(path), "--backend", "reference"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "51 passed, 0 failed, 5 skipped"
    # A second generation replaces the first suite.
    assert main(["gen-tests", str(path), "--opsets", "21", "--variants", "quantizelinear", "--no-large"]) == 0
    assert {d.name.rpartition("_opset")[2] for d in path.iterdir() if d.is_dir()} == {"21"}
    assert not [p for p in path.parent.iterdir() if p.name != "dql"]  # no staging folder left behind


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run-tests", "{tmp}/missing"], "no such folder"),
        (["run-tests", "{tmp}/foreign"], "no test folders"),
        (["gen-tests", "{tmp}/foreign"], "holds no dql_pass suite"),
        (["gen-tests", "{tmp}/new", "--opsets", "10"], "opset 10 is outside"),
        (["gen-tests", "{tmp}/new", "--variants", "native,fast"], "unknown variant 'fast'"),
        (["run-tests", "{tmp}/new", "--backend", "reference"], "no such folder"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(tmp_path, capsys, argv, message):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dql-pass: error: ") and message in err
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"] and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign"]


def test_the_api_rejects_bad_options(tmp_path):
    with pytest.raises(InputError, match="no catalogue case"):
        conformance.generate_suite(tmp_path / "dql", names=("no_such_case",))
    with pytest.raises(InputError, match="unknown zero-range policy"):
        conformance.generate_suite(tmp_path / "dql", zero_range="half")
    with pytest.raises(InputError, match="unknown backend"):
        conformance.run_suite(tmp_path, "tvm")


def test_a_pruned_suite_runs_and_reports_the_missing_folders(ort_suite, tmp_path):
    # Folders are self-contained, so what is left runs; what the manifest lists but is gone fails.
    copy = tmp_path / "dql"
    shutil.copytree(ort_suite, copy, ignore=shutil.ignore_patterns("*opset21*", "*nan*"))
    report = conformance.run_suite(copy)
    assert report.failed == len([f for f in _manifest(copy) if "opset21" in f or "nan" in f])
    assert report.passed == len([d for d in copy.iterdir() if d.is_dir()])
