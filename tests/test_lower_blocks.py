"""lower's blocks: a DynamicQuantizeLinear whose y and zero point only lowered products read keeps
y - zero point in float32, the product's Cast pair goes, and verify checks what is left."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import dql_pass
from tests.helpers import assert_outputs_bits_equal, edit_graph, sample

BLOCKED = ["mlp_dynamic", "conv_dynamic"]
# A body ending in Casts to uint8 (portable, openvino's variant, blocks asked for) and one ending in
# Gathers from a uint8 table (lean, webgpu's): the op that makes y - y_zero_point, the uint8 Casts of
# a site unfused, and the nodes a site with one product saves.
FORMS = {"openvino": ("Sub", 2, 6), "webgpu": ("Gather", 0, 4)}


def _lowered(model: onnx.ModelProto, blocks: bool | None = None,
             target: str = "webgpu") -> tuple[onnx.ModelProto, dql_pass.LowerReport]:
    return dql_pass.lower(model, target=target, blocks=True if blocks is None and target == "openvino" else blocks)


def _casts(model: onnx.ModelProto, to: int) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "Cast" and n.attribute[0].i == to]


def _feeds(model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    feeds = []
    for kind in ("random", "zero", "negative", "wide"):
        feed = {}
        for value in model.graph.input:
            shape = [d.dim_value or 2 for d in value.type.tensor_type.shape.dim]
            feed[value.name] = {"random": rng.standard_normal(shape), "zero": np.zeros(shape),
                                "negative": -np.abs(rng.standard_normal(shape)),
                                "wide": rng.standard_normal(shape) * 1e4}[kind].astype(np.float32)
        feeds.append(feed)
    return feeds


@pytest.mark.parametrize("target", FORMS)
@pytest.mark.parametrize("name", BLOCKED)
def test_block_has_no_uint8_tensor_nor_cast_pairs_on_the_fused_path(name, target):
    op_type, uint8_casts, saved = FORMS[target]
    original = sample(name)
    sites = sum(n.op_type == "DynamicQuantizeLinear" for n in original.graph.node)
    blocked, report = _lowered(original, target=target)
    unfused, _ = _lowered(original, blocks=False, target=target)
    assert report.blocks == sites == 3
    assert not _casts(blocked, TensorProto.UINT8) and len(_casts(unfused, TensorProto.UINT8)) == uint8_casts * sites
    producers = {o: n for n in blocked.graph.node for o in n.output}
    # the product's Cast to int32 and back went (lean casts its slot indices to int32: not a product's)
    assert not [n for n in _casts(blocked, TensorProto.INT32) if producers[n.input[0]].op_type in ("MatMul", "Conv")]
    centred = [n for n in blocked.graph.node if n.output[0].endswith("_centred")]
    assert [n.op_type for n in centred] == [op_type] * sites
    for node in centred:  # the body's float values, or lean's float table shifted by the zero point: no Cast
        read = [producers[node.input[0]].op_type] if op_type == "Gather" else [producers[i].op_type for i in node.input]
        assert read == ["Sub"] if op_type == "Gather" else "Cast" not in read, read
    # Per site with one product: the Casts back to float32 of y and of the zero point, the Sub per
    # product, Cast to int32 and the Cast back to float32; portable's Casts to uint8 too, less its
    # one Sub; lean's uint8 table's Gather and its two Gathers, less the float32 table's Gather, a
    # Gather, a Sub and a Gather.
    assert len(unfused.graph.node) - len(blocked.graph.node) == saved * sites


def test_lean_blocks_share_one_float_table_and_leave_no_unread_constant():
    """The expansion's one uint8 clamp table, shared by every site, becomes one float32 table
    shared by every block, and the uint8 one, which nothing reads any more, goes."""
    blocked, report = _lowered(sample("mlp_dynamic"), target="webgpu")
    assert report.blocks == 3
    read = {name for node in blocked.graph.node for name in node.input}
    assert [t.name for t in blocked.graph.initializer if t.name not in read] == []
    tables = [t.name for t in blocked.graph.initializer if len(t.dims) == 1 and t.dims[0] > 1024]
    assert len(tables) == 1 and tables[0].startswith("dql_pass_float_table"), tables


@pytest.mark.parametrize("target", FORMS)
@pytest.mark.parametrize("name", BLOCKED)
def test_block_is_bit_identical_to_the_unfused_lowering_on_ort(name, target):
    original = sample(name)
    blocked, unfused = _lowered(original, target=target)[0], _lowered(original, blocks=False, target=target)[0]
    ort = dql_pass.runtimes.get("onnxruntime")
    first, second = ort.load(blocked, threads=1, optimize="basic"), ort.load(unfused, threads=1, optimize="basic")
    for feed in _feeds(original):
        assert_outputs_bits_equal(first.run(feed), second.run(feed))


@pytest.mark.parametrize("target", FORMS)
def test_verify_passes_a_block_and_says_what_it_checked(target):
    original = sample("mlp_dynamic")
    report = dql_pass.verify(original, _lowered(original, target=target)[0], samples=1)
    assert report.verdict == "PASS", report.format()
    blocks = {s.name: s.block for s in report.sites if s.block}
    assert len(blocks) == 6  # 3 DQL sites and their 3 products
    assert "y - y_zero_point" in blocks["input_QuantizeLinear"]
    assert "'input_quantized_centred'" in blocks["MatMulInteger 'MatMul1_quant'"]
    assert all(s.cases for s in report.sites)


def _swap_centred(graph: ir.Graph, name: str = "input_quantized_centred") -> None:
    """zero point - y in place of y - zero point."""
    sub = next(n for n in graph if n.outputs[0].name == name or n.name == name)
    first, second = sub.inputs
    sub.replace_input_with(0, second)
    sub.replace_input_with(1, first)


def _off_by_one_product(graph: ir.Graph) -> None:
    """The first product reads y - zero point + 1."""
    centred = next(n for n in graph if n.outputs[0].name == "input_quantized_centred").outputs[0]
    one = ir.Value(name="one", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([]),
                   const_value=ir.tensor(np.array(1, np.float32), name="one"))
    graph.register_initializer(one)
    add = ir.node("Add", [centred, one], name="off_by_one")
    product = next(use.node for use in centred.uses() if use.node.op_type == "MatMul")
    graph.insert_before(product, add)
    product.replace_input_with(0, add.outputs[0])


def _swap_table_shift(graph: ir.Graph) -> None:
    """lean's table: zero point - table in place of table - zero point."""
    _swap_centred(graph, "input_quantized_centred_table")


