"""verify's operand cases for lowered sites: each class of wrong
rewrite is a class of operands built for every site of its kind, and a constant operand is
checked on its stored value.

- past 2^24: an unchunked product whose bound exceeds 2^24 FAILs, for every rank of A, B
  constant or a graph input, and ConvInteger; the chunked lowering PASSes;
- ties and reciprocals: QuantizeLinear lowerings that round half up or multiply by 1/scale (on
  every channel or all but one) FAIL at any size; DequantizeLinear siblings (folded zero point,
  one channel's scale) FAIL too;
- a DequantizeLinear of a stored weight (every QDQ model) is checked on that weight: a correct
  lowering PASSes, one whose weight is off by one FAILs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import reference, runtimes
from dql_pass.lowering import operands
from dql_pass.lowering.operands import _drive
from dql_pass.lowering.proof import LIMIT
from dql_pass.runtimes.ort import import_onnxruntime
from dql_pass.verification.lowered import check_lowered
from helpers import MODELS

F, I32, U8, S8 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.UINT8, TensorProto.INT8
ORT = runtimes.get("onnxruntime")
OPSET = [helper.make_opsetid("", 21)]


def _model(nodes, inputs, outputs, constants, opset=OPSET) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs],
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in constants.items()])
    return helper.make_model(graph, opset_imports=opset)


def _rows(original: onnx.ModelProto, rewritten: onnx.ModelProto) -> dict[str, object]:
    """The lowered sites' rows, checked on ORT."""
    return {row.name.split()[0]: row
            for row in check_lowered(ir.from_proto(original), ir.from_proto(rewritten), 0, ORT)}


# --- past 2^24 -------------------------------------------------------------------------------------------------

K = 1100
ALTERNATING = np.resize(np.array([127, -128], np.int8), K)  # 550 * 127 * 255 > 2^24


def _matmul(a_shape, b_input: bool = False, a_stored: bool = False) -> onnx.ModelProto:
    b = np.repeat(ALTERNATING[:, None], 3, axis=1)
    b[:, 1] = np.roll(ALTERNATING, 1)  # a column of the other signs
    a = np.random.default_rng(5).integers(200, 256, (2, K)).astype(np.uint8)
    inputs = ([] if a_stored else [("a", U8, a_shape)]) + [("a_zp", U8, [])] + ([("b", S8, [K, 3])] if b_input else [])
    constants = ({} if b_input else {"b": b}) | ({"a": a} if a_stored else {})
    return _model([helper.make_node("MatMulInteger", ["a", "b", "a_zp"], ["y"], name="mm")], inputs,
                  [("y", I32, None)], constants)


def _conv(x_shape) -> onnx.ModelProto:
    w = np.resize(ALTERNATING, (2, 275, 2, 2))  # 1100 terms per output channel
    w[1] = -w[1] - 1
    node = helper.make_node("ConvInteger", ["x", "w", "x_zp"], ["y"], name="conv", pads=[1, 0, 0, 1])
    return _model([node], [("x", U8, x_shape), ("x_zp", U8, [])], [("y", I32, None)], {"w": w})


def _unchunked(model: onnx.ModelProto) -> onnx.ModelProto:
    """The site as one float32 product, as a lowering without the proof writes it."""
    node = model.graph.node[0]
    a, w, a_zp = node.input
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    nodes = [helper.make_node("Cast", [a], ["af"], to=F), helper.make_node("Cast", [a_zp], ["zf"], to=F),
             helper.make_node("Sub", ["af", "zf"], ["as"])]
    if w in constants:
        constants["wf"] = constants.pop(w).astype(np.float32)
    else:
        nodes.append(helper.make_node("Cast", [w], ["wf"], to=F))
    op = "MatMul" if node.op_type == "MatMulInteger" else "Conv"
    nodes += [helper.make_node(op, ["as", "wf"], ["yf"],
                               **{a.name: helper.get_attribute_value(a) for a in node.attribute}),
              helper.make_node("Cast", ["yf"], [node.output[0]], to=I32)]
    inputs = [(i.name, i.type.tensor_type.elem_type, None) for i in model.graph.input]
    return _model(nodes, inputs, [(node.output[0], I32, None)], constants)


