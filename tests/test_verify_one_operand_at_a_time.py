"""verify's memory on large operands: the model-level input sets are drawn in each input's own type
and made when a run asks for them (one set held at a time, the same values each time), and a lowered
op's operand cases are made one at a time, each checked before the next is made.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
from onnx import TensorProto, helper

import dql_pass
from dql_pass.verification import lowered, synthesis
from dql_pass.verification.synthesis import input_sets
from dql_pass.verification.lowered import check_lowered

ORT = dql_pass.runtimes.get("onnxruntime")


def _product(k: int = 40, n: int = 3) -> ir.Model:
    """MatMulInteger of two graph inputs, a uint8 [4, k] and b int8 [k, n]."""
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, k]),
         helper.make_tensor_value_info("b", TensorProto.INT8, [k, n])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [4, n])])
    return ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def test_integer_inputs_are_drawn_in_their_own_type():
    sets = input_sets(_product(), 1, 0, {}, {})
    rng = np.random.default_rng(0)
    expected_a = rng.integers(0, 16, (4, 40), dtype=np.uint8)  # not drawn in int64, then cast
    expected_b = rng.integers(0, 16, (40, 3), dtype=np.int8)
    feeds = sets["sample 0"]
    assert feeds["a"].dtype == np.uint8 and np.array_equal(feeds["a"], expected_a)
    assert feeds["b"].dtype == np.int8 and np.array_equal(feeds["b"], expected_b)


def test_input_sets_are_made_when_asked_for_with_the_same_values_each_time(monkeypatch):
    made = []
    synthesize = synthesis._synthesize
    monkeypatch.setattr(synthesis, "_synthesize",
                        lambda value, *args: made.append(value.name) or synthesize(value, *args))
    sets = input_sets(_product(), 3, 0, {}, {})
    assert made == [] and list(sets) == ["sample 0", "sample 1", "sample 2"]
    last = sets["sample 2"]  # the sets before it are drawn to reach its generator state, then dropped
    assert np.array_equal(sets["sample 2"]["b"], last["b"]) and np.array_equal(sets["sample 2"]["a"], last["a"])
    assert not np.array_equal(sets["sample 1"]["b"], last["b"])
    assert "sample 3" not in sets and sets.get("sample 3") is None


def test_lowered_operand_cases_are_made_one_at_a_time(monkeypatch):
    original = _product()
    rewritten, _ = dql_pass.lower(original.clone())
    rule = lowered.RULES["MatMulInteger"]
    events = []

    def cases(site, rng):
        for case in rule.cases(site, rng):
            events.append("made")
            yield case

    def reference(*arrays, **keywords):
        events.append("checked")
        return rule.reference(*arrays, **keywords)

    monkeypatch.setitem(lowered.RULES, "MatMulInteger", dataclasses.replace(rule, cases=cases, reference=reference))
    (row,) = check_lowered(original, rewritten, 0, ORT)
    assert row.passed and row.cases > 2, row
    assert events == ["made", "checked"] * row.cases, events


def test_lowered_operands_made_in_another_shape_than_the_static_one_leave_the_op_unchecked(monkeypatch):
    """The replacement declares the site's static shapes: operands of another shape are not checked on it."""
    original = _product()
    rewritten, _ = dql_pass.lower(original.clone())
    rule = lowered.RULES["MatMulInteger"]

    def cases(site, rng):
        for name, category, arrays in rule.cases(site, rng):
            yield name, category, [np.concatenate([arrays[0], arrays[0]]), *arrays[1:]]  # A of 8 rows, not 4

    monkeypatch.setitem(lowered.RULES, "MatMulInteger", dataclasses.replace(rule, cases=cases))
    (row,) = check_lowered(original, rewritten, 0, ORT)
    assert not row.passed and row.cases == 0, row
    assert row.not_reachable == "its operands were made in shapes [(8, 40), (40, 3)], not in its static ones " \
                                "[(4, 40), (40, 3)]", row


def test_four_bit_integer_inputs_are_drawn_below_their_end():
    """NumPy draws no 4-bit type: an int4 or uint4 input is drawn in int8 or uint8, within its own range."""
    graph = helper.make_graph(
        [helper.make_node("Identity", [name], [f"{name}_out"]) for name in ("s", "u")], "g",
        [helper.make_tensor_value_info("s", TensorProto.INT4, [64]),
         helper.make_tensor_value_info("u", TensorProto.UINT4, [64])],
        [helper.make_tensor_value_info(f"{name}_out", t, [64]) for name, t in (("s", TensorProto.INT4),
                                                                             ("u", TensorProto.UINT4))])
    feeds = input_sets(ir.from_proto(helper.make_model(graph)), 1, 0, {}, {})["sample 0"]
    rng = np.random.default_rng(0)
    expected_s = rng.integers(0, 8, 64, dtype=np.int8)  # below int4's end, 7
    expected_u = rng.integers(0, 16, 64, dtype=np.uint8)  # below 16, the default
    assert feeds["s"].dtype == ir.DataType.INT4.numpy() and feeds["u"].dtype == ir.DataType.UINT4.numpy()
    assert np.array_equal(feeds["s"].astype(np.int8), expected_s)
    assert np.array_equal(feeds["u"].astype(np.uint8), expected_u)
