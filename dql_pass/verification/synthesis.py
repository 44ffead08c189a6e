"""The model-level input sets that verify synthesizes for ORIGINAL's graph inputs.

Rules:

- a symbolic dimension takes its ``dims`` size, or the size of that dimension in a given input,
  else a default size: one when it is batch-like (its name says batch, or it is the first axis of
  an input of rank 2 or more; the size of a batch-like dimension given, where one is), another for
  the others (an unnamed one or a -1 too); the sets take :data:`MIXED_SIZES` by position, so that a
  rewrite fitted to one size, or wrong at odd sizes or at batch 1 only, fails; :func:`next_sizes`
  says what the sets take where ORIGINAL does not run at those; :func:`chosen_dims` names the
  sizes taken, for the report;
- inputs named like a mask are ones, but in the odd-numbered random sets, where they are padded (along
  the last axis, ones up to a length drawn for each row, then zeros), so that a rewrite that stops
  applying the mask fails; the special sets keep ones (an all-zero input over a zero mask would make
  NaN, where the contract says nothing); a boolean of rank 0 is a flag whatever its name; other
  booleans (If conditions) are True in even-numbered
  sets and False in odd-numbered ones and in the all-zero set, so both branches run; integers named
  like token types or segments are zeros, like positions ``0, 1, ...`` along the last axis, other
  integers (token ids) uniform below the rows of the table they index, where the model tells, else
  below 16;
- ``samples`` seeded random sets, then, when a float input is synthesized, the special sets
  :data:`SPECIAL_SETS`; ``inputs`` replaces any input, with the same array in every set;
- bad ``inputs`` or ``dims``, no input set at all, or more than :data:`MAX_INPUT_BYTES` of inputs
  raise :class:`~dql_pass.errors.InputError`; an input that is not a tensor of a number type
  raises :class:`Unsynthesizable`, for the caller to report the model level as not checked.
"""

from __future__ import annotations

__all__ = [
    "InputSets", "MAX_INPUT_BYTES", "MIXED_SIZES", "SPECIAL_SETS", "Sizes", "Unsynthesizable", "check_dims",
    "chosen_dims", "input_sets", "next_sizes",
]

import math
from collections.abc import Iterator, Mapping, Sequence, Set

import numpy as np
import onnx_ir as ir

from dql_pass.blocking import BLOCK_ELEMENTS
from dql_pass.errors import InputError
from dql_pass.graph.walk import fed_inputs
from dql_pass.op import DOMAINS

Sizes = tuple[int, int]  # the default size of a batch-like dimension, and of any other symbolic one
# Batch 2 catches a batch fixed to 1. 16 for the other dimensions keeps one run of a transformer
# short (docs/BENCHMARKS.md) and still gives a DQL site of hidden size 384 some 12,000 elements;
# the catalogue checks every site on its own besides. The second set takes 3 and 17 (odd, not a
# power of 2), the third batch 1 (where an axis of size 1 gets squeezed away), the others 2 and 16.
MIXED_SIZES: tuple[Sizes, ...] = ((2, 16), (3, 17), (1, 16))
# What the sets take in turn where ORIGINAL does not run at some sizes: the first that has none of
# them (a model that takes even batches only still runs two batch sizes, a U-Net 16 only still two).
_ATTEMPTS: tuple[tuple[Sizes, ...], ...] = (
    MIXED_SIZES, ((2, 16), (4, 16), (1, 16)), ((2, 16), (4, 16)), ((2, 16),), ((1, 16),), ((3, 17),),
)
MAX_INPUT_BYTES = 4 << 30  # every input array verify holds: the synthesized sets and the given arrays
_SET_BYTES = 1 << 10  # what an input set's label, shapes and outputs' bookkeeping hold besides its arrays, at least
SPECIAL_SETS = ("zeros", "negative", "positive", "heavy tails")
_INT_HIGH = 16  # token ids where the model does not tell the size of the table they index
# Ops that hand token ids on unchanged, on the way to the Gather that reads them.
_ID_PASS_THROUGH = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})