SITES = {
    "2-D A": lambda: _matmul([4, K]),
    "1-D A": lambda: _matmul([K]),
    "3-D A": lambda: _matmul([2, 3, K]),
    "A of unknown shape": lambda: _matmul(None),
    "one row": lambda: _matmul([1, 1, K]),
    "B a graph input": lambda: _matmul(["n", K], b_input=True),
    "A stored, B a graph input": lambda: _matmul(None, b_input=True, a_stored=True),
    "ConvInteger": lambda: _conv([1, 275, 3, 3]),
    "ConvInteger of unknown shape": lambda: _conv(None),
}


@pytest.mark.parametrize("site", SITES)
def test_an_unchunked_product_past_the_bound_fails_and_the_chunked_one_passes(site):
    original = SITES[site]()
    lowered, report = dql_pass.lower(original)
    assert "chunked" in report.lowered[0].proof, report.format()
    (row,) = _rows(original, lowered).values()
    assert row.passed and row.cases, (row.detail, row.not_reachable)
    (row,) = _rows(original, _unchunked(original)).values()
    assert row.not_reachable is None and row.classes.get("past 2^24"), (row.classes, row.detail)
    assert dql_pass.verify(original, _unchunked(original), samples=1).verdict == "FAIL"


def test_an_odd_sum_past_2_24_is_reached():
    """K = 1100 of +127/-128 against uint8 at zero point 0: the largest sum 17,811,750 is even; one
    term of 127 one step lower makes it odd, and no float32 holds it."""
    v = _drive(ALTERNATING.astype(np.int64), np.int64(0), np.int64(255), 1, past=True)
    total = int((ALTERNATING.astype(np.int64) * v).sum())
    assert total == 550 * 127 * 255 - 127 and total % 2 and total > LIMIT
    assert int(np.float32(total)) != total
    assert ((v >= 0) & (v <= 255)).all()
    v = _drive(ALTERNATING.astype(np.int64), np.int64(-128), np.int64(127), -1, past=True)  # int8, the other end
    total = int((ALTERNATING.astype(np.int64) * v).sum())
    assert -total > LIMIT and int(np.float32(total)) != total


# --- ties and reciprocals at any size ------------------------------------------------------------------------


def _wrong(original: onnx.ModelProto, wrong: str) -> onnx.ModelProto:
    """The site as a wrong lowering writes it. QuantizeLinear: rounding half up, or multiplying by
    1/scale. DequantizeLinear: the zero point folded into x * s - zp * s, or channel 0's scale on
    every channel. Either: "exact", the right arithmetic; "rank 1", that with parameters of shape [1]."""
    node, x = original.graph.node[0], original.graph.input[0]
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
    axis = helper.get_attribute_value(node.attribute[0])
    arrays = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    scale, zp = (reference.per_axis(arrays[n], len(shape), axis) for n in ("s", "zp"))
    integer = helper.np_dtype_to_tensor_dtype(zp.dtype)
    constants = {"sf": scale, "zpf": zp.astype(np.float32)}
    if wrong == "half up":
        constants["half"] = np.float32(0.5)
        nodes = [helper.make_node("Div", ["x", "sf"], ["d"]), helper.make_node("Add", ["d", "half"], ["h"]),
                 helper.make_node("Floor", ["h"], ["r"])]
    elif wrong in ("exact", "rank 1") and node.op_type == "QuantizeLinear":
        nodes = [helper.make_node("Div", ["x", "sf"], ["d"]), helper.make_node("Round", ["d"], ["r"])]
    elif wrong == "reciprocal":
        constants["sf"] = np.float32(1) / scale
        nodes = [helper.make_node("Mul", ["x", "sf"], ["d"]), helper.make_node("Round", ["d"], ["r"])]
    elif wrong == "folded":
        constants["zpf"] = zp.astype(np.float32) * scale
        nodes = [helper.make_node("Cast", ["x"], ["xf"], to=F), helper.make_node("Mul", ["xf", "sf"], ["m"]),
                 helper.make_node("Sub", ["m", "zpf"], ["y"])]
    else:
        if wrong == "channel 0":
            constants["sf"] = scale.reshape(-1)[0]
        nodes = [helper.make_node("Cast", ["x"], ["xf"], to=F), helper.make_node("Sub", ["xf", "zpf"], ["m"]),
                 helper.make_node("Mul", ["m", "sf"], ["y"])]
    if wrong == "rank 1":  # a rank-0 x gives a rank-1 y
        constants.update(sf=scale.reshape(1), zpf=constants["zpf"].reshape(1))
    if node.op_type == "QuantizeLinear":
        info = np.iinfo(zp.dtype)
        constants.update(lo=np.float32(info.min), hi=np.float32(info.max))
        nodes += [helper.make_node("Add", ["r", "zpf"], ["q"]), helper.make_node("Clip", ["q", "lo", "hi"], ["c"]),
                  helper.make_node("Cast", ["c"], ["y"], to=integer)]
    y_type = F if node.op_type == "DequantizeLinear" else integer
    return _model(nodes, [("x", x.type.tensor_type.elem_type, None)], [("y", y_type, None)], constants)


