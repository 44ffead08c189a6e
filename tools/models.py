"""The synthetic models the tools build, ``quantize_dynamic`` over them, and random inputs for them.

Rules:

- Every builder is deterministic: seeded weights, fixed names, so a regenerated sample model is
  byte-identical and a benchmark measures the same graph each run.
- Builders return an ``onnx.ModelProto`` (or write a file when the weights are external) and
  import no runtime; only :func:`quantize` loads onnxruntime's quantization tool.
"""

from __future__ import annotations

__all__ = [
    "MINILM",
    "TransformerShape",
    "big_external_model",
    "chain_model",
    "cnn_model",
    "dql_count",
    "inline_onnx_function",
    "minilm_model",
    "quantize",
    "random_feeds",
]

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
from onnx import TensorProto, helper, numpy_helper

from dql_pass import op
from dql_pass.runtimes.ort import import_onnxruntime

FLOAT, UINT8 = TensorProto.FLOAT, TensorProto.UINT8


@dataclasses.dataclass(frozen=True)
class TransformerShape:
    layers: int
    hidden: int
    heads: int
    intermediate: int
    seq: int | None  # None: symbolic batch and sequence dimensions


MINILM = TransformerShape(layers=6, hidden=384, heads=12, intermediate=1536, seq=128)


def _model(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    """The model of ``graph`` at ai.onnx ``opset``, with the lowest IR version that opset allows, as
    the sample models have: onnx's default (its newest) is past what onnxruntime-web 1.30 loads (13)."""
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


def inline_onnx_function(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX's own function body of DynamicQuantizeLinear, inlined at every site."""
    return onnx.inliner.inline_selected_functions(model, [("", op.NAME)], inline_schema_functions=True)


def chain_model(sites: int, width: int = 16, opset: int = 13) -> onnx.ModelProto:
    """``sites`` DQLs in a chain: each site's y is dequantized back to float and fed to the next."""
    nodes = []
    for i in range(sites):
        q = [f"q{i}", f"scale{i}", f"zero_point{i}"]
        nodes.append(helper.make_node(op.NAME, [f"x{i}"], q, name=f"dql{i}"))
        nodes.append(helper.make_node("DequantizeLinear", q, [f"x{i + 1}"], name=f"dequantize{i}"))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x0", FLOAT, [width])],
        [helper.make_tensor_value_info(f"x{sites}", FLOAT, [width])],
    )
    return _model(graph, opset)


def big_external_model(folder: Path, sites: int, side: int, opset: int = 13) -> Path:
    """A chain of ``sites`` DQL -> MatMulInteger(y, W_i) -> Cast -> Mul(scale) in ``folder/big.onnx``.

    Each W_i is a ``side`` x ``side`` uint8 initializer in external data, all in one
    ``weights.bin``. The file is made by truncation: sparse, all zeros, written in no time.
    """
    weight_bytes = side * side
    (folder / "weights.bin").open("wb").truncate(sites * weight_bytes)
    weights, nodes = [], []
    for i in range(sites):
        weight = TensorProto(name=f"W{i}", data_type=UINT8, dims=[side, side], data_location=TensorProto.EXTERNAL)
        for key, value in (("location", "weights.bin"), ("offset", i * weight_bytes), ("length", weight_bytes)):
            weight.external_data.add(key=key, value=str(value))
        weights.append(weight)
        nodes += [
            helper.make_node(op.NAME, [f"h{i}"], [f"q{i}", f"scale{i}", f"zp{i}"], name=f"dql{i}"),
            helper.make_node("MatMulInteger", [f"q{i}", f"W{i}", f"zp{i}", "W_zp"], [f"acc{i}"], name=f"mmi{i}"),
            helper.make_node("Cast", [f"acc{i}"], [f"accf{i}"], to=FLOAT, name=f"cast{i}"),
            helper.make_node("Mul", [f"accf{i}", f"scale{i}"], [f"h{i + 1}"], name=f"mul{i}"),
        ]
    graph = helper.make_graph(
        nodes,
        "big",
        [helper.make_tensor_value_info("h0", FLOAT, [1, side])],
        [helper.make_tensor_value_info(f"h{sites}", FLOAT, [1, side])],
        [*weights, numpy_helper.from_array(np.array(0, np.uint8), "W_zp")],
    )
    path = folder / "big.onnx"
    onnx.save(_model(graph, opset), path)
    return path


def minilm_model(
    shape: TransformerShape = MINILM, opset: int = 17, seed: int = 0, vocab: int | None = None
) -> onnx.ModelProto:
    """A float BERT-style encoder: attention, LayerNormalization, Erf GELU; four weight MatMuls a layer.

    Without ``vocab`` the input is ``hidden_states``, float [1, seq, hidden]. With it the inputs are
    int64 ``input_ids`` and ``attention_mask`` [1, seq], looked up in a word embedding of ``vocab``
    rows, the mask added to the attention scores. ``shape.seq`` None makes the batch and sequence
    dimensions symbolic.
    """
    rng = np.random.default_rng(seed)
    hidden, heads = shape.hidden, shape.heads
    head = hidden // heads
    dims: list[int | str] = ["batch", "sequence"] if shape.seq is None else [1, shape.seq]
    inits: list[TensorProto] = [
        # Reshape's 0 keeps the batch and sequence dimensions, fixed or symbolic.
        numpy_helper.from_array(np.array([0, 0, heads, head], np.int64), "heads_shape"),
        numpy_helper.from_array(np.array([0, 0, hidden], np.int64), "hidden_shape"),
        numpy_helper.from_array(np.array(head**-0.5, np.float32), "attention_scale"),
        numpy_helper.from_array(np.array(2**-0.5, np.float32), "inv_sqrt2"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(0.5, np.float32), "half"),
    ]
    nodes: list[onnx.NodeProto] = []

    def param(name: str, *dims: int, std: float = 0.02, mean: float = 0.0) -> str:
        inits.append(numpy_helper.from_array(rng.normal(mean, std, dims).astype(np.float32), name))
        return name

    def op(op_type: str, inputs: list[str], output: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def dense(x: str, name: str, n_in: int, n_out: int) -> str:
        y = op("MatMul", [x, param(f"{name}.weight", n_in, n_out)], f"{name}.matmul")
        return op("Add", [y, param(f"{name}.bias", n_out)], f"{name}.out")

    def norm(x: str, name: str) -> str:
        scale, bias = param(f"{name}.gamma", hidden, std=0.1, mean=1.0), param(f"{name}.beta", hidden)
        return op("LayerNormalization", [x, scale, bias], f"{name}.out", axis=-1, epsilon=1e-12)

    mask = None
    if vocab is None:
        inputs = [helper.make_tensor_value_info("hidden_states", FLOAT, [*dims, hidden])]
        x = "hidden_states"
    else:
        inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, dims) for n in ("input_ids", "attention_mask")]
        inits += [numpy_helper.from_array(np.array([1, 2], np.int64), "mask_axes"),
                  numpy_helper.from_array(np.array(-10000.0, np.float32), "mask_value")]
        x = norm(op("Gather", [param("word_embeddings", vocab, hidden), "input_ids"], "embedded"), "embeddings.ln")
        mask = op("Cast", ["attention_mask"], "mask.float", to=FLOAT)
        mask = op("Mul", [op("Sub", ["one", mask], "mask.inverted"), "mask_value"], "mask.additive")
        mask = op("Unsqueeze", [mask, "mask_axes"], "mask.broadcast")
    for layer in range(shape.layers):
        p = f"layer{layer}"
        split = {
            part: op("Reshape", [dense(x, f"{p}.{part}", hidden, hidden), "heads_shape"], f"{p}.{part}.heads")
            for part in ("query", "key", "value")
        }
        q = op("Transpose", [split["query"]], f"{p}.q", perm=[0, 2, 1, 3])
        k = op("Transpose", [split["key"]], f"{p}.k", perm=[0, 2, 3, 1])
        v = op("Transpose", [split["value"]], f"{p}.v", perm=[0, 2, 1, 3])
        scores = op("Mul", [op("MatMul", [q, k], f"{p}.qk"), "attention_scale"], f"{p}.scores")
        if mask is not None:
            scores = op("Add", [scores, mask], f"{p}.scores.masked")
        context = op("MatMul", [op("Softmax", [scores], f"{p}.probs", axis=-1), v], f"{p}.context")
        context = op("Transpose", [context], f"{p}.context.t", perm=[0, 2, 1, 3])
        context = op("Reshape", [context, "hidden_shape"], f"{p}.context.merged")
        attended = norm(op("Add", [x, dense(context, f"{p}.output", hidden, hidden)], f"{p}.residual1"), f"{p}.ln1")
        up = dense(attended, f"{p}.intermediate", hidden, shape.intermediate)
        erf = op("Erf", [op("Mul", [up, "inv_sqrt2"], f"{p}.gelu.scaled")], f"{p}.gelu.erf")
        gate = op("Mul", [op("Add", [erf, "one"], f"{p}.gelu.shift"), "half"], f"{p}.gelu.gate")
        gelu = op("Mul", [up, gate], f"{p}.gelu")
        down = dense(gelu, f"{p}.ffn_output", shape.intermediate, hidden)
        x = norm(op("Add", [attended, down], f"{p}.residual2"), f"{p}.ln2")
    graph = helper.make_graph(
        nodes,
        "minilm",
        inputs,
        [helper.make_tensor_value_info(x, FLOAT, [*dims, hidden])],
        inits,
    )
    return _model(graph, opset)


