"""Regenerate the sample ONNX models in ``models/`` (see ``models/README.md``).

Run from the repository root: ``python -m tools.make_models [--out models]``. The output is
deterministic (seeded weights, fixed names). Every model must pass ``onnx.checker`` with
``full_check=True`` and run on onnxruntime's CPU provider (through ``dql_pass.runtimes``), or the
script raises.

The ``*_dynamic`` models come from ``onnxruntime.quantization.quantize_dynamic``, called through
:func:`tools.models.quantize`. Its warning about missing pre-processing (symbolic shape inference
plus graph optimisation) is silenced there: the float models are built fully shaped and already
minimal, so pre-processing would change nothing.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dql_pass import op, runtimes
from dql_pass.files import atomic_path
from tools.models import quantize, random_feeds

# Written into every model: changing it changes the committed files' bytes.
PRODUCER = "dql_pass tools/make_models.py"
MAX_BYTES = 1 << 20
DQL = op.NAME
FLOAT, UINT8, INT64, BOOL = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT64, TensorProto.BOOL

vi = helper.make_tensor_value_info
node = helper.make_node


def _init(name: str, value: np.ndarray | float | int | bool, dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _model(
    graph: onnx.GraphProto,
    opset: int,
    functions: Sequence[onnx.FunctionProto] = (),
    domains: dict[str, int] | None = None,
) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    # The lowest IR version that fits, but at least 8, which model-local functions need.
    ir_version = max(8, helper.find_min_ir_version_for(opsets, ignore_unknown=True))
    model = helper.make_model(graph, opset_imports=opsets, functions=functions, ir_version=ir_version)
    model.producer_name = PRODUCER
    return model


def _quantize(model: onnx.ModelProto, op_types: Sequence[str] = ("MatMul",)) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory(prefix="make_models.") as tmp:
        quantized = onnx.load(quantize(model, pathlib.Path(tmp), "quant.onnx", op_types))
    quantized.producer_name, quantized.producer_version = PRODUCER, ""
    del quantized.metadata_props[:]
    return quantized


def mlp(opset: int, seed: int) -> onnx.ModelProto:
    """Float MLP: input [batch, 64] -> 3 x (MatMul + Add + Relu), widths 128, 128, 32."""
    rng = np.random.default_rng(seed)
    widths = [64, 128, 128, 32]
    nodes, inits, prev = [], [], "input"
    for i, (n_in, n_out) in enumerate(zip(widths, widths[1:]), start=1):
        inits += [_init(f"W{i}", rng.normal(0, n_in**-0.5, (n_in, n_out))), _init(f"B{i}", rng.normal(0, 0.1, n_out))]
        nodes += [
            node("MatMul", [prev, f"W{i}"], [f"matmul{i}"], name=f"MatMul{i}"),
            node("Add", [f"matmul{i}", f"B{i}"], [f"add{i}"], name=f"Add{i}"),
            node("Relu", [f"add{i}"], [f"relu{i}"], name=f"Relu{i}"),
        ]
        prev = f"relu{i}"
    graph = helper.make_graph(
        nodes, "mlp", [vi("input", FLOAT, ["batch", 64])], [vi(prev, FLOAT, ["batch", 32])], inits
    )
    return _model(graph, opset)


def conv_net(seed: int) -> onnx.ModelProto:
    """Float conv net: [batch, 3, 16, 16] -> 2 x (Conv + Relu) -> Flatten -> MatMul + Add -> [batch, 10]."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("conv1.W", rng.normal(0, 0.2, (8, 3, 3, 3))),
        _init("conv1.B", rng.normal(0, 0.1, 8)),
        _init("conv2.W", rng.normal(0, 0.1, (16, 8, 3, 3))),
        _init("conv2.B", rng.normal(0, 0.1, 16)),
        _init("fc.W", rng.normal(0, 1024**-0.5, (1024, 10))),
        _init("fc.B", rng.normal(0, 0.1, 10)),
    ]
    nodes = [
        node("Conv", ["input", "conv1.W", "conv1.B"], ["conv1"], name="Conv1", pads=[1, 1, 1, 1]),
        node("Relu", ["conv1"], ["relu1"], name="Relu1"),
        node("Conv", ["relu1", "conv2.W", "conv2.B"], ["conv2"], name="Conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        node("Relu", ["conv2"], ["relu2"], name="Relu2"),
        node("Flatten", ["relu2"], ["flat"], name="Flatten", axis=1),
        node("MatMul", ["flat", "fc.W"], ["fc"], name="MatMul"),
        node("Add", ["fc", "fc.B"], ["logits"], name="Add"),
    ]
    graph = helper.make_graph(
        nodes, "conv", [vi("input", FLOAT, ["batch", 3, 16, 16])], [vi("logits", FLOAT, ["batch", 10])], inits
    )
    return _model(graph, 13)


def _dequantize(q: str, scale: str, zero_point: str, out: str) -> list[onnx.NodeProto]:
    """out = (float(q) - float(zero_point)) * scale.

    Spelled out rather than DequantizeLinear, which onnx.reference (1.23) lacks below opset 19.
    """
    return [
        node("Cast", [q], [f"{out}_q"], to=FLOAT),
        node("Cast", [zero_point], [f"{out}_zp"], to=FLOAT),
        node("Sub", [f"{out}_q", f"{out}_zp"], [f"{out}_centered"]),
        node("Mul", [f"{out}_centered", scale], [out]),
    ]


def _fake_quant(src: str, prefix: str) -> list[onnx.NodeProto]:
    """DQL(src) -> prefix_y, prefix_y_scale, prefix_y_zero_point, dequantized into prefix_out."""
    outs = [f"{prefix}_y", f"{prefix}_y_scale", f"{prefix}_y_zero_point"]
    return [node(DQL, [src], outs), *_dequantize(*outs, f"{prefix}_out")]


def control_flow() -> onnx.ModelProto:
    """DQL in the main graph, If branches, a Loop body, an If inside that body, a Scan body and a function.

    Intermediate names (tmp, val_0, Scale, X_Min, x_scale, x_min, y_scale, ...) are chosen to
    clash with the names an expansion is likely to generate.
    """
    f4x8 = [4, 8]
    then_branch = helper.make_graph(
        _fake_quant("val_0", "then"), "then_branch", [], [vi("then_out", FLOAT, f4x8)]
    )
    else_branch = helper.make_graph(
        [node("Neg", ["x"], ["x_range"]), *_fake_quant("x_range", "else")],
        "else_branch",
        [],
        [vi("else_out", FLOAT, f4x8)],
    )
    inner_then = helper.make_graph(
        [*_fake_quant("X_Min", "inner"), node("Mul", ["inner_out", "Scale"], ["inner_then_out"])],
        "inner_then",
        [],
        [vi("inner_then_out", FLOAT, f4x8)],
    )
    inner_else = helper.make_graph(
        [node("Mul", ["X_Min", "Scale"], ["inner_else_out"])], "inner_else", [], [vi("inner_else_out", FLOAT, f4x8)]
    )
    loop_body = helper.make_graph(
        [
            node("Add", ["acc", "x"], ["x_scale"]),
            node(DQL, ["x_scale"], ["loop_y", "loop_y_scale", "loop_y_zero_point"]),
            *_dequantize("loop_y", "loop_y_scale", "loop_y_zero_point", "X_Min"),
            node("If", ["cond"], ["acc_next"], then_branch=inner_then, else_branch=inner_else),
            node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "loop_body",
        [vi("iter", INT64, []), vi("cond_in", BOOL, []), vi("acc", FLOAT, f4x8), vi("last_scale", FLOAT, [])],
        [vi("cond_out", BOOL, []), vi("acc_next", FLOAT, f4x8), vi("loop_y_scale", FLOAT, [])],
    )
    scan_body = helper.make_graph(
        [
            node("Add", ["state", "row"], ["val_1"]),
            node("Mul", ["val_1", "Scale"], ["tmp_1"]),
            node(DQL, ["tmp_1"], ["scan_y", "scan_y_scale", "scan_y_zero_point"]),
            *_dequantize("scan_y", "scan_y_scale", "scan_y_zero_point", "state_next"),
        ],
        "scan_body",
        [vi("state", FLOAT, [8]), vi("row", FLOAT, [8])],
        [vi("state_next", FLOAT, [8]), vi("scan_y_zero_point", UINT8, [])],
    )
    fake_quant = helper.make_function(
        "local",
        "FakeQuant",
        ["x"],
        ["y", "y_scale"],
        [
            node("Relu", ["x"], ["tmp"]),
            node(DQL, ["tmp"], ["q", "y_scale", "zero_point"]),
            *_dequantize("q", "y_scale", "zero_point", "y"),
        ],
        [helper.make_opsetid("", 13)],
    )
    nodes = [
        node("Mul", ["x", "Scale"], ["tmp"]),
        node(DQL, ["tmp"], ["y", "y_scale", "y_zero_point"]),
        *_dequantize("y", "y_scale", "y_zero_point", "val_0"),
        node("If", ["cond"], ["if_out"], then_branch=then_branch, else_branch=else_branch),
        node("Loop", ["trip_count", "keep_going", "if_out", "Scale"], ["loop_out", "loop_scale"], body=loop_body),
        node("Scan", ["x_min", "x"], ["scan_state", "scan_zero_points"], body=scan_body, num_scan_inputs=1),
        node("FakeQuant", ["loop_out"], ["fq_out", "fq_scale"], domain="local"),
        node("FakeQuant", ["scan_state"], ["fq_row", "fq_row_scale"], domain="local"),
        node("Add", ["fq_out", "fq_row"], ["out"]),
    ]
    inits = [
        _init("Scale", 0.5),
        _init("trip_count", 3, np.int64),
        _init("keep_going", True, np.bool_),
        _init("x_min", np.zeros(8)),
    ]
    graph = helper.make_graph(
        nodes,
        "control_flow",
        [vi("x", FLOAT, f4x8), vi("cond", BOOL, [])],
        [
            vi("out", FLOAT, f4x8),
            vi("y_scale", FLOAT, []),
            vi("loop_scale", FLOAT, []),
            vi("scan_zero_points", UINT8, [4]),
            vi("fq_scale", FLOAT, []),
            vi("fq_row_scale", FLOAT, []),
        ],
        inits,
    )
    return _model(graph, 13, [fake_quant], {"local": 1})


def relu_dql(seed: int) -> onnx.ModelProto:
    """Relu -> DQL -> MatMulInteger -> Cast -> Mul, as quantize_dynamic emits it (names included).

    All-negative inputs make the DQL input all zeros: a zero range.
    """
    rng = np.random.default_rng(seed)
    inits = [
        _init("W_quantized", rng.integers(0, 256, (16, 8)), np.uint8),
        _init("W_zero_point", 128, np.uint8),
        _init("W_scale", 0.01),
    ]
    dql_outs = ["relu_out_quantized", "relu_out_scale", "relu_out_zero_point"]
    nodes = [
        node("Relu", ["x"], ["relu_out"], name="Relu"),
        node(DQL, ["relu_out"], dql_outs, name="relu_out_QuantizeLinear"),
        node("Mul", ["relu_out_scale", "W_scale"], ["MatMul_quant_scales_mul:0"], name="MatMul_quant_scales_mul"),
        node(
            "MatMulInteger",
            ["relu_out_quantized", "W_quantized", "relu_out_zero_point", "W_zero_point"],
            ["y_output_quantized"],
            name="MatMul_quant",
        ),
        node("Cast", ["y_output_quantized"], ["y_output_quantized_cast_output"], name="y_cast", to=FLOAT),
        node(
            "Mul",
            ["y_output_quantized_cast_output", "MatMul_quant_scales_mul:0"],
            ["y"],
            name="MatMul_quant_output_scale_mul",
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "relu_dql",
        [vi("x", FLOAT, ["batch", 16])],
        [
            vi("y", FLOAT, ["batch", 8]),
            vi("relu_out_quantized", UINT8, ["batch", 16]),
            vi("relu_out_scale", FLOAT, []),
            vi("relu_out_zero_point", UINT8, []),
        ],
        inits,
    )
    return _model(graph, 13)


def _graphs(graph: onnx.GraphProto, where: str) -> Iterator[tuple[str, onnx.GraphProto]]:
    """The graph and every subgraph in it, labelled 'main' or 'subgraph'."""
    yield where, graph
    for n in graph.node:
        for attr in n.attribute:
            for sub in [attr.g] if attr.HasField("g") else attr.graphs:
                yield from _graphs(sub, "subgraph")


def dql_sites(model: onnx.ModelProto) -> collections.Counter[str]:
    """How many DQL nodes sit in the main graph, in subgraphs and in model-local functions."""
    sites: collections.Counter[str] = collections.Counter()
    for where, graph in _graphs(model.graph, "main"):
        sites[where] += sum(n.op_type == DQL and n.domain in ("", "ai.onnx") for n in graph.node)
    for fn in model.functions:
        sites["function"] += sum(n.op_type == DQL and n.domain in ("", "ai.onnx") for n in fn.node)
    return sites


def check(path: pathlib.Path, spec: Spec) -> None:
    """Fail loudly unless the saved model is valid, small, has the expected ops and runs on ORT CPU.

    The messages do not name ``path``, a temporary file: ``atomic_path`` names the model.
    """
    size = path.stat().st_size
    if size >= MAX_BYTES:
        raise RuntimeError(f"{size} bytes, over the {MAX_BYTES} byte limit")
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    imported = {o.domain: o.version for o in model.opset_import}
    if imported.get("", imported.get("ai.onnx")) != spec.opset:
        raise RuntimeError(f"imports {imported}, expected ai.onnx opset {spec.opset}")
    sites = {k: v for k, v in dql_sites(model).items() if v}
    if sites != spec.dql:
        raise RuntimeError(f"DQL nodes {sites}, expected {spec.dql}")
    op_types = {n.op_type for _, g in _graphs(model.graph, "main") for n in g.node}
    op_types |= {n.op_type for fn in model.functions for n in fn.node}
    missing = set(spec.ops) - op_types
    if missing:
        raise RuntimeError(f"missing op types {sorted(missing)}")
    session = runtimes.get("onnxruntime").load(path)
    rng = np.random.default_rng(0)
    # Random data with each boolean value, then all-negative data (a zero range after Relu).
    for flag, negative in [(True, False), (False, False), (True, True)]:
        results = session.run(random_feeds(model, rng, size=2, flag=flag, negative=negative))
        for name, value in zip(session.output_names, results):
            if value.dtype == np.float32 and not np.isfinite(value).all():
                raise RuntimeError(f"output {name} is not finite")


class Spec(NamedTuple):
    """A model to write: its builder, ai.onnx opset, op types it must hold and DQL count per site."""

    build: Callable[[], onnx.ModelProto]
    opset: int
    ops: tuple[str, ...]
    dql: dict[str, int]


MODELS: dict[str, Spec] = {
    "mlp_dynamic.onnx": Spec(lambda: _quantize(mlp(13, seed=1)), 13, ("MatMulInteger",), {"main": 3}),
    "conv_dynamic.onnx": Spec(
        lambda: _quantize(conv_net(seed=2), ("Conv", "MatMul")), 13, ("ConvInteger", "MatMulInteger"), {"main": 3}
    ),
    "control_flow.onnx": Spec(
        control_flow, 13, ("If", "Loop", "Scan", "FakeQuant"), {"main": 1, "subgraph": 5, "function": 1}
    ),
    "relu_dql.onnx": Spec(lambda: relu_dql(seed=4), 13, ("Relu", "MatMulInteger"), {"main": 1}),
    "opset21_dynamic.onnx": Spec(lambda: _quantize(mlp(21, seed=5)), 21, ("MatMulInteger",), {"main": 3}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("models"), help="output directory")
    out: pathlib.Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    for name, spec in MODELS.items():
        path = out / name
        # Written beside the model and checked there, so a failed check leaves the old model in place.
        with atomic_path(path, "model") as temporary:
            onnx.save(spec.build(), temporary)
            check(pathlib.Path(temporary), spec)
        where = ", ".join(f"{k} {v}" for k, v in spec.dql.items())
        print(f"{name:22} {path.stat().st_size / 1024:5.1f} KiB  opset {spec.opset}  DQL: {where}")


if __name__ == "__main__":
    main()