U8_ZP, S8_ZP = np.array(128, np.uint8), np.array(-3, np.int8)
BOTH, DEQUANTIZE = ["half up", "reciprocal"], ["folded", "channel 0"]
CLASSES = {"half up": "ties", "reciprocal": "reciprocal", "folded": "every value", "channel 0": "every value"}
ROUNDING = {  # (op, shape, scale, zero point, axis, wrong lowerings)
    "Q 48, uint8": ("QuantizeLinear", [48], 0.1, U8_ZP, 0, BOTH),
    "Q 48, int8": ("QuantizeLinear", [6, 8], 0.37, S8_ZP, 1, BOTH),
    "Q 1": ("QuantizeLinear", [1], 0.1, U8_ZP, 0, BOTH),
    "Q scalar": ("QuantizeLinear", [], 0.3, S8_ZP, 0, BOTH),
    "Q 2": ("QuantizeLinear", [2], 0.7, S8_ZP, 0, BOTH),
    # Per axis: channel 0's reciprocal is exact (a power of two), the others' are not.
    "Q 48 per axis": ("QuantizeLinear", [4, 3, 4], [0.5, 0.1, 0.3], np.array([128, 7, 250], np.uint8), 1, BOTH),
    "Q 3 per axis": ("QuantizeLinear", [1, 3], [0.25, 0.1, 0.7], np.array([0, -5, 100], np.int8), 1, BOTH),
    "Q 2 per axis, last axis": ("QuantizeLinear", [2], [1.0, 0.3], np.array([3, 9], np.uint8), -1, ["reciprocal"]),
    "DQ 48": ("DequantizeLinear", [48], 0.1, U8_ZP, 0, ["folded"]),
    "DQ 1": ("DequantizeLinear", [1], 0.37, S8_ZP, 0, ["folded"]),
    "DQ scalar": ("DequantizeLinear", [], 0.37, S8_ZP, 0, ["folded"]),
    "DQ 2 per axis": ("DequantizeLinear", [2], [0.1, 0.3], np.array([3, 200], np.uint8), 0, DEQUANTIZE),
    "DQ 48 per axis": ("DequantizeLinear", [4, 3, 4], [0.5, 0.1, 0.3], np.array([128, 7, 250], np.uint8), 1,
                       DEQUANTIZE),
}