@pytest.mark.parametrize(("edit", "target", "row", "detail"), [
    (_swap_centred, "openvino", "input_QuantizeLinear", "y_centred differs"),
    (_swap_table_shift, "webgpu", "input_QuantizeLinear", "y_centred differs"),
    (_off_by_one_product, "openvino", "MatMulInteger 'MatMul1_quant'", "output differs"),
])
def test_verify_fails_a_wrong_block(edit, target, row, detail):
    original = sample("mlp_dynamic")
    wrong = edit_graph(_lowered(original, target=target)[0], edit)
    report = dql_pass.verify(original, wrong, samples=1)
    assert report.verdict == "FAIL"
    (site,) = [s for s in report.sites if s.name == row]
    assert site.mismatches and detail in site.detail, report.format()


def _dql_also_read_elsewhere() -> onnx.ModelProto:
    """DQL -> MatMulInteger -> Cast -> Mul, and y also cast to float32 as a graph output."""
    weights = helper.make_tensor("W", TensorProto.UINT8, [4, 3], np.arange(12, dtype=np.uint8) * 20)
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zp"], name="dql"),
        helper.make_node("MatMulInteger", ["y", "W", "zp"], ["product"], name="mm"),
        helper.make_node("Cast", ["product"], ["product_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["product_float", "scale"], ["out"]),
        helper.make_node("Cast", ["y"], ["y_float"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, k])
                               for n, k in (("out", 3), ("y_float", 4))],
                              [weights])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("original", [_dql_also_read_elsewhere(), sample("relu_dql")],
                         ids=["another op", "graph output"])
def test_dql_read_by_more_than_lowered_products_keeps_the_uint8_path(original):
    lowered, report = _lowered(original, target="openvino")
    assert report.blocks == 0
    assert len(_casts(lowered, TensorProto.UINT8)) == 2  # y and its zero point
    assert not any(n.output[0].endswith("_centred") for n in lowered.graph.node)
    verdict = dql_pass.verify(original, lowered, samples=1)
    assert verdict.verdict == "PASS", verdict.format()


@pytest.mark.parametrize("target", [None, "reference", "tract"])
def test_blocks_with_a_variant_that_casts_a_nan_y_keep_the_uint8_path(target):
    """arithmetic and float64 end in Cast(Clip(NaN), uint8) for an x of both infinities: a block
    reading the float before that Cast would give NaN where y - y_zero_point is -255."""
    original = sample("mlp_dynamic")
    lowered, report = dql_pass.lower(original, target=target, blocks=True)
    assert report.blocks == 0 and "no blocks" in report.format()
    assert not any(n.output[0].endswith("_centred") for n in lowered.graph.node)
    verdict = dql_pass.verify(original, lowered, samples=1)  # its catalogue holds both infinities
    assert verdict.verdict == "PASS", verdict.format()