class Unsynthesizable(Exception):
    """A model input of a kind verify cannot make (a sequence, an optional, a string tensor)."""


def _batch_like(dim: int | ir.SymbolicDim, axis: int, rank: int) -> bool:
    name = None if isinstance(dim, int) else dim.value
    return (name is not None and "batch" in name.lower()) or (axis == 0 and rank >= 2)


def _is_mask(value: ir.Value) -> bool:
    return "mask" in value.name.lower()


def _dim_size(dim: int | ir.SymbolicDim, axis: int, rank: int, dims: Mapping[str, int], sizes: Sizes) -> int:
    if isinstance(dim, int) and dim >= 0:
        return dim
    name = None if isinstance(dim, int) else dim.value  # exporters write -1 for an unknown size
    if name is not None and name in dims:
        return dims[name]
    return sizes[0] if _batch_like(dim, axis, rank) else sizes[1]


def _shape(value: ir.Value, dims: Mapping[str, int], sizes: Sizes) -> tuple[int, ...]:
    """The shape of a synthesized input; :class:`Unsynthesizable` for an input of another kind."""
    dtype = value.dtype
    if not isinstance(value.type, ir.TensorType) or value.shape is None or not (
        dtype.is_floating_point() or dtype.is_integer() or dtype == ir.DataType.BOOL
    ):
        raise Unsynthesizable(f"cannot synthesize model input {value.name!r} of type {value.type}, "
                              f"shape {value.shape}; give it in inputs")
    return tuple(_dim_size(d, axis, len(value.shape), dims, sizes) for axis, d in enumerate(value.shape))


def _is_op(node: ir.Node, op_type: str) -> bool:
    return node.domain in DOMAINS and node.op_type == op_type


def _first_dim(value: ir.Value) -> int | None:
    """The static size of the first dimension of ``value``, from its shape or its constant."""
    if value.shape is not None and value.shape.rank() and isinstance(value.shape[0], int):
        return value.shape[0]
    if value.const_value is not None and value.const_value.shape.rank():
        return value.const_value.shape[0]
    return None


def _table_rows(value: ir.Value) -> int | None:
    """The rows of the smallest table that ``value`` indexes: Gather's data, reached through casts
    and reshapes, where its first dimension is static."""
    rows, todo = [], [value]
    while todo:
        for usage in todo.pop().uses():
            node = usage.node
            if _is_op(node, "Gather") and usage.idx == 1:
                rows.append(_first_dim(node.inputs[0]))
            elif node.domain in DOMAINS and node.op_type in _ID_PASS_THROUGH and usage.idx == 0:
                todo.extend(node.outputs)
    known = [size for size in rows if size]
    return min(known) if known else None