@pytest.mark.parametrize("case", ROUNDING)
def test_lowerings_that_round_or_scale_otherwise_fail_at_any_size(case):
    op, shape, scale, zp, axis, wrongs = ROUNDING[case]
    x_type = F if op == "QuantizeLinear" else helper.np_dtype_to_tensor_dtype(zp.dtype)
    y_type = F if op == "DequantizeLinear" else helper.np_dtype_to_tensor_dtype(zp.dtype)
    original = _model([helper.make_node(op, ["x", "s", "zp"], ["y"], name="q", axis=axis)], [("x", x_type, shape)],
                      [("y", y_type, None)], {"s": np.asarray(scale, np.float32), "zp": zp})
    lowered, report = dql_pass.lower(original)
    assert report.lowered, report.format()
    # lower makes a rank-0 site rank 1: there, the exact arithmetic by hand.
    (row,) = _rows(original, lowered if shape else _wrong(original, "exact")).values()
    assert row.passed, (row.detail, row.not_reachable)
    for wrong in wrongs:
        (row,) = _rows(original, _wrong(original, wrong)).values()
        assert row.classes.get(CLASSES[wrong]) and "output differs" in row.detail, (wrong, row.classes, row.detail)
    if not shape:
        (row,) = _rows(original, _wrong(original, "rank 1")).values()
        assert row.mismatches == row.cases and "output has shape [1], expected []" in row.detail, row.detail


# --- a constant operand is checked on its stored value ----------------------------------------------------


def _qdq_model(tmp_path) -> onnx.ModelProto:
    """A static (QDQ) quantization of a Conv and a MatMul, per-channel int8 weights: every weight
    reaches its op through a DequantizeLinear of a stored constant."""
    import_onnxruntime()  # its telemetry off, before the quantization tool imports it
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Reshape", ["r", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "m"], ["y"])]
    constants = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
                 "m": rng.standard_normal((64, 5)).astype(np.float32), "shape": np.array([1, -1], np.int64)}
    onnx.save(_model(nodes, [("x", F, [1, 3, 8, 8])], [("y", F, None)], constants, [helper.make_opsetid("", 17)]),
              tmp_path / "float.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    quantize_static(tmp_path / "float.onnx", tmp_path / "qdq.onnx", Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, weight_type=QuantType.QInt8)
    return onnx.load(tmp_path / "qdq.onnx")


def _off_by_one(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``model`` with the first element of its initializer ``name`` one more (an integer) or 1.0 more."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    tensor = next(t for t in model.graph.initializer if t.name == name)
    array = numpy_helper.to_array(tensor).copy()
    at_max = array.dtype.kind in "iu" and array.flat[0] == np.iinfo(array.dtype).max
    array.flat[0] = array.flat[0] - 1 if at_max else array.flat[0] + 1
    tensor.CopyFrom(numpy_helper.from_array(array, name))
    return model


def test_a_qdq_models_weights_are_checked_as_stored(tmp_path):
    original = _qdq_model(tmp_path)
    weights = {n.name: n.input[0] for n in original.graph.node if n.op_type == "DequantizeLinear"
               and n.input[0] in {t.name for t in original.graph.initializer}}
    assert len(weights) == 2
    lowered, _ = dql_pass.lower(original)
    report = dql_pass.verify(original, lowered, samples=1)
    assert report.verdict == "PASS", report.format()
    rows = {row.name: row for row in report.sites}
    for node, weight in weights.items():
        assert rows[f"DequantizeLinear {node!r}"].cases == 1  # the stored weight, not synthetic ones
        report = dql_pass.verify(original, _off_by_one(lowered, weight), samples=1)
        assert report.verdict == "FAIL"
        row = next(row for row in report.sites if row.name == f"DequantizeLinear {node!r}")
        assert row.classes == {"constant": 1}, report.format()


def _constant_operand(op: str) -> tuple[onnx.ModelProto, str]:
    """One integer op whose first operand is a stored constant, the others graph inputs or constants."""
    rng = np.random.default_rng(3)
    if op == "MatMulInteger":
        a = rng.integers(0, 256, (3, 7)).astype(np.uint8)
        node = helper.make_node(op, ["a", "b", "a_zp", "b_zp"], ["y"], name="site")
        return _model([node], [("b", S8, [7, 2]), ("b_zp", S8, [])], [("y", I32, None)],
                      {"a": a, "a_zp": np.array(9, np.uint8)}), "a"
    if op == "ConvInteger":
        x = rng.integers(0, 256, (1, 2, 4, 4)).astype(np.uint8)
        node = helper.make_node(op, ["x", "w"], ["y"], name="site")
        return _model([node], [("w", U8, [3, 2, 2, 2])], [("y", I32, None)], {"x": x}), "x"
    if op == "QuantizeLinear":
        node = helper.make_node(op, ["x", "s", "zp"], ["y"], name="site", axis=0)
        constants = {"x": (rng.standard_normal((2, 5)) * 3).astype(np.float32), "s": np.array([0.1, 0.3], np.float32),
                     "zp": np.array([1, -4], np.int8)}
        return _model([node, helper.make_node("Identity", ["y"], ["out"])], [], [("out", S8, None)], constants), "x"
    node = helper.make_node(op, ["x", "s", "zp"], ["y"], name="site", axis=1)
    constants = {"x": rng.integers(-128, 128, (4, 3)).astype(np.int8), "s": np.array([0.1, 0.3, 0.7], np.float32),
                 "zp": np.array([1, -4, 0], np.int8)}
    return _model([node, helper.make_node("Identity", ["y"], ["out"])], [], [("out", F, None)], constants), "x"


@pytest.mark.parametrize("op", ["MatMulInteger", "ConvInteger", "QuantizeLinear", "DequantizeLinear"])
def test_a_constant_operand_of_any_lowered_op_is_checked_as_stored(op):
    original, name = _constant_operand(op)
    lowered, report = dql_pass.lower(original)
    assert report.lowered, report.format()
    (row,) = _rows(original, lowered).values()
    assert row.passed and row.cases, (row.classes, row.detail, row.not_reachable)
    (row,) = _rows(original, _off_by_one(lowered, name)).values()
    assert row.classes.get("constant"), (row.classes, row.detail)


def test_a_lowering_of_a_type_no_operands_are_made_for_is_not_checked_and_says_so():
    """An int4 DequantizeLinear lowered by another tool: no crash, and not a PASS."""
    node = helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"], name="q")
    original = _model([node], [("x", TensorProto.INT4, [8])], [("y", F, None)],
                      {"s": np.float32(0.5)})
    original.graph.initializer.append(helper.make_tensor("zp", TensorProto.INT4, [], [1]))
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=F), helper.make_node("Sub", ["xf", "one"], ["d"]),
             helper.make_node("Mul", ["d", "s"], ["y"])]
    lowered = _model(nodes, [("x", TensorProto.INT4, [8])], [("y", F, None)],
                     {"s": np.float32(0.5), "one": np.float32(1)})
    (row,) = _rows(original, lowered).values()
    assert not row.passed and "int4" in row.not_reachable, row


