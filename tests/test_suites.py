"""Conformance suites (dql_pass.suites): layout, onnx's loader, ORT and onnx.reference runs, known differences.

The suites here are reduced (two opsets, no large input) to stay fast; one small generation checks
the large input on its own. The gen-tests and run-tests commands are tested in test_cli.py.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests

from dql_pass import inputs, runtimes, suites
from dql_pass.suites import layout
from dql_pass.errors import InputError
from dql_pass.files import FolderLock, safe

SMALL = 2 * len(suites.FORMS)  # the folders of the small_suite fixture
FOLDER = re.compile(r"^test_dynamicquantizelinear_[A-Za-z0-9_]+?"
                    r"(_expanded_(quantizelinear|arithmetic|float64|residual|portable))?_opset\d+$")


def _manifest(path):
    return {e["folder"]: e for e in json.loads((path / suites.MANIFEST).read_text())["cases"]}


def _statuses(report):
    return {o.name: o.status for o in report.outcomes}


@pytest.fixture(scope="module")
def ort_suite(tmp_path_factory):
    """The onnxruntime policy at opsets 11 and 21, NaN inputs included."""
    path = tmp_path_factory.mktemp("ort") / "dql"
    suites.generate_suite(path, opsets=(11, 21), include_large=False, include_unspecified=True)
    return path


@pytest.fixture(scope="module")
def reference_suite(tmp_path_factory):
    """The onnx-reference policy at opsets 13 and 27."""
    path = tmp_path_factory.mktemp("reference") / "dql"
    suites.generate_suite(path, opsets=(13, 27), zero_range="onnx-reference", include_large=False)
    return path


def test_the_suite_covers_every_category_of_input(ort_suite):
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
        (f, o) for f in suites.FORMS for o in (11, 21)
    }
    assert len(manifest) == len({e["name"] for e in manifest.values()}) * len(suites.FORMS) * 2


def test_the_manifest_describes_every_folder(ort_suite):
    manifest = _manifest(ort_suite)
    folders = {d.name for d in ort_suite.iterdir() if d.is_dir()}
    assert set(manifest) == folders
    by_name = {c.name: c for c in inputs.cases(include_nan=True)}
    for folder, entry in manifest.items():
        assert FOLDER.match(folder), folder
        case = by_name[entry["name"]]
        assert entry["policy"] == "onnxruntime"
        assert entry["category"] == case.category and entry["description"].startswith(case.description)
        assert entry["policy_dependent"] == case.policy_dependent
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
    report = suites.run_suite(ort_suite, "onnxruntime")
    manifest = _manifest(ort_suite)
    statuses = _statuses(report)
    assert report.failed == 0, [o.line() for o in report.outcomes if o.status == "FAIL"]
    # NaN inputs run without crashing but are not compared; every other folder is a plain pass.
    assert {f for f, s in statuses.items() if s != "PASS"} == {f for f, e in manifest.items() if not e["comparable"]}
    assert set(statuses.values()) == {"PASS", "SKIP"}


def test_expanded_variants_pass_on_onnxruntime_under_the_onnx_reference_policy(reference_suite):
    report = suites.run_suite(reference_suite, "onnxruntime")
    manifest = _manifest(reference_suite)
    assert report.failed == 0
    not_passed = {f for f, s in _statuses(report).items() if s != "PASS"}
    # Only the native node on a zero range differs: ORT's kernel keeps the scale 1.0.
    assert not_passed == {f for f, e in manifest.items() if e["variant"] == "native" and e["policy_dependent"]}
    assert all(_statuses(report)[f] == "XFAIL" for f in not_passed)


def test_onnx_reference_passes_except_the_listed_differences(reference_suite):
    report = suites.run_suite(reference_suite, "reference")
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


def test_a_one_ulp_scale_edit_fails(small_suite):
    # A tolerance (onnx's default rtol is 1e-3) would let this through; the runner compares bits.
    path = small_suite / "test_dynamicquantizelinear_rank_0_opset18" / "test_data_set_0" / "output_1.pb"
    tensor = onnx.load_tensor(path)
    scale = numpy_helper.to_array(tensor)
    path.write_bytes(numpy_helper.from_array(np.nextafter(scale, np.float32(1)), tensor.name).SerializeToString())
    report = suites.run_suite(small_suite)
    assert (report.passed, report.failed) == (SMALL - 1, 1)
    assert "y_scale differs" in next(o.detail for o in report.outcomes if o.status == "FAIL")


def test_a_suite_without_manifest_runs(small_suite):
    (small_suite / suites.MANIFEST).unlink()
    assert suites.run_suite(small_suite, "reference").summary == f"{SMALL} passed, 0 failed"


def test_the_large_input_is_written_at_the_newest_opset_only(tmp_path):
    path = tmp_path / "dql"
    suite = suites.generate_suite(
        path, opsets=(13, 21), variants=("native", "arithmetic"), names=("large_1m",), include_large=True
    )
    assert sorted(e.folder for e in suite.entries) == [
        "test_dynamicquantizelinear_large_1m_expanded_arithmetic_opset21",
        "test_dynamicquantizelinear_large_1m_opset21",
    ]
    x = onnx.load_tensor(path / "test_dynamicquantizelinear_large_1m_opset21" / "test_data_set_0" / "input_0.pb")
    assert numpy_helper.to_array(x).size == 1 << 20
    assert suites.run_suite(path).summary == "2 passed, 0 failed"


def test_the_api_rejects_bad_options(tmp_path):
    with pytest.raises(InputError, match="no catalogue case"):
        suites.generate_suite(tmp_path / "dql", names=("no_such_case",))
    with pytest.raises(InputError, match="unknown zero-range policy"):
        suites.generate_suite(tmp_path / "dql", zero_range="half")
    with pytest.raises(InputError, match="unknown runtime"):
        suites.run_suite(tmp_path, "nosuch")


def test_a_pruned_suite_runs_and_reports_the_missing_folders(ort_suite, tmp_path):
    # Folders are self-contained, so what is left runs; what the manifest lists but is gone fails.
    copy = tmp_path / "dql"
    shutil.copytree(ort_suite, copy, ignore=shutil.ignore_patterns("*opset21*", "*nan*"))
    report = suites.run_suite(copy)
    assert report.failed == len([f for f in _manifest(copy) if "opset21" in f or "nan" in f])
    assert report.passed == len([d for d in copy.iterdir() if d.is_dir()])


# --- a test passes only with every file of its model, each read from inside the suite, bounded ---

SPEC = "test_dynamicquantizelinear_spec_example_opset18"
SECRET = bytes([83, 69, 67, 82, 69, 84])  # "SECRET": six uint8, the size of spec_example's y


def _not_passed(report):
    return [o.line() for o in report.outcomes if o.status != "PASS"]


def _rewrite(path, tensor):
    path.write_bytes(tensor.SerializeToString())


def _to_external(path, location, data=None):
    """Rewrite the TensorProto file ``path`` to keep its data at ``location``; ``data`` is written beside it."""
    tensor = onnx.load_tensor(path)
    raw = numpy_helper.to_array(tensor).tobytes()
    if data is not None:
        (path.parent / data).write_bytes(raw)
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", location
    _rewrite(path, tensor)


@pytest.mark.parametrize("file", ["input_0.pb", "output_0.pb", "output_2.pb"])
def test_a_missing_data_file_fails_naming_it(small_suite, file):
    (small_suite / SPEC / "test_data_set_0" / file).unlink()
    report = suites.run_suite(small_suite)
    assert _not_passed(report) == [f"FAIL {SPEC}: test_data_set_0/{file} is missing"]
    assert report.summary == f"{SMALL - 1} passed, 1 failed"


def test_a_suite_without_its_last_outputs_fails_everywhere(small_suite):
    for path in small_suite.glob("*/test_data_set_0/output_2.pb"):
        path.unlink()
    report = suites.run_suite(small_suite, "reference")
    assert report.summary == f"0 passed, {SMALL} failed"
    assert {o.detail for o in report.outcomes} == {"test_data_set_0/output_2.pb is missing"}


def test_a_known_difference_does_not_excuse_a_missing_file(small_suite):
    manifest = json.loads((small_suite / suites.MANIFEST).read_text())
    for entry in manifest["cases"]:
        entry["known_differences"] = {"onnxruntime": "listed to check that it does not hide a broken test"}
        entry["comparable"] = entry["folder"] != SPEC
    (small_suite / suites.MANIFEST).write_text(json.dumps(manifest))
    (small_suite / SPEC / "test_data_set_0" / "output_1.pb").unlink()
    report = suites.run_suite(small_suite)
    assert sorted(_not_passed(report)) == sorted([f"FAIL {SPEC}: test_data_set_0/output_1.pb is missing"] + [
        f"SKIP {f}: listed as a known difference on onnxruntime (listed to check that it does not hide a broken test), "
        "but it matched" for f in _manifest(small_suite) if f != SPEC
    ])


def test_a_model_without_outputs_fails_on_every_backend(small_suite):
    # A test that compares nothing would pass whatever the backend computes.
    path = small_suite / SPEC / "model.onnx"
    model = onnx.load(path)
    del model.graph.output[:]
    path.write_bytes(model.SerializeToString())
    for output in (small_suite / SPEC / "test_data_set_0").glob("output_*.pb"):
        output.unlink()
    for runtime in ('onnxruntime', 'reference'):
        assert _not_passed(suites.run_suite(small_suite, runtime)) == [f"FAIL {SPEC}: the model has no outputs"]


def test_a_data_file_the_model_has_no_value_for_fails(small_suite):
    data_set = small_suite / SPEC / "test_data_set_0"
    shutil.copy(data_set / "output_2.pb", data_set / "output_3.pb")
    assert _not_passed(suites.run_suite(small_suite)) == [
        f"FAIL {SPEC}: test_data_set_0/output_3.pb: the model has 3 outputs, so no such file is read"
    ]


def test_two_files_of_one_output_fail(small_suite):
    # output_1.pb holding y again would leave y_scale unchecked.
    data_set = small_suite / SPEC / "test_data_set_0"
    shutil.copy(data_set / "output_0.pb", data_set / "output_1.pb")
    assert _not_passed(suites.run_suite(small_suite)) == [
        f"FAIL {SPEC}: test_data_set_0/output_1.pb holds y, as test_data_set_0/output_0.pb does"
    ]


def test_external_data_of_a_test_file_is_read_beside_it(small_suite, tmp_path, monkeypatch):
    data_set = small_suite / SPEC / "test_data_set_0"
    _to_external(data_set / "input_0.pb", "input_0.bin", data="input_0.bin")
    _to_external(data_set / "output_0.pb", "y/data.bin", data=None)
    (data_set / "y").mkdir()
    (data_set / "y" / "data.bin").write_bytes(np.array([153, 255, 0, 26, 221, 179], np.uint8).tobytes())
    monkeypatch.chdir(tmp_path)  # not the data set's folder: nothing may be looked up here
    assert suites.run_suite(small_suite).summary == f"{SMALL} passed, 0 failed"
    (data_set / "y" / "data.bin").write_bytes(np.array([153, 255, 0, 26, 221, 178], np.uint8).tobytes())
    assert _not_passed(suites.run_suite(small_suite)) == [
        f"FAIL {SPEC}: test_data_set_0: y differs in 1 of 6 elements, first at [5]: got 179, expected 178 "
        "(input x[5] = 0.5)"
    ]


@pytest.mark.parametrize("location", ["secret.bin", "../../../secret.bin", "{tmp}/secret.bin", "link.bin"])
def test_external_data_outside_the_data_set_is_refused(small_suite, tmp_path, monkeypatch, location):
    (tmp_path / "secret.bin").write_bytes(SECRET)
    data_set = small_suite / SPEC / "test_data_set_0"
    (data_set / "link.bin").symlink_to(tmp_path / "secret.bin")
    _to_external(data_set / "output_0.pb", location.format(tmp=tmp_path))
    monkeypatch.chdir(tmp_path)  # where run-tests once looked
    [line] = _not_passed(suites.run_suite(small_suite))
    assert line.startswith(f"FAIL {SPEC}: test_data_set_0/output_0.pb: external data refused: ")
    assert "expected" not in line and " 83" not in line  # nothing of the secret file is shown


def test_a_symlink_to_a_file_inside_the_suite_is_read(small_suite):
    data_set = small_suite / SPEC / "test_data_set_0"
    (small_suite / "shared").mkdir()
    (data_set / "output_1.pb").rename(small_suite / "shared" / "y_scale.pb")
    (data_set / "output_1.pb").symlink_to("../../shared/y_scale.pb")
    assert suites.run_suite(small_suite).summary == f"{SMALL} passed, 0 failed"


def test_a_symlink_out_of_the_suite_is_refused(small_suite, tmp_path):
    data_set = small_suite / SPEC / "test_data_set_0"
    (data_set / "output_1.pb").rename(tmp_path / "y_scale.pb")  # the right tensor, but not the suite's
    (data_set / "output_1.pb").symlink_to(tmp_path / "y_scale.pb")
    outside = tmp_path / "elsewhere"
    shutil.move(small_suite / "test_dynamicquantizelinear_rank_0_opset18", outside)
    (small_suite / "test_dynamicquantizelinear_rank_0_opset18").symlink_to(outside)
    assert _not_passed(suites.run_suite(small_suite)) == [
        "FAIL test_dynamicquantizelinear_rank_0_opset18: model.onnx is outside the suite (through a symlink)",
        f"FAIL {SPEC}: test_data_set_0/output_1.pb is outside the suite (through a symlink)",
    ]


def test_a_data_file_larger_than_its_model_allows_is_refused(small_suite):
    # A valid tensor, padded: what is read is bounded by the model's type and shape, x float32[6].
    path = small_suite / SPEC / "test_data_set_0" / "input_0.pb"
    tensor = onnx.load_tensor(path)
    tensor.doc_string = "." * 70_000
    _rewrite(path, tensor)
    size = path.stat().st_size
    assert _not_passed(suites.run_suite(small_suite)) == [
        f"FAIL {SPEC}: test_data_set_0/input_0.pb holds {size} bytes, more than the {65536 + 1 + 16 * 6} it may hold"
    ]


def test_symbolic_dims_get_a_finite_bound(small_suite, monkeypatch):
    model_path = small_suite / SPEC / "model.onnx"
    model = onnx.load(model_path)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "n"
    model_path.write_bytes(model.SerializeToString())
    monkeypatch.setattr(layout, "UNKNOWN_SHAPE_LIMIT", 1000)
    assert suites.run_suite(small_suite).summary == f"{SMALL} passed, 0 failed"
    data_set = small_suite / SPEC / "test_data_set_0"
    _to_external(data_set / "input_0.pb", "x.bin", data="x.bin")
    with (data_set / "x.bin").open("ab") as file:  # the six floats, then more than the bound allows
        file.write(bytes(1000))
    assert _not_passed(suites.run_suite(small_suite)) == [
        f"FAIL {SPEC}: test_data_set_0/input_0.pb: its external data holds 1024 bytes, more than the 1000 it may hold"
    ]


def test_a_manifest_of_more_than_a_few_megabytes_is_bad_input(small_suite):
    path = small_suite / suites.MANIFEST
    text = path.read_text()
    path.write_text(text + " " * (1 << 20))  # 1 MB of padding is still read
    assert suites.run_suite(small_suite).summary == f"{SMALL} passed, 0 failed"
    path.write_text(text + " " * (9 << 20))
    with pytest.raises(InputError, match=rf"manifest.json holds {len(text) + (9 << 20)} bytes, more than the"):
        suites.run_suite(small_suite)


# --- gen-tests: only folders the suite's backend runs; nothing it did not write is replaced ---


def test_folders_the_backend_cannot_run_are_left_out_and_listed(tmp_path):
    reason = runtimes.lacking("onnxruntime", {("", "QuantizeLinear")}, 28)[0].describe()
    assert reason.startswith("QuantizeLinear-28 does not run on onnxruntime")
    path = tmp_path / "dql"
    suite = suites.generate_suite(path, opsets=(27, 28), names=("spec_example",), include_large=False)
    left = "test_dynamicquantizelinear_spec_example_expanded_quantizelinear_opset28"
    assert suite.left_out == [suites.LeftOut(left, "spec_example", 28, "quantizelinear", reason)]
    assert not (path / left).exists()
    manifest = json.loads((path / suites.MANIFEST).read_text())
    assert manifest["left_out"] == [
        {"folder": left, "name": "spec_example", "opset": 28, "variant": "quantizelinear", "reason": reason}
    ]
    assert sorted(e["folder"] for e in manifest["cases"]) == sorted(d.name for d in path.iterdir() if d.is_dir())
    ran = 2 * len(suites.FORMS) - 1
    assert len(manifest["cases"]) == ran
    assert suites.run_suite(path).summary == f"{ran} passed, 0 failed"


def test_under_the_onnx_reference_policy_an_ort_lack_is_a_known_difference(tmp_path):
    path = tmp_path / "dql"
    suite = suites.generate_suite(
        path, opsets=(28,), variants=("quantizelinear",), names=("spec_example",), zero_range="onnx-reference"
    )
    [entry] = suite.entries
    assert suite.left_out == []
    lack = runtimes.lacking("onnxruntime", {("", "QuantizeLinear")}, 28)[0]
    assert entry.known_differences["onnxruntime"] == lack.describe()
    assert "reference" not in entry.known_differences
    assert _statuses(suites.run_suite(path)) == {entry.folder: "XFAIL"}
    assert suites.run_suite(path, "reference").summary == "1 passed, 0 failed"


def test_a_choice_the_backend_runs_nothing_of_is_bad_input(tmp_path):
    with pytest.raises(InputError, match="onnxruntime can run none of the chosen folders: QuantizeLinear-28"):
        suites.generate_suite(tmp_path / "dql", opsets=(28,), variants=("quantizelinear",), include_large=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("added, reported", [
    ("notes.txt", "notes.txt"),
    (f"{SPEC}/README", f"{SPEC}/README"),
    # a folder it did not write is named, not entered
    (f"{SPEC}/test_data_set_1/input_0.pb", f"{SPEC}/test_data_set_1"),
    ("subdir/", "subdir"),
])
def test_a_suite_holding_added_files_is_not_replaced_unless_forced(small_suite, added, reported):
    path = small_suite / added
    path.parent.mkdir(parents=True, exist_ok=True)
    if added.endswith("/"):
        path.mkdir()
    else:
        path.write_text("mine")
    with pytest.raises(InputError, match=rf"holds 1 file\(s\) that gen-tests did not write \({reported}\)"):
        suites.generate_suite(small_suite, opsets=(13,), variants=("native",), names=("rank_0",))
    assert path.exists() and len(_manifest(small_suite)) == SMALL
    suites.generate_suite(small_suite, opsets=(13,), variants=("native",), names=("rank_0",), force=True)
    expected = [suites.MANIFEST, "test_dynamicquantizelinear_rank_0_opset13"]
    assert sorted(p.name for p in small_suite.iterdir()) == expected


def test_a_file_replaced_by_a_symlink_is_not_what_gen_tests_wrote(small_suite, tmp_path):
    output = small_suite / SPEC / "test_data_set_0" / "output_0.pb"
    output.rename(tmp_path / "y.pb")
    output.symlink_to(tmp_path / "y.pb")
    with pytest.raises(InputError, match="did not write"):
        suites.generate_suite(small_suite, opsets=(13,), variants=("native",), names=("rank_0",))
    assert output.is_symlink() and (tmp_path / "y.pb").exists()


def test_a_suite_with_edited_files_is_replaced(small_suite):
    (small_suite / SPEC / "test_data_set_0" / "output_0.pb").write_bytes(b"edited")
    (small_suite / "test_dynamicquantizelinear_rank_0_opset18" / "data.json").unlink()
    suites.generate_suite(small_suite, opsets=(13,), variants=("native",), names=("rank_0",))
    assert [e["folder"] for e in json.loads((small_suite / suites.MANIFEST).read_text())["cases"]] == [
        "test_dynamicquantizelinear_rank_0_opset13"
    ]


def test_force_never_replaces_a_folder_without_a_suite(tmp_path):
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="holds no dql_pass suite"):
        suites.generate_suite(tmp_path, names=("rank_0",), include_large=False, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_stage_folders_left_by_earlier_runs_are_removed_unless_a_live_run_holds_them(small_suite):
    left = small_suite.parent / ".dql.lefthere.stage"  # what a kill -9 leaves (mkdtemp: 8 of [a-z0-9_])
    (left / SPEC).mkdir(parents=True)
    held = small_suite.parent / ".dql.heldhere.stage"  # a run still writing
    held.mkdir()
    lock = FolderLock(held)
    try:
        suites.generate_suite(small_suite, opsets=(13,), variants=("native",), names=("rank_0",))
        assert sorted(p.name for p in small_suite.parent.iterdir()) == [".dql.heldhere.stage", "dql"]
    finally:
        lock.release()
    suites.generate_suite(small_suite, opsets=(13,), variants=("native",), names=("rank_0",))
    assert sorted(p.name for p in small_suite.parent.iterdir()) == ["dql"]


def _suite_folders(path):
    return sorted(d.name for d in path.iterdir() if d.is_dir())


@pytest.mark.parametrize("failure", ["interrupt", "full disk"])
@pytest.mark.parametrize("step", [1, 2])
def test_without_a_one_step_swap_the_two_renames_still_leave_a_whole_suite(small_suite, monkeypatch, failure, step):
    """Where the system cannot swap two folders in one step, gen-tests renames twice.

    An interrupt at either rename lands once both are done, and a failure of either leaves the old
    suite: the whole old suite or the whole new one, and nothing else beside it. (The one-step
    swap is covered against kill -9 at every step in test_suites_hostile.py.)
    """
    old = _suite_folders(small_suite)
    monkeypatch.setattr(safe, "exchange", lambda a, b: False)
    rename, calls = os.rename, []

    def failing(source, target):
        calls.append(source)
        if len(calls) == step:
            if failure == "full disk":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.kill(os.getpid(), signal.SIGINT)
        rename(source, target)

    monkeypatch.setattr(os, "rename", failing)
    # Python's own SIGINT handler, as in a terminal: a background job or a pytest-xdist worker starts
    # with SIGINT ignored, and an ignored signal stays ignored (dql_pass.interrupts).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt if failure == "interrupt" else InputError):
            suites.generate_suite(small_suite, opsets=(13,), variants=("native",), names=("rank_0",))
    finally:
        signal.signal(signal.SIGINT, previous)
    new = ["test_dynamicquantizelinear_rank_0_opset13"]
    assert _suite_folders(small_suite) == (new if failure == "interrupt" else old)
    assert sorted(p.name for p in small_suite.parent.iterdir()) == ["dql"]


def test_a_known_difference_does_not_excuse_a_model_that_is_wrong_on_ort(ort_suite, tmp_path):
    """onnx.reference's known difference (+inf quotients through QuantizeLinear) covers its
    arithmetic, not a model whose Clip bound was edited: that one fails on ORT too."""
    copy = tmp_path / "dql"
    shutil.copytree(ort_suite, copy)
    excused = [
        f for f, e in _manifest(copy).items()
        if "reference" in e.get("known_differences", {}) and e["variant"] == "quantizelinear" and (copy / f).is_dir()
    ]
    assert excused
    folder = copy / excused[0]
    model = onnx.load(folder / "model.onnx")
    [scale] = [n for n in model.graph.node if n.op_type == "Where"][:1]  # the zero-range guard of the scale
    scale.input[1], scale.input[2] = scale.input[2], scale.input[1]  # scale 1.0 where the range is not 0
    onnx.save(model, folder / "model.onnx")
    outcomes = {o.name: o for o in suites.run_suite(copy, "reference").outcomes}
    assert outcomes[excused[0]].status == "FAIL" and "wrong on onnxruntime too" in outcomes[excused[0]].detail


def test_run_tests_counts_each_form_and_outcome_and_raw_shows_what_known_differences_hide(tmp_path, capsys):
    from dql_pass.cli import main

    path = tmp_path / "dql"
    suites.generate_suite(path, opsets=(21,), variants=("native", "arithmetic"), include_large=False)
    report = suites.run_suite(path, "reference")
    counts = report.counts()
    assert sorted(counts) == ["arithmetic", "native"]
    assert counts["native"]["XFAIL"] > 0 and counts["arithmetic"]["FAIL"] == 0
    assert sum(sum(by.values()) for by in counts.values()) == len(report.outcomes)
    assert f"{counts['native']['XFAIL']} known differences (XFAIL)" in report.summary
    # Without the manifest's known differences, each of those is a FAIL an author of the runtime sees.
    raw = suites.run_suite(path, "reference", raw=True)
    assert raw.counts()["native"]["FAIL"] == counts["native"]["XFAIL"] and not raw
    assert main(["run-tests", str(path), "--runtime", "reference", "--raw"]) == 1
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.split()[:5] == ["form", "PASS", "FAIL", "XFAIL", "SKIP"])
    assert sorted(line.split()[0] for line in out[header + 1:header + 3]) == ["arithmetic", "native"]


def test_a_divergence_report_is_one_folder_a_form_with_wrong_outputs_apart_from_refusals(tmp_path):
    """onnx.reference, --raw: its own DynamicQuantizeLinear raises on an empty input and answers another zero range,
    and its QuantizeLinear sends x / 0 to 0. One report lumped them together as the op's, 'differing from the spec'."""
    from dql_pass.suites import divergence, matrix

    suite = tmp_path / "dql"
    suites.generate_suite(suite, opsets=(13,), variants=("native", "quantizelinear"), include_large=False,
                          names=("zeros", "empty", "underflow_scale", "spec_example"))
    written = divergence.write_reports(tmp_path / "reports", suite, matrix.run_matrix(suite, ["reference"], raw=True))
    assert [p.name for p in written] == ["reference__DynamicQuantizeLinear",
                                         "reference__DynamicQuantizeLinear__expanded_quantizelinear"]
    native, expanded = ((p / "ISSUE.md").read_text() for p in written)
    assert "Cases with other outputs (1):\n\n- test_dynamicquantizelinear_zeros_opset13" in native
    assert "Cases that did not load or run (1):\n\n- test_dynamicquantizelinear_empty_opset13" in native
    assert "ONNX Runtime's CPU kernel's, bit for bit" in native and "spec" not in native.split("```")[0]
    assert "as dql_pass's quantizelinear expansion" in expanded and "did not load or run" not in expanded
