"""A model written as protobuf: serialised with one metadata entry per key (onnx_ir's round trip
adds one), and a one-file model written a tensor at a time, its large tensors' bytes going from the
array to the file rather than through a message.

Rules: a one-file model past protobuf's limit of 2 GiB raises :class:`TooLarge` (protobuf parses
no such message); the file written parses as the one model ``ir.save`` would write.
"""

from __future__ import annotations

__all__ = ["AROUND_DATA", "TooLarge", "check_size", "one_entry_per_key", "save_streamed", "serialized"]

import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx
import onnx_ir as ir

from dql_pass.files.tensors import Slot, slots, stand_ins

_STREAMED = 1 << 20  # bytes: larger tensors of a one-file model are serialised one at a time
# Bytes a tensor's data adds to a model besides its own: its field's tag and length, and the
# lengths of the messages around it growing, as deep as graphs nest.
AROUND_DATA = 64


class TooLarge(ValueError):
    """The model is past protobuf's limit with every tensor that can be in external data there."""


def check_size(size: int, limit: int) -> None:
    if size > limit:
        raise TooLarge(size)


def serialized(model: ir.Model) -> onnx.ModelProto:
    proto = ir.serde.serialize_model(model)
    if any(isinstance(slot.tensor, ir.serde.TensorProtoTensor) and slot.tensor.metadata_props for slot in slots(model)):
        for tensor in _tensor_protos(proto):
            one_entry_per_key(tensor)
    return proto


def one_entry_per_key(tensor: onnx.TensorProto) -> None:
    """One metadata_props entry per key, the last: onnx_ir (1.1) writes the entries of a tensor it
    read from a proto twice, the proto's and its own copy, so that each save would add a copy."""
    entries = {entry.key: entry.value for entry in tensor.metadata_props}
    if len(entries) < len(tensor.metadata_props):
        del tensor.metadata_props[:]
        for key, value in entries.items():
            tensor.metadata_props.add(key=key, value=value)


def _tensor_protos(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every initializer and tensor attribute of ``proto``, in every graph and function."""

    def in_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.TensorProto]:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                for graph in [attr.g] if attr.HasField("g") else attr.graphs:
                    yield from in_graph(graph)

    def in_graph(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
        yield from graph.initializer
        yield from in_nodes(graph.node)

    yield from in_graph(proto.graph)
    for function in proto.functions:
        yield from in_nodes(function.node)


def save_streamed(model: ir.Model, path: Path, limit: int) -> None:
    """``ir.save`` of a model whose tensors stay in it, without a second and a third copy of them.

    The model goes out without its large initializers, then each of them as a message of its own:
    protobuf merges a message field that occurs twice (here ``graph``) and appends to a repeated
    one (``initializer``), so the file parses as one model. Each tensor is serialised alone.
    """
    large = [Slot(value) for value in model.graph.initializers.values()
             if value.const_value is not None and not isinstance(value.const_value, ir.ExternalTensor)
             and value.const_value.nbytes > _STREAMED]
    with stand_ins(large):  # each dropped from the proto below, and serialised alone
        proto = serialized(model)
    large = [slot.value for slot in large]
    tensors = [value.const_value for value in large]
    check_size(proto.ByteSize() + sum(tensor.nbytes + AROUND_DATA for tensor in tensors), limit)
    names = {value.name for value in large}
    for index in reversed(range(len(proto.graph.initializer))):
        if proto.graph.initializer[index].name in names:
            del proto.graph.initializer[index]
    with open(path, "wb") as file:
        file.write(proto.SerializeToString())
        del proto
        for value, tensor in zip(large, tensors):
            tensor.name = value.name  # as ir.serde does for initializers
            _write_initializer(file, tensor)


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        out.append(number & 0x7F | (0x80 if number > 0x7F else 0))
        number >>= 7
        if not number:
            return bytes(out)


def _field(number: int, length: int) -> bytes:
    """The key and length of a length-delimited protobuf field (wire type 2) of ``length`` bytes."""
    return _varint(number << 3 | 2) + _varint(length)


# Field numbers of onnx.proto: ModelProto.graph, GraphProto.initializer, TensorProto.raw_data.
_GRAPH, _INITIALIZER, _RAW_DATA = 7, 5, 9


def _write_initializer(file, tensor: ir.TensorProtocol) -> None:
    """Append ``tensor`` to ``file`` as a model that holds only it as an initializer.

    Its bytes go from the array to the file (``tofile``): built into a message, they would be in
    memory three times over (the bytes, the field, the serialised message). A tensor whose
    elements are not whole bytes, or a string tensor, is serialised as a message.
    """
    bitwidth = tensor.dtype.bitwidth if tensor.dtype != ir.DataType.STRING else 0
    if not bitwidth or bitwidth % 8:
        piece = onnx.ModelProto()
        ir.serde.serialize_tensor_into(piece.graph.initializer.add(), tensor)
        one_entry_per_key(piece.graph.initializer[0])
        file.write(piece.SerializeToString())
        return
    size = bitwidth // 8 * math.prod(tensor.shape.numpy())
    # Everything but the bytes, from a stand-in that refers to no data.
    head = ir.serde.serialize_tensor(ir.ExternalTensor(
        "", 0, 0, tensor.dtype, shape=tensor.shape, name=tensor.name, doc_string=tensor.doc_string,
        metadata_props=dict(tensor.metadata_props)))
    head.ClearField("data_location")
    head.ClearField("external_data")
    tensor_head = head.SerializeToString() + _field(_RAW_DATA, size)
    initializer = _field(_INITIALIZER, len(tensor_head) + size) + tensor_head
    file.write(_field(_GRAPH, len(initializer) + size) + initializer)
    file.flush()  # tofile writes through the file descriptor
    start = file.tell()
    tensor.tofile(file)
    file.seek(0, os.SEEK_END)
    if file.tell() - start != size:
        raise ValueError(f"the tensor {tensor.name!r} wrote {file.tell() - start} bytes, not {size}")