def test_the_reference_sums_exactly_in_float64_as_in_int64():
    """The reference sums in float64 where every partial sum is at most 2^53: the same as int64."""
    rng = np.random.default_rng(8)
    a = rng.choice(np.array([0, 255], np.uint8), (3, K))
    b = rng.choice(np.array([-128, 127], np.int8), (K, 4))
    exact = (a.astype(np.int64) - 1) @ (b.astype(np.int64) + 3)
    assert np.array_equal(reference.matmul_integer(a, b, np.uint8(1), np.int8(-3)), exact.astype(np.int32))
    x, w = a.reshape(3, 275, 2, 2), b.T.reshape(4, 275, 2, 2)
    windows = (x.astype(np.int64) - 1).reshape(3, -1) @ (w.astype(np.int64) + 3).reshape(4, -1).T
    assert np.array_equal(reference.conv_integer(x, w, np.uint8(1), np.int8(-3)).reshape(3, 4),
                          windows.astype(np.int32))


def _per_row(chunks) -> onnx.ModelProto:
    """MatMulInteger with a zero point per row of A lowered by hand: (a - a_zp[:, None]) @ b in float32,
    in ``chunks`` of the reduction added in int32."""
    nodes = [helper.make_node("Cast", ["a"], ["af"], to=F), helper.make_node("Sub", ["af", "zf"], ["as"])]
    b = np.repeat(ALTERNATING[:, None], 2, axis=1).astype(np.float32)
    constants = {"zf": np.array([[0], [255], [7]], np.float32)}
    parts = []
    for k, (start, stop) in enumerate(chunks):
        constants.update({f"s{k}": np.array([start]), f"e{k}": np.array([stop]), f"x{k}": np.array([-1]),
                          f"b{k}": b[start:stop]})
        nodes += [helper.make_node("Slice", ["as", f"s{k}", f"e{k}", f"x{k}"], [f"a{k}"]),
                  helper.make_node("MatMul", [f"a{k}", f"b{k}"], [f"p{k}"]),
                  helper.make_node("Cast", [f"p{k}"], [f"i{k}"], to=I32)]
        parts.append(f"i{k}")
    for k in range(1, len(parts)):
        nodes.append(helper.make_node("Add", [parts[k - 1], parts[k]], ["y" if k == len(parts) - 1 else f"t{k}"]))
        parts[k] = f"t{k}"
    if len(parts) == 1:
        nodes[-1].output[0] = "y"
    return _model(nodes, [("a", U8, None)], [("y", I32, None)], constants)


