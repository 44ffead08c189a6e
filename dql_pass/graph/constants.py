"""Constants of a model: reading one, and dropping those that nothing reads any more."""

from __future__ import annotations

__all__ = ["constant", "drop_unused"]

from collections.abc import Iterable

import numpy as np
import onnx_ir as ir


def constant(value: ir.Value | None) -> np.ndarray | None:
    """The value's array when it is a constant no feed can override, else None."""
    if value is None or value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def drop_unused(values: Iterable[ir.Value | None]) -> None:
    """Drop the constants among ``values`` (initializers, outputs of Constant nodes) that nothing
    reads any more; a graph input or output stays."""
    for value in dict.fromkeys(v for v in values if v is not None):
        if value.uses() or value.is_graph_output() or value.is_graph_input():
            continue
        producer = value.producer()
        if value.is_initializer() and value.graph is not None:
            value.graph.initializers.pop(value.name)
        elif producer is not None and producer.graph is not None and producer.op_type == "Constant" \
                and len(producer.outputs) == 1:
            producer.graph.remove(producer, safe=True)