def cnn_model(channels: int = 8, side: int = 16, classes: int = 10, opset: int = 13, seed: int = 0) -> onnx.ModelProto:
    """A float CNN on ``[batch, 3, side, side]``: a padded Conv, a strided grouped Conv and a
    dilated Conv (Relu after each), Flatten, and a MatMul + Add head.

    Every Conv and MatMul has a constant weight, so ``quantize_dynamic`` quantizes them all and the
    float ops left are elementwise or reshapes.
    """
    rng = np.random.default_rng(seed)
    inits: list[TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, *dims: int) -> str:
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(dims) / np.sqrt(np.prod(dims[1:]))).astype(np.float32), name))
        return name

    x = "image"
    convs = (  # name, in, out, group, attributes
        ("conv1", 3, channels, 1, dict(pads=[1, 1, 1, 1])),
        ("conv2", channels, 2 * channels, 2, dict(pads=[1, 1, 1, 1], strides=[2, 2])),
        ("conv3", 2 * channels, 2 * channels, 1, dict(dilations=[2, 2], pads=[2, 2, 2, 2])),
    )
    for name, n_in, n_out, group, attributes in convs:
        nodes.append(helper.make_node("Conv", [x, weight(f"{name}.weight", n_out, n_in // group, 3, 3)],
                                      [f"{name}.out"], name=name, group=group, kernel_shape=[3, 3], **attributes))
        nodes.append(helper.make_node("Relu", [f"{name}.out"], [f"{name}.relu"], name=f"{name}.relu"))
        x = f"{name}.relu"
    nodes.append(helper.make_node("Flatten", [x], ["flat"], name="flatten"))
    features = 2 * channels * (side // 2) ** 2
    nodes.append(helper.make_node("MatMul", ["flat", weight("head.weight", features, classes)], ["head.matmul"],
                                  name="head"))
    inits.append(numpy_helper.from_array(rng.standard_normal(classes).astype(np.float32), "head.bias"))
    nodes.append(helper.make_node("Add", ["head.matmul", "head.bias"], ["logits"], name="head.bias"))
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("image", FLOAT, ["batch", 3, side, side])],
        [helper.make_tensor_value_info("logits", FLOAT, ["batch", classes])], inits,
    )
    return _model(graph, opset)


def quantize(
    model: onnx.ModelProto,
    folder: Path,
    name: str,
    op_types: Sequence[str] = ("MatMul",),
    *,
    weight_type: str = "QUInt8",
    per_channel: bool = False,
) -> Path:
    """``quantize_dynamic`` (``op_types``, ``weight_type`` QUInt8 or QInt8, per tensor or per
    channel) of ``model``, saved as ``folder/name``.

    ORT's quantization tool rewrites the model and runs nothing; onnxruntime is imported first
    through ``dql_pass.runtimes``, whose import turns its telemetry off, and only when called.
    """
    import_onnxruntime()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source, target = folder / f"{name}.float.onnx", folder / name
    onnx.save(model, source)
    # quantize_dynamic warns on the root logger that pre-processing is advised; the model is already minimal.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        quantize_dynamic(source, target, op_types_to_quantize=list(op_types), weight_type=QuantType[weight_type],
                         per_channel=per_channel)
    finally:
        root.setLevel(level)
    return target


def dql_count(model: onnx.ModelProto) -> int:
    """DynamicQuantizeLinear nodes in the main graph."""
    return sum(node.op_type == op.NAME for node in model.graph.node)


def random_feeds(
    model: onnx.ModelProto, rng: np.random.Generator, *, size: int = 1, flag: bool = True, negative: bool = False
) -> dict[str, np.ndarray]:
    """Standard normal float32 for every float input (all negative if ``negative``), ``flag`` for bool inputs.

    Symbolic dimensions take ``size``. Any other input type raises ``ValueError``: these are
    inputs for the tools' own models, whose inputs are float or bool.
    """
    initializers = {tensor.name for tensor in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else size for d in tensor.shape.dim]
        if tensor.elem_type == TensorProto.BOOL:
            feeds[value.name] = np.full(shape, flag)
        elif tensor.elem_type == FLOAT:
            data = rng.standard_normal(shape, dtype=np.float32)
            feeds[value.name] = -np.abs(data) if negative else data
        else:
            raise ValueError(f"input {value.name} is {TensorProto.DataType.Name(tensor.elem_type)}; "
                             "random_feeds makes float and bool inputs only")
    return feeds