def test_a_zero_point_per_row_of_an_a_of_unknown_shape_is_driven_row_by_row():
    """MatMulInteger with a_zp per row (which lower leaves alone), lowered by hand."""
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zp"], ["y"], name="mm")
    b = np.repeat(ALTERNATING[:, None], 2, axis=1)
    original = _model([node], [("a", U8, None)], [("y", I32, None)], {"b": b, "a_zp": np.array([0, 255, 7], np.uint8)})
    (row,) = _rows(original, _per_row([(0, 367), (367, 734), (734, K)])).values()
    assert row.passed and row.classes == {}, (row.detail, row.not_reachable)
    (row,) = _rows(original, _per_row([(0, K)])).values()
    assert row.classes.get("past 2^24") and "output differs" in row.detail, (row.classes, row.detail)


def test_a_one_dimensional_b_is_driven_as_one_column():
    """MatMulInteger with B [K] (a hand lowering), unchunked past 2^24."""
    node = helper.make_node("MatMulInteger", ["a", "b", "a_zp"], ["y"], name="mm")
    original = _model([node], [("a", U8, None), ("a_zp", U8, [])], [("y", I32, None)], {"b": ALTERNATING})
    (row,) = _rows(original, _unchunked(original)).values()
    assert row.classes.get("past 2^24") and "output differs" in row.detail, (row.classes, row.detail, row.not_reachable)


@pytest.mark.parametrize("off", [False, True])
def test_a_dequantized_weight_folded_into_a_float_constant_is_checked_and_the_models_are_left_as_they_were(off):
    """What constant folding does to a QDQ weight: REWRITTEN stores DequantizeLinear's result. It is
    checked on the stored weight; checking it renamed REWRITTEN's tensor, so REWRITTEN could not run."""
    x = np.random.default_rng(0).integers(-128, 128, (4, 3)).astype(np.int8)
    s, zp = np.array([0.1, 0.3, 0.7], np.float32), np.array([1, -4, 0], np.int8)
    add = helper.make_node("Add", ["a", "w"], ["y"])
    original = _model([helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["w"], name="site", axis=1), add],
                      [("a", F, [4, 3])], [("y", F, None)], {"x": x, "s": s, "zp": zp})
    folded = reference.dequantize_linear(x, s, zp, axis=1)
    if off:
        folded.flat[0] = np.nextafter(folded.flat[0], np.float32(np.inf))
    rewritten = _model([add], [("a", F, [4, 3])], [("y", F, None)], {"w": folded})
    before = rewritten.SerializeToString()
    report = dql_pass.verify(original, rewritten, samples=1)
    assert rewritten.SerializeToString() == before
    assert report.verdict == ("FAIL" if off else "PASS"), report.format()
    (row,) = report.sites
    assert row.cases == 1 and row.mismatches == off and row.not_reachable is None, report.format()


# --- empty operands ---------------------------------------------------------------------------------------------------

