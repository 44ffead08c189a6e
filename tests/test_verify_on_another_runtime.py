"""verify on another runtime: REWRITTEN's final outputs are held to ORIGINAL run there, or where
ORIGINAL there differs from ORT, to ORIGINAL on ORT (the contract's bits), and the report says
which side differs; a REWRITTEN that matches neither still fails. A runtime's known difference
excuses the outputs it names, and only those."""

from __future__ import annotations

import numpy as np
import onnx
import helpers
import pytest
from helpers import installed
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import runtimes
from dql_pass.runtimes.openvino import OpenVino


def _dequantize(zero_point: int = 255, scale: float = 0.0123) -> onnx.ModelProto:
    """DequantizeLinear with zero point 255: OpenVINO's own kernel folds it into an FMA, which
    rounds otherwise than ORT on some inputs."""
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.array(scale, np.float32), "s"),
         numpy_helper.from_array(np.array(zero_point, np.uint8), "zp")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_a_rewrite_with_orts_bits_passes_where_original_on_the_runtime_differs(monkeypatch):
    installed("openvino")
    # A difference OpenVINO does not declare: held to ORIGINAL run there as it computes it.
    monkeypatch.setattr(OpenVino, "computed_otherwise", ())
    original = _dequantize()
    report = dql_pass.verify(original, dql_pass.lower(original, target="openvino")[0], runtime="openvino")
    assert report.verdict == "PASS", report.format()
    assert report.from_ort[0].identical
    assert any(note.startswith("final output 'y': ORIGINAL on openvino differs from ORT: ")
               and note.endswith("REWRITTEN on openvino is bit-identical to ORT")
               for note in report.notes), report.notes


def test_original_on_the_runtime_has_the_ops_it_computes_otherwise_lowered(monkeypatch):
    """OpenVINO's own DequantizeLinear is not (x - zero_point) * scale, and it rounds Exp otherwise than ORT: REWRITTEN
    (DequantizeLinear lowered) matched neither ORIGINAL on OpenVINO nor ORT, and failed, as all-MiniLM-L6-v2's q8
    lowered for openvino did (the embeddings' DequantizeLinear). Held to ORIGINAL with its DequantizeLinear lowered,
    it is bit-identical."""
    installed("openvino")
    original = _dequantize()
    original.graph.node.append(helper.make_node("Exp", ["y"], ["e"]))
    original.graph.output[0].name = "e"
    lowered = dql_pass.lower(original, target="openvino")[0]
    report = dql_pass.verify(original, lowered, runtime="openvino")
    assert report.verdict == "PASS" and not report.from_ort[0].identical, report.format()
    assert any("and its DequantizeLinear lowered as in REWRITTEN (openvino computes DequantizeLinear otherwise" in note
               for note in report.notes), report.notes
    monkeypatch.setattr(OpenVino, "computed_otherwise", ())
    assert dql_pass.verify(original, lowered, runtime="openvino").verdict == "FAIL"


def test_a_rewrite_that_keeps_the_ops_the_runtime_computes_otherwise_is_held_to_them():
    """expand leaves DequantizeLinear to the runtime: ORIGINAL on OpenVINO keeps OpenVINO's own too (lowered there, it
    made the exact expansion FAIL)."""
    installed("openvino")
    original = _dequantize()
    original.graph.node.extend([helper.make_node("Exp", ["y"], ["e"]),
                                helper.make_node("DynamicQuantizeLinear", ["y"], ["q", "q_scale", "q_zero_point"])])
    del original.graph.output[:]
    original.graph.output.extend([helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, 8]),
                                  helper.make_tensor_value_info("q", TensorProto.UINT8, [4, 8]),
                                  helper.make_tensor_value_info("q_scale", TensorProto.FLOAT, []),
                                  helper.make_tensor_value_info("q_zero_point", TensorProto.UINT8, [])])
    expanded = dql_pass.expand(original, target="openvino")[0]
    assert any(node.op_type == "DequantizeLinear" for node in expanded.graph.node)
    report = dql_pass.verify(original, expanded, runtime="openvino")
    assert report.verdict == "PASS", report.format()
    assert not any("lowered as in REWRITTEN" in note for note in report.notes), report.notes


