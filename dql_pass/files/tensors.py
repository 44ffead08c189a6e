"""Where a model's tensors sit: every initializer and tensor attribute, in every graph and function,
which of them are kept in external data, and stand-ins that hold none of their bytes.

Rules: one walk finds them all (subgraphs and functions included); nothing here reads a data file
but :func:`in_memory`, which reads one tensor.
"""

from __future__ import annotations

__all__ = ["ExternalData", "Slot", "external_tensors", "in_memory", "slots", "stand_ins"]

import contextlib
import dataclasses
from collections.abc import Iterator

import onnx_ir as ir


@dataclasses.dataclass
class Slot:
    """Where a tensor of the model sits: an initializer's value, or a node's tensor attribute."""

    value: ir.Value | None = None
    node: ir.Node | None = None
    name: str = ""

    @property
    def tensor(self) -> ir.TensorProtocol | None:
        return self.value.const_value if self.value is not None else self.node.attributes[self.name].value

    @tensor.setter
    def tensor(self, tensor: ir.TensorProtocol) -> None:
        if self.value is not None:
            self.value.const_value = tensor
        else:
            old = self.node.attributes[self.name]
            self.node.attributes[self.name] = ir.AttrTensor(self.name, tensor, doc_string=old.doc_string)


def slots(model: ir.Model) -> Iterator[Slot]:
    """Every initializer and tensor attribute of the model, in every graph and function."""
    for root in [model.graph, *(function.graph for function in model.functions.values())]:
        yield from (Slot(value) for value in root.initializers.values())
        for node in ir.traversal.RecursiveGraphIterator(root):
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.TENSOR:
                    yield Slot(node=node, name=attr.name)
                elif attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
                    for graph in attr.value if attr.type == ir.AttributeType.GRAPHS else [attr.value]:
                        yield from (Slot(value) for value in graph.initializers.values())


@dataclasses.dataclass
class ExternalData:
    """The model's tensors kept in external data, found in one walk over every graph and function."""

    values: list[ir.Value]
    attributes: list[tuple[ir.Node, ir.Attr]]

    @classmethod
    def of(cls, model: ir.Model) -> ExternalData:
        found = cls([], [])
        for slot in slots(model):
            if not isinstance(slot.tensor, ir.ExternalTensor):
                continue
            if slot.value is not None:
                found.values.append(slot.value)
            else:
                found.attributes.append((slot.node, slot.node.attributes[slot.name]))
        return found

    @property
    def initializers(self) -> list[ir.ExternalTensor]:
        return [value.const_value for value in self.values]

    @property
    def tensors(self) -> list[ir.ExternalTensor]:
        return self.initializers + [attr.value for _, attr in self.attributes]


def external_tensors(model: ir.Model) -> list[ir.ExternalTensor]:
    """Every tensor of the model kept in external data: initializers and attributes, all graphs."""
    return ExternalData.of(model).tensors


def in_memory(tensor: ir.ExternalTensor) -> ir.Tensor:
    """The tensor's values, read from its file."""
    return ir.tensor(tensor.numpy(), name=tensor.name)


@contextlib.contextmanager
def stand_ins(slots: list[Slot]) -> Iterator[None]:
    """The ``slots``' tensors replaced, for a serialisation, by stand-ins that hold none of their bytes."""
    tensors = [slot.tensor for slot in slots]
    for slot, tensor in zip(slots, tensors):
        name = slot.value.name if slot.value is not None else tensor.name
        slot.tensor = ir.ExternalTensor("", 0, 0, tensor.dtype, shape=tensor.shape, name=name)
    try:
        yield
    finally:
        for slot, tensor in zip(slots, tensors):
            slot.tensor = tensor
