"""The family's conformance suites: the registry, the cases' references, a small suite on onnx's loader and ORT,
ORT's known answers, run-tests per op x runtime, and divergence reports.

The written suite here holds a handful of cases per op (the registry's builders filtered), to stay fast;
the counts per opset are checked on the builders themselves.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.backend.test.loader import load_model_tests

from dql_pass import reference, runtimes, suites
from dql_pass.errors import InputError
from dql_pass.suites import divergence, family, family_ort

FAMILY = ("MatMulInteger", "ConvInteger", "QuantizeLinear", "DequantizeLinear")
# A few cases per op, ORT's known differences among them (K = 0, saturation, a zero point per row, one block).
CHOSEN = {
    "MatMulInteger": {"u8u8_2x3x4_nozp", "u8s8_bound_k2_max_nozp", "u8u8_k0_nozp", "u8u8_2x3x4_zp_per_row_column",
                      "s8s8_b1d_zp_wrap"},
    "ConvInteger": {"u8u8_2d_pads_zp_scalar", "u8u8_2d_zp_per_channel", "s8s8_3d_nozp"},
    "QuantizeLinear": {"uint8_zpmid_ties_s1", "int8_zpmax_specials_s0_1", "rank0", "nan_int8",
                       "blocked_32_axis0_block32_uint8",
                       "blocked_7_axis0_block2_int8"},
    "DequantizeLinear": {"uint8_zpmax_s0_1", "float16_int8_s65504", "blocked_64_axis0_block16_uint8_zp", "empty"},
}


def _write_small(path):
    with pytest.MonkeyPatch.context() as patch:
        for op, names in CHOSEN.items():
            builder = family.REGISTRY[op].cases
            patch.setitem(family.REGISTRY, op,
                          family.FamilyOp(op, lambda size, b=builder, n=names: [c for c in b(size) if c.name in n]))
        suites.generate_suite(path, ops=FAMILY, family_opsets={10, 21})


@pytest.fixture(scope="module")
def small_family(tmp_path_factory):
    path = tmp_path_factory.mktemp("family") / "suite"
    _write_small(path)
    return path


def _manifest(path):
    return {e["folder"]: e for e in json.loads((path / suites.MANIFEST).read_text())["cases"]}


def test_each_op_has_its_opsets_from_onnx_schemas():
    assert family.opsets_of("MatMulInteger") == family.opsets_of("ConvInteger") == [10]
    assert family.opsets_of("QuantizeLinear") == family.opsets_of("DequantizeLinear") == [10, 13, 19, 21, 23, 24, 25]


def test_every_op_has_at_least_a_hundred_cases_at_every_opset():
    for op in FAMILY:
        cases = family.REGISTRY[op].cases("small")
        assert len({c.name for c in cases}) == len(cases), op
        for opset in family.opsets_of(op):
            assert sum(c.since <= opset <= (c.until or opset) for c in cases) >= 100, (op, opset)


def test_an_unknown_op_or_opset_is_refused_with_the_reason(tmp_path):
    with pytest.raises(InputError, match="no conformance suite for op 'Gemm'"):
        suites.generate_suite(tmp_path / "s", ops=["Gemm"])
    with pytest.raises(InputError, match="MatMulInteger changed at opsets 10 only"):
        suites.generate_suite(tmp_path / "s", ops=["MatMulInteger"], family_opsets={11})
    assert not (tmp_path / "s").exists()


def test_quantize_linear_reads_like_the_spec():
    x = np.array([0.5, 1.5, 2.5, -0.5, -2.5, np.inf, -np.inf, 1e30], np.float32)
    assert reference.quantize_linear(x, np.float32(1), np.uint8(10)).tolist() == [10, 12, 12, 10, 8, 255, 0, 255]
    assert reference.quantize_linear(x, np.float32(1), np.int8(0)).tolist() == [0, 2, 2, 0, -2, 127, -128, 127]
    # Blocked: blocks of 2 along axis 0, the last one cut short.
    q = reference.quantize_linear(np.arange(5, dtype=np.float32), np.array([1, 2, 4], np.float32),
                                  np.array([0, 1, 2], np.uint8),
                                  axis=0, block_size=2)
    assert q.tolist() == [0, 1, 2, 3, 3]  # 2/2 + 1, round(3/2) + 1 = 3 (tie to even), 4/4 + 2
    # A float16 division rounds 12.65/0.1 onto the tie -126.5, which goes to even.
    assert reference.quantize_linear(np.float16([-12.65]), np.float16(0.1), np.int8(0),
                                     precision=np.float16).tolist() == [-126]
    assert reference.quantize_linear(np.float16([-12.65]), np.float16(0.1), np.int8(0)).tolist() == [-127]


def test_dequantize_linear_reads_like_the_spec():
    # A zero point that would wrap in uint8: 0 - 255 is -255.
    assert reference.dequantize_linear(np.uint8([0, 255]), np.float32(0.5), np.uint8(255)).tolist() == [-127.5, 0.0]
    y = reference.dequantize_linear(np.int8([127, -128]), np.float16(65504), np.int8(0))
    assert y.dtype == np.float16 and np.isinf(y).all()
    y = reference.dequantize_linear(np.uint8([1, 1, 1]), np.float32([2, 3]), None, axis=0, block_size=2)
    assert y.tolist() == [2, 2, 3]


def test_the_suite_loads_with_onnx_loader_and_lists_its_files(small_family):
    manifest = _manifest(small_family)
    tests = load_model_tests(data_dir=str(small_family.parent), kind=small_family.name)
    assert {t.name for t in tests} == set(manifest) and {e["op"] for e in manifest.values()} == set(FAMILY)
    assert {e["opset"] for e in manifest.values() if e["op"] == "QuantizeLinear"} == {10, 21}
    for test in tests:
        folder = small_family / test.name
        files = {p.relative_to(folder).as_posix() for p in folder.rglob("*")}
        assert files == set(manifest[test.name]["files"]), test.name
        model = onnx.load(folder / "model.onnx")
        assert len(list((folder / "test_data_set_0").glob("input_*.pb"))) == len(model.graph.input)
    # Written again without force: the manifest accounts for every file.
    _write_small(small_family)


def test_ort_passes_all_but_its_known_differences_and_gives_its_known_answers(small_family):
    manifest = _manifest(small_family)
    report = suites.run_suite(small_family, "onnxruntime")
    statuses = {o.name: o.status for o in report.outcomes}
    assert report.failed == 0, [o.line() for o in report.outcomes if o.status == "FAIL"]
    known = {f for f, e in manifest.items() if "onnxruntime" in e["known_differences"]}
    # K = 0 leaves ORT's output uninitialized: whatever the memory held, at times the expected zeros
    # (then a known difference that matched: SKIP).
    uninitialized = "test_matmulinteger_u8u8_k0_nozp_opset10"
    assert uninitialized in known and statuses[uninitialized] in ("XFAIL", "SKIP")
    # ORT's u8s8 kernels saturate on x86 without VNNI only: with VNNI those cases give the spec's sums.
    by_cpu = {f for f in known if "without VNNI" in json.dumps(manifest[f]["known_differences"])}
    saturates = bool(runtimes.get("onnxruntime").saturating_products())
    assert {f for f, s in statuses.items() if s == "XFAIL"} - {uninitialized} == (
        known - {uninitialized} - (set() if saturates else by_cpu))
    assert "test_matmulinteger_u8s8_bound_k2_max_nozp_opset10" in by_cpu  # 255 * 127 * 2 saturates to 32767
    # A known difference that matched is a SKIP ("listed as a known difference, but it matched").
    assert {f for f, s in statuses.items() if s == "SKIP"} - {uninitialized} == (
        {f for f in manifest if "nan_int8" in f} | (set() if saturates else by_cpu))


def test_an_answer_other_than_the_known_one_fails(small_family, tmp_path):
    import shutil

    copy = tmp_path / "suite"
    shutil.copytree(small_family, copy)
    folder = copy / "test_matmulinteger_u8s8_bound_k2_max_nozp_opset10"
    answer = folder / "answer_onnxruntime" / "output_0.pb"
    saturated = numpy_helper.to_array(onnx.load_tensor(answer))
    assert (saturated == 32767).all()
    answer.write_bytes(numpy_helper.from_array(saturated + 1, "y").SerializeToString())
    # The spec's sums too, which ORT gives on a CPU with VNNI: its output is then neither.
    expected = folder / "test_data_set_0" / "output_0.pb"
    spec = numpy_helper.to_array(onnx.load_tensor(expected))
    expected.write_bytes(numpy_helper.from_array(spec + 1, "y").SerializeToString())
    outcome = next(o for o in suites.run_suite(copy, "onnxruntime").outcomes if o.name == folder.name)
    assert outcome.status == "FAIL" and "nor is it the known answer" in outcome.detail


def test_the_saturation_answer_is_orts_pairs_of_products():
    case = next(c for c in family.REGISTRY["MatMulInteger"].cases("small") if c.name == "u8s8_bound_k259_max_zp_far")
    # 129 saturated pairs and one lone product, then the zero point's exact terms.
    assert family_ort.difference(case, 10).answer[0][0, 0] == 129 * 32767 + 255 * 127 + 128 * 255 * 259


def test_run_tests_counts_per_op_and_runtime_and_writes_a_divergence_report(small_family, tmp_path, capsys):
    import shutil

    from dql_pass.cli import main

    copy = tmp_path / "suite"
    shutil.copytree(small_family, copy)
    # A one-bit edit of an expected output: ORT now fails that one case.
    expected = copy / "test_dequantizelinear_uint8_zpmax_s0_1_opset10" / "test_data_set_0" / "output_0.pb"
    y = numpy_helper.to_array(onnx.load_tensor(expected)).copy()
    y.view(np.uint32)[3] ^= 1
    expected.write_bytes(numpy_helper.from_array(y, "y").SerializeToString())
    reports = tmp_path / "reports"
    assert main(["run-tests", str(copy), "--runtime", "onnxruntime,tinygrad", "--report-dir", str(reports)]) == 1
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()]
    assert ["DequantizeLinear", "onnxruntime"] in [row[:2] for row in rows]
    dq = next(row for row in rows if row[:2] == ["DequantizeLinear", "onnxruntime"])
    assert dq[3] == "1"  # failed
    assert any(row[:2] == ["*", "tinygrad"] and "not installed" in " ".join(row) for row in rows) or \
        runtimes.get("tinygrad").installed()
    report = reports / "onnxruntime__DequantizeLinear"
    assert sorted(p.name for p in report.iterdir()) == ["ISSUE.md", "actual", "differences.txt",
                                                        expected.parent.parent.name]
    first = (report / "differences.txt").read_text().splitlines()[0]
    assert first.startswith("y: [3]: expected") and f"0x{y[3:4].view(np.uint32)[0]:08x}" in first
    assert "onnxruntime 1." in (report / "ISSUE.md").read_text()
    # An existing report folder is never written over.
    assert main(["run-tests", str(copy), "--runtime", "onnxruntime", "--report-dir", str(reports)]) == 2
    # A report folder under a link to a folder: its stage goes beside it in the folder itself (a traceback, once).
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    assert main(["run-tests", str(copy), "--runtime", "onnxruntime", "--report-dir", str(tmp_path / "link" / "r")]) == 1
    assert (tmp_path / "real" / "r" / "onnxruntime__DequantizeLinear" / "ISSUE.md").is_file()


def test_first_differences_show_the_bits():
    lines = divergence.first_differences(np.float32([1, -0.0]), np.float32([1, 0.0]))
    assert lines == ["[1]: expected -0.0 (0x80000000), got 0.0 (0x00000000)"]


def test_variants_without_dynamicquantizelinear_among_the_ops_are_refused(tmp_path):
    """They are DynamicQuantizeLinear's forms: `--ops MatMulInteger --variants lean` ignored them silently."""
    with pytest.raises(InputError, match="variants are DynamicQuantizeLinear's forms"):
        suites.generate_suite(tmp_path / "s", ops=("MatMulInteger",), variants=("lean",))
    assert not (tmp_path / "s").exists()