def test_the_note_names_only_the_ops_the_reference_lowered():
    """A QuantizeLinear that REWRITTEN lowered (with no target) but lower leaves alone on OpenVINO (portable does
    not divide as QuantizeLinear must) stays OpenVINO's own in ORIGINAL there, and the note says so by not naming
    it; the DequantizeLinear is lowered and named."""
    installed("openvino")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]), helper.make_node("Exp", ["d"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])],
        [numpy_helper.from_array(np.array(0.0123, np.float32), "s"),
         numpy_helper.from_array(np.array(128, np.uint8), "z")])
    original = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    lowered = dql_pass.lower(original)[0]
    assert not {"QuantizeLinear", "DequantizeLinear"} & {node.op_type for node in lowered.graph.node}
    (note,) = [n for n in dql_pass.verify(original, lowered, runtime="openvino").notes if "graph outputs" in n]
    assert "its DequantizeLinear lowered as in REWRITTEN" in note and "QuantizeLinear lowered" not in note, note


def test_a_rewrite_that_matches_neither_original_on_the_runtime_nor_ort_fails():
    installed("openvino")
    wrong = dql_pass.lower(_dequantize(scale=0.0124), target="openvino")[0]  # another scale: other values
    report = dql_pass.verify(_dequantize(), wrong, runtime="openvino")
    assert report.verdict == "FAIL" and not report.outputs[0].identical, report.format()
    assert not any("bit-identical to ORT" in note for note in report.notes)


# --- a known difference excuses the outputs it names, and only those --------------------------------------------------

_INFINITE = next(d for d in runtimes.get("mnn").known_differences if d.inputs == "infinite")


class _Corrupting(runtimes.Runtime):
    """ORT, with MNN's infinite-class difference stated, and one output made wrong on inputs with an
    infinity: y 255 at +inf (what the difference says MNN does) or y_scale 1 ulp nearer 0 (what it does not say)."""

    name = "corrupting"
    module = "onnxruntime"
    distribution = "onnxruntime"
    variant = "arithmetic"
    known_differences = (_INFINITE,)

    def __init__(self, output: str):
        self.output = output

    def _load(self, model, *, threads: int, optimize: str) -> runtimes.Session:
        session = runtimes.get("onnxruntime").load(model, threads=threads, optimize=optimize)
        wrong = self.output

        class Corrupted(runtimes.Session):
            def run(self, feeds, outputs=None):
                results = session.run(feeds, outputs)
                names = list(outputs or session.output_names)
                x = next(iter(feeds.values()))
                if wrong in names and np.isinf(x).any():
                    k = names.index(wrong)
                    if wrong == "y":
                        results[k] = np.where(x == np.inf, np.uint8(255), results[k])
                    else:
                        results[k] = np.nextafter(results[k], np.float32(0))
                return results

        return Corrupted(session.input_names, session.output_names)


def _verify_on(monkeypatch, output: str):
    monkeypatch.setitem(runtimes.RUNTIMES, "corrupting", _Corrupting(output))
    original = helpers.dql_model(21)
    return dql_pass.verify(original, dql_pass.expand(original, variant="arithmetic", runtime=None)[0],
                           runtime="corrupting")


def test_mnns_infinite_difference_does_not_name_y_scale():
    assert "y" in _INFINITE.outputs and "y_scale" not in _INFINITE.outputs


def test_a_wrong_y_scale_on_infinite_inputs_fails_though_the_runtime_states_a_difference_in_y_there(monkeypatch):
    report = _verify_on(monkeypatch, "y_scale")
    assert report.verdict == "FAIL", report.format()
    assert report.sites[0].mismatches > 0 and report.sites[0].classes.get("infinite", 0) > 0
    assert not report.sites[0].known


def test_a_difference_in_y_on_infinite_inputs_is_the_stated_one_and_passes(monkeypatch):
    report = _verify_on(monkeypatch, "y")
    assert report.verdict == "PASS", report.format()
    assert report.sites[0].known == {_INFINITE.reason: report.sites[0].known[_INFINITE.reason]}
    assert report.sites[0].known[_INFINITE.reason] > 0


def test_a_difference_is_known_only_where_the_stated_ones_name_every_output_that_differs():
    mnn = runtimes.get("mnn")
    x = np.array([1.0, np.inf], np.float32)
    assert mnn.differences(x, "arithmetic", "onnxruntime", ["y"]) == [_INFINITE.reason]
    assert mnn.differences(x, "arithmetic", "onnxruntime", ["y", "y_scale"]) == []
    assert mnn.differences(x, "arithmetic", "onnxruntime", ["y_scale"]) == []


