"""Names no value or node of a model holds, and constants shared by the sites of one root."""

from __future__ import annotations

__all__ = ["SharedConstants", "UniqueNames", "free_name"]

import collections
import hashlib

import numpy as np
import onnx_ir as ir


def free_name(preferred: str, used: set[str], counts: collections.Counter[str]) -> str:
    """``preferred``, or the first ``preferred_N`` not in ``used``; ``counts`` remembers N, so
    asking for the same name again does not rescan."""
    name = preferred
    while name in used:
        counts[preferred] += 1
        name = f"{preferred}_{counts[preferred]}"
    return name


class UniqueNames:
    """Hands out names that no value or node of the model uses, in any scope.

    A site gets one fresh prefix ``p``; its names are ``p/role``. Such a name can only clash with
    an existing name whose part before the last ``/`` is ``p``, so the prefix is chosen outside
    that set and one check per site covers all of its names.
    """

    def __init__(self, taken: set[str]):
        self._taken = taken
        self._prefixes = {name.rsplit("/", 1)[0] for name in taken if "/" in name}
        self._name_counts: collections.Counter[str] = collections.Counter()
        self._prefix_counts: collections.Counter[str] = collections.Counter()

    @classmethod
    def of_model(cls, model: ir.Model) -> UniqueNames:
        taken: set[str] = set()
        graphs: list[ir.Graph] = []

        def enter(graph: ir.Graph | ir.Function) -> None:
            graphs.append(graph if isinstance(graph, ir.Graph) else graph.graph)

        for root in (model.graph, *model.functions.values()):
            for node in ir.traversal.RecursiveGraphIterator(root, enter_graph=enter):
                taken.add(node.name)
                taken.update(v.name for v in node.outputs)
        for graph in graphs:
            taken.update(v.name for v in graph.inputs)
            taken.update(graph.initializers)
        taken.discard(None)
        return cls(taken)

    def unique(self, preferred: str) -> str:
        name = free_name(preferred, self._taken, self._name_counts)
        self._taken.add(name)
        return name

    def prefix(self, preferred: str) -> str:
        prefix = free_name(preferred, self._prefixes, self._prefix_counts)
        self._prefixes.add(prefix)
        return prefix + "/"


def _digest(tensor: ir.TensorProtocol) -> bytes:
    """A digest of the tensor's values, read from its array in place: ``tobytes`` would make a
    transient copy of the whole tensor (a float32 weight four times the input's)."""
    array = tensor.numpy()
    if array.dtype.hasobject:  # strings
        return hashlib.sha256(tensor.tobytes()).digest()
    return hashlib.sha256(np.ascontiguousarray(array).reshape(-1).view(np.uint8)).digest()


class SharedConstants:
    """Constants shared by the sites of one root: main-graph initializers, or a function's Constant nodes."""

    def __init__(self, root: ir.Graph | ir.Function, names: UniqueNames):
        self._root = root
        self._names = names
        self._values: dict[tuple[ir.DataType, tuple[int, ...], bytes], ir.Value] = {}

    def get(self, role: str, tensor: ir.TensorProtocol) -> ir.Value:
        """The shared value holding ``tensor``, made on first use and named after ``role``."""
        # The shape is part of the key: 0.0 and [0.0] have the same bytes. A digest, not the bytes:
        # the keys would otherwise hold a second copy of every lowered weight.
        key = (tensor.dtype, tuple(tensor.shape), _digest(tensor))
        if key not in self._values:
            value = ir.Value(
                name=self._names.unique(f"dql_pass_{role}"),
                type=ir.TensorType(tensor.dtype),
                shape=ir.Shape(tensor.shape),
                const_value=ir.tensor(tensor.numpy()),
            )
            if isinstance(self._root, ir.Graph):
                self._root.register_initializer(value)
            else:
                attribute = ir.AttrTensor("value", value.const_value)
                constant = ir.Node("", "Constant", [], attributes=[attribute], outputs=[value], name=value.name)
                body = self._root.graph
                if len(body):
                    body.insert_before(body[0], constant)
                else:
                    body.append(constant)
            self._values[key] = value
        return self._values[key]