def _empty_product(op: str, a_shape: list[int], b_shape: list[int]) -> onnx.ModelProto:
    return _model([helper.make_node(op, ["a", "b"], ["y"], name="product")], [("a", U8, a_shape)],
                  [("y", I32, [None] * len(a_shape))], {"b": np.ones(b_shape, np.int8)})


@pytest.mark.parametrize("weights", ["float", "integer"])
def test_a_lowered_product_over_an_empty_k_is_checked_and_passes(weights):
    original = _empty_product("MatMulInteger", [3, 0], [0, 4])
    report = dql_pass.verify(original, dql_pass.lower(original, weights=weights)[0])
    assert report.verdict == "PASS" and report.sites[0].cases > 0, report.summary


@pytest.mark.parametrize("op, a_shape, b_shape", [
    ("MatMulInteger", [0, 5], [5, 4]),  # M = 0
    ("MatMulInteger", [3, 5], [5, 0]),  # N = 0
    ("ConvInteger", [0, 3, 5, 5], [4, 3, 3, 3]),  # an empty batch
    ("ConvInteger", [2, 3, 5, 5], [0, 3, 3, 3]),  # no output channel
    ("ConvInteger", [2, 0, 5, 5], [4, 0, 3, 3]),  # no input channel
])
def test_a_lowered_product_with_an_empty_operand_is_checked_without_a_mismatch(op, a_shape, b_shape):
    original = _empty_product(op, a_shape, b_shape)
    report = dql_pass.verify(original, dql_pass.lower(original)[0])
    # PASS, or INCOMPLETE where every graph output is empty (nothing to compare at model level).
    assert report.verdict in ("PASS", "INCOMPLETE") and not any(s.mismatches for s in report.sites), report.summary


# --- operands as large as memory allows: made and widened a block at a time ------------------------------------------


def test_the_driven_columns_and_their_sums_taken_a_block_at_a_time_are_those_of_a_plain_int64_computation(monkeypatch):
    monkeypatch.setattr(operands, "BLOCK_ELEMENTS", 7)  # blocks of a row or two of 5 columns: many blocks, one ragged
    rng = np.random.default_rng(1)
    weights = np.repeat(rng.integers(-128, 128, (37, 5)).astype(np.int8), [1, 3, 1, 2, 1], axis=1)  # equal columns
    for zero_point in (None, np.int8(-128), rng.integers(-128, 128, weights.shape[1]).astype(np.int8)):
        plain = weights.astype(np.int64) - np.asarray(0 if zero_point is None else zero_point, np.int64)
        centred = operands._centred(weights, zero_point)
        assert centred.dtype == np.int16 and np.array_equal(centred, plain)
        first = {column.tobytes(): c for c, column in reversed(list(enumerate(plain.T.copy())))}
        assert operands._distinct_columns(centred).tolist() == sorted(first.values())
        positive, negative = operands._signed_sums(centred)
        assert np.array_equal(positive, np.where(plain > 0, plain, 0).sum(axis=0))
        assert np.array_equal(negative, np.where(plain < 0, plain, 0).sum(axis=0))
    assert operands._distinct_columns(np.zeros((0, 3), np.int16)).tolist() == [0]  # K empty: all columns equal


def test_random_operands_and_the_reference_taken_a_block_at_a_time_are_those_of_one_pass(monkeypatch):
    monkeypatch.setattr(operands, "BLOCK_ELEMENTS", 7)
    monkeypatch.setattr(reference, "BLOCK_ELEMENTS", 7)
    random = operands.integers(ir.DataType.INT8, (37, 5), np.random.default_rng(0))["random"]()
    assert random.dtype == np.int8
    assert np.array_equal(random, np.random.default_rng(0).integers(-128, 128, (37, 5)).astype(np.int8))
    rng = np.random.default_rng(2)
    a, a_zp = rng.integers(0, 256, (3, 37)).astype(np.uint8), np.uint8(200)
    for b, b_zp in ((rng.integers(-128, 128, (37, 5)).astype(np.int8), rng.integers(-128, 128, 5).astype(np.int8)),
                    (rng.integers(-128, 128, 37).astype(np.int8), np.int8(-128)),
                    (rng.integers(-128, 128, (2, 37, 5)).astype(np.int8), None)):
        plain = (a.astype(np.int64) - int(a_zp)) @ (
            b.astype(np.int64) - np.asarray(0 if b_zp is None else b_zp, np.int64))
        actual = reference.matmul_integer(a, b, np.asarray(a_zp), None if b_zp is None else np.asarray(b_zp))
        assert actual.dtype == np.int32 and np.array_equal(actual, plain)