def _floats(kind: str, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Float draws of ``kind``, made in float64 a block at a time (the same values as one call) and
    stored in ``dtype``: no float64 array of the input's size."""
    data = np.zeros(shape, dtype)
    if kind == "zeros":
        return data
    flat = data.reshape(-1)
    for start in range(0, flat.size, BLOCK_ELEMENTS):
        count = min(BLOCK_ELEMENTS, flat.size - start)
        if kind == "heavy tails":
            block = rng.standard_cauchy(count)  # a tenth of the values beyond ±6, some far beyond
        else:
            block = rng.standard_normal(count)
            block = {"negative": -np.abs(block), "positive": np.abs(block)}.get(kind, block)
        flat[start:start + count] = block
    return data


def _mask(shape: tuple[int, ...], np_type: np.dtype, padded: bool, rng: np.random.Generator) -> np.ndarray:
    """Ones, or (``padded``) as a batch of padded sequences has it: along the last axis, ones up to a length
    drawn for each row from 1 on, zeros after it (no row all zeros, which would mask every position)."""
    mask = np.ones(shape, np_type)
    if padded and shape and shape[-1] > 1:
        lengths = rng.integers(1, shape[-1] + 1, shape[:-1])
        mask[np.arange(shape[-1]) >= lengths[..., None]] = 0
    return mask


def _synthesize(
    value: ir.Value, shape: tuple[int, ...], kind: str, truth: bool, rng: np.random.Generator, high: int
) -> np.ndarray:
    """One input's array, made in its own type (an integer input is drawn in its type, not widened)."""
    dtype = value.dtype
    np_type = dtype.numpy()
    name = value.name.lower()
    if _is_mask(value) and not (dtype == ir.DataType.BOOL and not shape):  # a flag named so: the rule below
        return _mask(shape, np_type, padded=not truth and kind == "sample", rng=rng)
    if dtype == ir.DataType.BOOL:
        return np.full(shape, truth, np_type)  # flags (If conditions) take both values across the sets
    if dtype.is_floating_point():
        return _floats(kind, shape, np_type, rng)
    if "type" in name or "segment" in name:
        return np.zeros(shape, np_type)
    if "position" in name and shape:
        return np.ascontiguousarray(np.broadcast_to(np.arange(shape[-1], dtype=np_type), shape))
    # Below the type's end; NumPy draws no 4- or 2-bit type, so those are drawn in int8 or uint8.
    end = 1 << (dtype.bitwidth - dtype.is_signed())
    drawn = np_type if dtype.bitwidth >= 8 else np.int8 if dtype.is_signed() else np.uint8
    return rng.integers(0, min(high, end), shape, dtype=drawn).astype(np_type, copy=False)


def _given_dims(model: ir.Model, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The sizes that the given arrays fix for the symbolic dimensions of their inputs, so that the
    synthesized inputs agree with them."""
    found: dict[str, int] = {}
    for value in fed_inputs(model.graph):
        array = inputs.get(value.name)
        if array is None or value.shape is None or value.shape.rank() != np.ndim(array):
            continue
        for dim, size in zip(value.shape, np.shape(array)):
            if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
                found.setdefault(dim.value, size)
    return found


def _takes_a_default(value: ir.Value, fixed: Mapping[str, int]) -> bool:
    return value.shape is not None and any(
        isinstance(d, ir.SymbolicDim) and d.value not in fixed or isinstance(d, int) and d < 0 for d in value.shape
    )


def next_sizes(failed: Set[Sizes]) -> tuple[Sizes, ...] | None:
    """The sizes of the sets (see :func:`input_sets`) where ORIGINAL does not run at those in
    ``failed``; None past every attempt."""
    return next((sizes for sizes in _ATTEMPTS if not failed.intersection(sizes)), None)


def _given_batch(graph_inputs: Sequence[ir.Value], fixed: Mapping[str, int]) -> int | None:
    """The size ``fixed`` gives a batch-like dimension: inputs that share the batch may name it apart
    (an exporter's ``batch`` and ``n``), and a default of 1 would broadcast where theirs does not.
    Where a dimension is named batch, only such a one counts (an LSTM's first axis is its sequence)."""
    dims = [(d, axis, len(v.shape)) for v in graph_inputs if v.shape is not None for axis, d in enumerate(v.shape)
            if isinstance(d, ir.SymbolicDim) and d.value]
    named = any("batch" in d.value.lower() for d, _, _ in dims)
    return next((fixed[d.value] for d, axis, rank in dims if d.value in fixed
                 and ("batch" in d.value.lower() if named else _batch_like(d, axis, rank))), None)


def _named_sizes(graph_inputs: Sequence[ir.Value], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """The size each symbolic dimension takes in ``shapes`` (by input name), by its name (an unnamed
    one as ``input[axis]``)."""
    named = {}
    for value in graph_inputs:
        if value.shape is None or value.name not in shapes or len(shapes[value.name]) != value.shape.rank():
            continue
        for axis, (dim, size) in enumerate(zip(value.shape, shapes[value.name])):
            if not (isinstance(dim, int) and dim >= 0):
                named.setdefault((None if isinstance(dim, int) else dim.value) or f"{value.name}[{axis}]", size)
    return named


def chosen_dims(model: ir.Model, feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """The size each symbolic dimension of the model's inputs took in ``feeds``, by its name (an
    unnamed one as ``input[axis]``)."""
    return _named_sizes(fed_inputs(model.graph), {name: np.shape(array) for name, array in feeds.items()})


def _spelled(named: Mapping[str, int]) -> str:
    return ", ".join(f"{name}={size}" for name, size in named.items())


def _check_options(graph_inputs: list[ir.Value], inputs: Mapping[str, np.ndarray], dims: Mapping[str, int]) -> None:
    by_name = {v.name: v for v in graph_inputs}
    for name, array in inputs.items():
        if name not in by_name:
            raise InputError(f"inputs[{name!r}]: ORIGINAL has no input {name!r}; its inputs: {', '.join(by_name)}")
        expected = by_name[name].dtype
        if expected is not None and np.asarray(array).dtype != expected.numpy():
            raise InputError(f"inputs[{name!r}]: the array is {np.asarray(array).dtype}, "
                             f"the input takes {expected.numpy()}")
    check_dims(graph_inputs, dims)


def check_dims(graph_inputs: Sequence[ir.Value], dims: Mapping[str, int], option: str = "dims[{!r}]") -> None:
    """:class:`InputError` for a size in ``dims`` that no dimension of ORIGINAL's ``graph_inputs`` is
    named for; ``option`` spells a name as the caller took it (``--dim {}`` on the command line)."""
    symbols = {d.value: None for v in graph_inputs if v.shape is not None for d in v.shape
               if isinstance(d, ir.SymbolicDim) and d.value}  # in the order the inputs name them
    for name in dims:
        if name not in symbols:
            known = f"its dimensions: {', '.join(symbols)}" if symbols else "it has no named dimension"
            raise InputError(f"{option.format(name)}: no input of ORIGINAL has a dimension named {name!r}; {known}")


def input_sets(
    model: ir.Model, samples: int, seed: int, inputs: Mapping[str, np.ndarray], dims: Mapping[str, int],
    sizes: Sequence[Sizes] = MIXED_SIZES,
) -> InputSets:
    """The input sets by label, each a feed for every graph input of ``model`` (made when asked for);
    a dimension that takes a default size takes ``sizes[i]`` in set ``i``, ``sizes[0]`` past them."""
    graph_inputs = fed_inputs(model.graph)
    _check_options(graph_inputs, inputs, dims)
    by_arrays = _given_dims(model, inputs)
    for name, size in dims.items():
        if by_arrays.get(name, size) != size:
            raise InputError(f"dims[{name!r}] = {size}, but the given input arrays have {name} = {by_arrays[name]}: "
                             "give one size, by the arrays or by dims")
    fixed = {**by_arrays, **dims}
    synthesized = [v for v in graph_inputs if v.name not in inputs]
    batch = _given_batch(graph_inputs, fixed)  # a given batch is every batch-like dimension's
    special = SPECIAL_SETS if any(v.dtype.is_floating_point() and not _is_mask(v) for v in synthesized) else []
    if not samples and not special and synthesized:
        raise InputError("samples=0 leaves no input set: ORIGINAL has no float input for the constructed sets; "
                         "give samples 1 or more")
    count = samples + len(special) if synthesized else 1  # every input given: every set would be the same
    shapes_of = {size: {v.name: _shape(v, fixed, (size[0] if batch is None else batch, size[1])) for v in synthesized}
                 for size in {*sizes[:count], sizes[0]}}
    nbytes = {size: sum(math.prod(shapes[v.name]) * int(v.dtype.itemsize) for v in synthesized)
              for size, shapes in shapes_of.items()}
    # Counted before a set is made, or a label listed: --samples 10**8 of a small input is refused at once.
    made = sum(nbytes[size] for size in sizes[:count]) + max(count - len(sizes), 0) * nbytes[sizes[0]]
    given = sum(np.asarray(array).nbytes for array in inputs.values())
    held = count * _SET_BYTES
    if made + given + held > MAX_INPUT_BYTES:
        raise InputError(
            f"the inputs would need {(made + given + held) / 2**30:.1f} GiB ({count:,} input sets: "
            f"{made / 2**30:.1f} GiB synthesized, {given / 2**30:.1f} GiB given, {held / 2**30:.1f} GiB to keep "
            f"track of the sets), more than the {MAX_INPUT_BYTES >> 30} GiB verify allows; choose smaller dims, "
            "fewer samples or smaller inputs"
        )
    labels = [*(f"sample {i}" for i in range(samples)), *special] if synthesized else ["given inputs"]
    defaults = {label: sizes[i] if i < len(sizes) else sizes[0] for i, label in enumerate(labels)}
    by_label = {label: shapes_of[defaults[label]] for label in labels}
    highs = {v.name: _table_rows(v) or _INT_HIGH for v in synthesized if v.dtype.is_integer()}
    defaulted = any(_takes_a_default(v, fixed) for v in synthesized)
    return InputSets(labels, graph_inputs, inputs, by_label, highs, seed, defaults if defaulted else {})


class InputSets(Mapping[str, dict[str, np.ndarray]]):
    """The input sets by label, each a feed for every graph input, made when asked for and not kept:
    a model-level run holds one set at a time. Set ``i`` is drawn from the generator's state after
    sets ``0 .. i-1``, kept once known, so it has the same values whenever it is made. Where a
    dimension takes a default size, ``sizes`` are the default sizes of each set, by label (empty
    otherwise)."""

    def __init__(self, labels: list[str], graph_inputs: list[ir.Value], given: Mapping[str, np.ndarray],
                 shapes: Mapping[str, Mapping[str, tuple[int, ...]]], highs: Mapping[str, int], seed: int,
                 sizes: Mapping[str, Sizes]):
        self._labels, self._inputs, self._given = labels, graph_inputs, given
        self._shapes, self._highs = shapes, highs
        self.sizes = sizes
        self._states = [np.random.default_rng(seed).bit_generator.state]  # the generator's state before set i

    def __len__(self) -> int:
        return len(self._labels)

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __getitem__(self, label: str) -> dict[str, np.ndarray]:
        if label not in self._labels:
            raise KeyError(label)
        index = self._labels.index(label)
        while len(self._states) <= index:
            self._make(len(self._states) - 1)
        return self._make(index)

    def __contains__(self, label: object) -> bool:
        return label in self._labels

    def _named(self, label: str) -> dict[str, int]:
        return _named_sizes(self._inputs, self._shapes[label])

    def spelled(self, label: str) -> str:
        """The sizes of the symbolic dimensions in set ``label``: ``batch=2, sequence=16``."""
        return _spelled(self._named(label))

    @property
    def notes(self) -> list[str]:
        """What a report should tell of the sets: which took other default sizes than the first."""
        if not self.sizes:
            return []
        first = self._named(self._labels[0])
        varied = {label: {n: size for n, size in self._named(label).items() if first.get(n) != size}
                  for label in self._labels}
        if not any(varied.values()):
            return []
        usual = {n: size for n, size in first.items() if any(n in v for v in varied.values())}
        ran = "; ".join(f"{label} with {_spelled(v)}" for label, v in varied.items() if v)
        return [f"{ran}; the other sets with {_spelled(usual)}: a rewrite fitted to one size fails "
                "(--dim sets a size for every set)"]

    def _make(self, index: int) -> dict[str, np.ndarray]:
        label = self._labels[index]
        rng = np.random.default_rng(0)
        rng.bit_generator.state = self._states[index]
        kind, truth = label if label in SPECIAL_SETS else "sample", index % 2 == 0 and label != "zeros"
        feeds = {
            v.name: np.asarray(self._given[v.name]) if v.name in self._given
            else _synthesize(v, self._shapes[label][v.name], kind, truth, rng, self._highs.get(v.name, _INT_HIGH))
            for v in self._inputs
        }
        if len(self._states) == index + 1:
            self._states.append(rng.bit_generator.state)
        return feeds
