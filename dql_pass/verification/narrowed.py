"""Narrowed precision: what ORT's CPU provider cannot check.

ORT's CPU provider (native, and onnxruntime-web's wasm) has few float16 or bfloat16 kernels: it
runs such a node in float32 between Casts it inserts, then removes a Cast pair it finds around
them, the model's own Cast from float32 to float16 included, even with every optimisation off. A
REWRITTEN that computes in float16 therefore gives on ORT what it would give in float32, and
matches ORIGINAL there though it does not on a runtime that computes in float16 (ONNX's reference,
WebGPU). Rules: a node computes in a narrow float when it is not a Cast and reads or writes a value
of that type, or the output of a Cast to it; as many of each op type as ORIGINAL has are
ORIGINAL's own, run the same way in both (counted, not matched by name: a tool that renames nodes
changes nothing).
"""

from __future__ import annotations

__all__ = ["narrowed_nodes"]

import collections

import onnx_ir as ir

from dql_pass.graph.walk import label, op_key

_NARROW = frozenset({ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def _narrow(value: ir.Value | None) -> bool:
    if value is None:
        return False
    producer = value.producer()
    cast_to = producer.attributes.get("to") if producer is not None and producer.op_type == "Cast" else None
    return value.dtype in _NARROW or (cast_to is not None and ir.DataType(cast_to.as_int()) in _NARROW)


def _computing(model: ir.Model) -> list[ir.Node]:
    """The nodes of ``model`` that compute in a narrow float."""
    return [
        node for root in (model.graph, *model.functions.values())
        for node in ir.traversal.RecursiveGraphIterator(root)
        if op_key(node) != ("", "Cast") and any(map(_narrow, (*node.inputs, *node.outputs)))
    ]


def narrowed_nodes(original: ir.Model, rewritten: ir.Model) -> list[str]:
    """The nodes of REWRITTEN that compute in float16 or bfloat16, by label, of each op type where
    REWRITTEN has more of them than ORIGINAL."""
    nodes = _computing(rewritten)
    more = collections.Counter(map(op_key, nodes)) - collections.Counter(map(op_key, _computing(original)))
    return sorted(label(node) for node in nodes if op_key(node) in more)
