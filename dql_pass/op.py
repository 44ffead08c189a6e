"""The operator's identity: what DynamicQuantizeLinear is called, takes and gives, and the choices
every form of it is built under.

Everything else asks here: whether a node is a DQL, which ai.onnx opset a graph imports, the names
and types of the three outputs, the opset range, the one-node model, and the variant, mode and
zero-range choices with their one parser.
"""

from __future__ import annotations

__all__ = [
    "CENTRED_FROM",
    "CENTRED_OUTPUTS",
    "CENTRED_OUTPUT_TYPES",
    "INPUT",
    "MAX_OPSET",
    "MIN_OPSET",
    "MODES",
    "NAME",
    "OUTPUTS",
    "OUTPUT_TYPES",
    "VARIANTS",
    "ZERO_RANGE_POLICIES",
    "ai_onnx_opset",
    "check_choice",
    "is_dql",
    "one_node_model",
    "version",
]

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dql_pass import metadata, variants
from dql_pass.errors import InputError

if TYPE_CHECKING:
    import onnx
    import onnx_ir as ir

    OUTPUT_TYPES: tuple[ir.DataType, ...]
    CENTRED_OUTPUT_TYPES: tuple[ir.DataType, ...]
    MAX_OPSET: int

NAME = "DynamicQuantizeLinear"
DOMAINS: tuple[str, ...] = ("", "ai.onnx")
INPUT = "x"
OUTPUTS: tuple[str, ...] = ("y", "y_scale", "y_zero_point")
# What verify checks of a site that lower kept in float32 (a block): y - y_zero_point, and y_scale.
CENTRED_OUTPUTS: tuple[str, ...] = ("y_centred", "y_scale")
# The outputs a block's value is made of: where it differs, one of them does.
CENTRED_FROM: dict[str, tuple[str, ...]] = {"y_centred": ("y", "y_zero_point")}
MIN_OPSET = 11  # DynamicQuantizeLinear-11 is the only version of the operator
_OF_GRAPH_LIBRARIES = ("OUTPUT_TYPES", "CENTRED_OUTPUT_TYPES", "MAX_OPSET")

VARIANTS: tuple[str, ...] = variants.NAMES
MODES, ZERO_RANGE_POLICIES = variants.MODES, variants.ZERO_RANGE_POLICIES

_CHOICES: dict[str, tuple[str, ...]] = {
    "variant": VARIANTS, "mode": MODES, "zero-range policy": ZERO_RANGE_POLICIES, "weights": variants.WEIGHTS,
}


def __getattr__(name: str) -> object:
    """The values made of onnx's and onnx_ir's, on first use: listing the runtimes reads this
    module and needs neither library."""
    if name not in _OF_GRAPH_LIBRARIES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import onnx
    import onnx_ir as ir

    globals().update(
        OUTPUT_TYPES=(ir.DataType.UINT8, ir.DataType.FLOAT, ir.DataType.UINT8),
        CENTRED_OUTPUT_TYPES=(ir.DataType.FLOAT, ir.DataType.FLOAT),
        MAX_OPSET=onnx.defs.onnx_opset_version(),
    )
    return globals()[name]


def check_choice(kind: str, value: str, choices: Sequence[str] | None = None) -> str:
    """``value`` if it is one of the ``kind`` choices; else :class:`InputError` naming them."""
    choices = _CHOICES[kind] if choices is None else choices
    if value not in choices:
        raise InputError(f"unknown {kind} {value!r}; choose from {', '.join(choices)}")
    return value


def is_dql(node: ir.Node) -> bool:
    return node.op_type == NAME and node.domain in DOMAINS


def ai_onnx_opset(opset_imports: Mapping[str, int]) -> int | None:
    """The ai.onnx opset of an import map, under either of its names."""
    for domain in DOMAINS:
        if domain in opset_imports:
            return opset_imports[domain]
    return None


def version() -> str:
    """The installed dql_pass version, as models and manifests record it."""
    return metadata.VERSION


def one_node_model(
    shape: Sequence[int | str | None], opset: int, *, name: str = "dql", description: str = "", domain: str = ""
) -> onnx.ModelProto:
    """The model holding one DynamicQuantizeLinear node, on an input ``x`` of ``shape``."""
    import onnx
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node(NAME, [INPUT], list(OUTPUTS), domain=domain)],
        name,
        [helper.make_tensor_value_info(INPUT, onnx.TensorProto.FLOAT, shape)],
        [
            helper.make_tensor_value_info(OUTPUTS[0], onnx.TensorProto.UINT8, shape),
            helper.make_tensor_value_info(OUTPUTS[1], onnx.TensorProto.FLOAT, ()),
            helper.make_tensor_value_info(OUTPUTS[2], onnx.TensorProto.UINT8, ()),
        ],
    )
    opsets = [helper.make_opsetid(domain, opset)]
    # The oldest IR version the opset allows, so that older runtimes can read the models too.
    model = helper.make_model(
        graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets, ignore_unknown=True),
        producer_name="dql_pass", producer_version=version(),
    )
    model.doc_string = description
    return model