@pytest.mark.parametrize("target, form, verdict",
                         [("portable", "arithmetic", "PASS"), ("arithmetic", "portable", "FAIL")])
def test_the_differences_excused_are_those_the_runtime_states_for_the_form_rewritten_has(
        monkeypatch, target, form, verdict):
    """verify looked up the runtime's target variant's differences whatever the site's form: an arithmetic site on a
    runtime whose target is portable lost arithmetic's stated difference (a false FAIL), a portable one on a runtime
    whose target is arithmetic had it (a false PASS)."""
    corrupting = _Corrupting("y")
    corrupting.variant = target
    monkeypatch.setitem(runtimes.RUNTIMES, "corrupting", corrupting)
    original = helpers.dql_model(21)
    report = dql_pass.verify(original, dql_pass.expand(original, variant=form, runtime=None)[0], runtime="corrupting")
    assert report.verdict == verdict, report.format()
    assert report.sites[0].classes.get("infinite", 0) + sum(report.sites[0].known.values()) > 0


def test_a_lowering_for_another_target_has_that_forms_differences_on_the_runtime():
    """lean (webgpu's) on tract: tract's Gemm reads lean's subnormal scale as 0, a difference tract states for lean;
    verify held it to float64's (tract's target) and failed."""
    installed("tract")
    lowered = dql_pass.lower(helpers.dql_model(21), target="webgpu")[0]
    report = dql_pass.verify(helpers.dql_model(21), lowered, runtime="tract")
    assert report.verdict == "PASS", report.format()
    assert any("subnormal operand as 0" in reason for reason in report.sites[0].known), report.sites[0].known


def test_a_form_that_does_not_run_on_the_runtime_excuses_no_output_it_gave():
    """A site's form is read off its ops now, so verify may ask for one the runtime cannot run: its reason (why the
    form does not load) was the first 'known difference' of any output."""
    webgpu, x = runtimes.get("webgpu"), np.array([1.0, 2.0], np.float32)
    assert webgpu.differences(x, "float64", "onnxruntime") == [webgpu.unloadable["float64"]]
    assert webgpu.differences(x, "float64", "onnxruntime", ["y"]) == []


@pytest.mark.parametrize("outputs", [(), ("y", "scale")])
def test_a_known_difference_names_outputs_of_the_op(outputs):
    with pytest.raises(ValueError, match="names outputs of"):
        runtimes.KnownDifference(("native",), "infinite", "a reason", outputs=outputs)


class _Slow(runtimes.Runtime):
    """ORT that never answers in time."""

    name = "slow"
    module = "onnxruntime"
    distribution = "onnxruntime"
    variant = "arithmetic"

    def _load(self, model, *, threads: int, optimize: str) -> runtimes.Session:
        raise runtimes.RuntimeTimeout("a timeout: slow gave no answer within 60 s; "
                                      "--runtime-timeout SECONDS gives it longer")


def test_a_runtime_that_times_out_leaves_verify_incomplete_not_failed(monkeypatch):
    monkeypatch.setitem(runtimes.RUNTIMES, "slow", _Slow())
    original = helpers.dql_model(21)
    report = dql_pass.verify(original, dql_pass.expand(original, variant="arithmetic", runtime=None)[0], runtime="slow")
    assert report.verdict == "INCOMPLETE", report.format()
    assert report.sites[0].not_checked.startswith("slow did not load the site model in time: a timeout: ")
    assert report.model_not_checked.startswith("REWRITTEN did not finish on slow: a timeout: ")
    assert "cannot" not in report.format()


@pytest.mark.parametrize("outputs, excused", [(("y", "y_zero_point"), True), (("y",), False)])
def test_a_blocks_centred_value_is_excused_only_by_a_difference_naming_y_and_the_zero_point(outputs, excused):
    """A block's y - y_zero_point differs where y or the zero point does: a difference that names
    both excuses it, one that names y alone does not (the zero point might be what is wrong)."""
    class Stated(runtimes.Runtime):
        name, module, distribution, variant = "stated", "onnxruntime", "onnxruntime", "arithmetic"
        known_differences = (runtimes.KnownDifference(("arithmetic",), "infinite", "stated", outputs=outputs),)

    x = np.array([np.inf, 1.0], np.float32)
    assert bool(Stated().differences(x, "arithmetic", "onnxruntime", ("y_centred",))) == excused
    assert not Stated().differences(x, "arithmetic", "onnxruntime", ("y_centred", "y_scale"))