def test_a_product_that_regroups_its_rows_in_pairs_fails(tmp_path):
    """Exact for an even number of rows only: the lowered product's own cases take an odd number (the
    model level fails it too, at batch 3, where REWRITTEN does not run)."""
    lowered = tmp_path / "lowered.onnx"
    dql_pass.lower_file(MODELS / "mlp_dynamic.onnx", lowered)
    model = onnx.load(lowered)
    product = next(n for n in model.graph.node if n.op_type == "MatMul")
    weights = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == product.input[1])
    model.graph.initializer.extend([numpy_helper.from_array(np.array([-1, 2, weights.shape[0]]), "pairs"),
                                    numpy_helper.from_array(np.array([-1, weights.shape[1]]), "rows")])
    at = list(model.graph.node).index(product)
    out = product.output[0]
    model.graph.node.insert(at, helper.make_node("Reshape", [product.input[0], "pairs"], ["paired"]))
    product.input[0], product.output[0] = "paired", "paired_out"
    model.graph.node.insert(at + 2, helper.make_node("Reshape", ["paired_out", "rows"], [out]))
    report = dql_pass.verify(MODELS / "mlp_dynamic.onnx", model)
    products = [s for s in report.sites if s.name.startswith("MatMulInteger")]
    assert report.verdict == "FAIL" and [s.mismatches > 0 for s in products] == [True, False, False], report.format()


@pytest.mark.parametrize("blocks", [True, False], ids=["blocks", "no blocks"])
def test_a_dead_copy_under_the_checked_names_does_not_stand_in_for_the_live_product(tmp_path, blocks):
    """The lowered product (and its Cast, without blocks) stays under its names, read by nothing; the
    live readers read a copy whose weight is off: the product is not reported checked and right (the
    model level's inputs need not reach that weight row)."""
    lowered = tmp_path / "lowered.onnx"
    dql_pass.lower_file(MODELS / "mlp_dynamic.onnx", lowered, target="webgpu", blocks=blocks, weights="float")
    model = onnx.load(lowered)
    nodes = list(model.graph.node)
    chain = [[n for n in nodes if n.op_type == "MatMul"][-1]]
    readers = [n for n in nodes if chain[0].output[0] in n.input]
    chain += [r for r in readers if r.op_type == "Cast" and len(readers) == 1]
    weight = next(t for t in model.graph.initializer if t.name == chain[0].input[1])
    changed = numpy_helper.to_array(weight).copy()
    changed[-1] += 40
    model.graph.initializer.append(numpy_helper.from_array(changed, "changed_weight"))
    copies = [onnx.NodeProto() for _ in chain]
    for copy, node in zip(copies, chain):
        copy.CopyFrom(node)
        copy.name, copy.output[0] = "", f"copy_{node.output[0]}"
    copies[0].input[1] = "changed_weight"
    for copy in copies[1:]:
        copy.input[0] = f"copy_{copy.input[0]}"
    end = chain[-1].output[0]
    for node in nodes:
        node.input[:] = [f"copy_{end}" if name == end else name for name in node.input]
    at = nodes.index(chain[-1]) + 1
    del model.graph.node[:]
    model.graph.node.extend(nodes[:at] + copies + nodes[at:])
    report = dql_pass.verify(MODELS / "mlp_dynamic.onnx", model)
    (row,) = [s for s in report.sites if s.name.startswith("MatMulInteger") and "MatMul3" in s.name]
    # Not checked where nothing live reads it, or checked through the live reader, which reads the copy.
    assert row.mismatches or "nothing REWRITTEN outputs depends on it" in (row.not_reachable or ""), report.format()
    assert report.verdict != "PASS"
