"""Checking what REWRITTEN computes in place of the integer ops of ORIGINAL that it no longer has.

Rules:

- a lowered site is a MatMulInteger, ConvInteger, QuantizeLinear or DequantizeLinear node of
  ORIGINAL (ai.onnx; main graph, subgraphs, functions) whose output no node of the same type
  makes in REWRITTEN: a rewrite replaced it, by dql_pass or any other tool;
- its replacement is REWRITTEN's computation of the value named like that output, walked back to
  the values named like the node's inputs that are not constant in ORIGINAL (as
  :mod:`dql_pass.verification.extract` walks a DQL site); one that needs any other value is not
  reachable, and the verdict INCOMPLETE, never PASS; a REWRITTEN without that value has lost it;
- the replacement runs on the runtime against the int64 NumPy reference
  (:mod:`dql_pass.reference`) with ORIGINAL's constants (weights, scales, zero points) and
  synthesized operands: all zero, all at the type's maximum and minimum, zero points at both ends,
  rows that drive each output column to its largest reachable sum, and random ones; every case
  must match in type, shape and bits; the replacement's inputs declare the operands' shapes (a
  runtime may need their rank); one that another runtime cannot load runs on ORT, and what that
  runtime cannot load or run is reported not checked there, with its reason;
- operands whose shape cannot be told (a non-constant weight of unknown shape) are not checked,
  with the reason: INCOMPLETE.
"""

from __future__ import annotations

__all__ = ["LoweredSite", "check_lowered", "lowered_sites"]

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import onnx_ir as ir

from dql_pass import reference, runtimes
from dql_pass.compare import bit_difference
from dql_pass.lowering import LOWERED
from dql_pass.lowering.rules import constant, element_type
from dql_pass.modelfiles import one_line
from dql_pass.op import DOMAINS
from dql_pass.verification.extract import NotReachable, Scopes, _live, walk
from dql_pass.verification.report import SiteResult
from dql_pass.walk import called_functions, graph_scopes

logger = logging.getLogger(__name__)

Cases = Iterator[tuple[str, str, list[np.ndarray | None]]]  # name, class, one array per input (None: absent)


@dataclasses.dataclass(frozen=True)
class LoweredSite:
    """An integer op of ORIGINAL: where it is, its input names (None: absent), the arrays of its
    constant inputs, the types and static shapes of the others, and its attributes."""

    name: str
    graph: str
    op_type: str
    output: str
    inputs: tuple[str | None, ...]
    constants: tuple[np.ndarray | None, ...]
    types: tuple[ir.DataType | None, ...]
    shapes: tuple[tuple[int, ...] | None, ...]
    attributes: dict[str, object]
    live: bool
    # ORIGINAL's nodes in the same graph that read the output: (op type, their output names, input index).
    readers: tuple[tuple[str, tuple[str, ...], int], ...] = ()


class _Unsynthesizable(Exception):
    """Operands for the site cannot be made."""


def _static(value: ir.Value) -> tuple[int, ...] | None:
    shape = value.shape
    return tuple(shape) if shape is not None and all(isinstance(d, int) for d in shape) else None


def _types(node: ir.Node) -> tuple[ir.DataType | None, ...]:
    types = [None if v is None else element_type(v) for v in node.inputs]
    if node.op_type != "QuantizeLinear":  # an integer operand and its zero point share a type
        for i in range(min(2, len(types) - 2)):
            types[i] = types[i] or types[i + 2]
    return tuple(types)


def lowered_sites(original: ir.Model) -> list[LoweredSite]:
    """Every integer op of ORIGINAL that a rewrite may lower."""
    live = _live(original)[0]
    sites = []
    for graph, (label, _) in graph_scopes(original).items():
        for node in graph:
            if node.domain not in DOMAINS or node.op_type not in LOWERED or len(node.outputs) != 1:
                continue
            inputs = list(node.inputs)
            sites.append(LoweredSite(
                f"{node.op_type} {node.name or node.outputs[0].name!r}", label, node.op_type, node.outputs[0].name,
                tuple(None if v is None else v.name for v in inputs),
                tuple(constant(v) for v in inputs),
                _types(node),
                tuple(None if v is None else _static(v) for v in inputs),
                {name: attr.value for name, attr in node.attributes.items()},
                node in live,
                tuple((use.node.op_type, tuple(v.name for v in use.node.outputs), use.idx)
                      for use in node.outputs[0].uses() if use.node.graph is graph),
            ))
    return sites


def _fed(site: LoweredSite) -> list[int]:
    """The positions of the site's inputs that are not constant in ORIGINAL: the extracted model's inputs."""
    return [i for i, (name, array) in enumerate(zip(site.inputs, site.constants)) if name is not None and array is None]


def _read(values: dict[str, ir.Value], site: LoweredSite) -> ir.Value:
    """The value REWRITTEN's readers of the site read: where ORIGINAL's reader is still there (same
    type and output names), what it reads in the site's place, else the value of the site's name.
    A value that only keeps the name, read by nothing that matters, is not what gets checked."""
    read = {
        node.inputs[index]
        for op_type, outputs, index in site.readers
        if (node := values[outputs[0]].producer() if outputs and outputs[0] in values else None) is not None
        and node.op_type == op_type and tuple(v.name for v in node.outputs) == outputs and index < len(node.inputs)
    }
    if len(read) > 1:
        raise NotReachable("REWRITTEN's readers of its output read different values")
    return read.pop() if read and None not in read else values[site.output]


def _replacement(model: ir.Model, scopes: Scopes, site: LoweredSite) -> ir.Model | None:
    """REWRITTEN's computation of the site's output from its non-constant inputs, as a model whose
    inputs are those in order; None when REWRITTEN still runs the op itself."""
    graph = scopes.counterpart(site.graph, [site.output], site.live)
    if graph is None:
        raise NotReachable(f"no graph of REWRITTEN{' that its outputs depend on' if site.live else ''} "
                           f"holds {site.output!r}")
    output = _read(scopes.values[graph], site)
    producer = output.producer()
    if producer is not None and producer.op_type == site.op_type and producer.domain in DOMAINS:
        return None
    fed = _fed(site)
    names = [site.inputs[i] for i in fed]
    found, nodes, constants = walk([output], set(names))
    inputs = [found.get(name) or ir.Value(name=name) for name in names]  # an input it ignores is still fed
    if output in inputs:
        raise NotReachable("its output is one of its inputs")
    view = ir.GraphView(inputs, [output], nodes=nodes, initializers=constants)
    functions = [model.functions[key].clone() for key in sorted(called_functions(model, view))]
    view.opset_imports = {**graph.opset_imports, **model.opset_imports}
    body = view.clone()
    for k, (value, i) in enumerate(zip(body.inputs, fed)):
        if site.types[i] is None:
            raise _Unsynthesizable(f"the type of {site.inputs[i]!r} is unknown")
        value.name, value.shape, value.type = f"input{k}", None, ir.TensorType(site.types[i])
    body.outputs[0].name = "output"
    for value in [*body.outputs, *(v for node in body for v in node.outputs)]:
        value.shape = None  # the model's shapes do not hold for synthesized operands
    return ir.Model(body, ir_version=model.ir_version, functions=functions)


# -- operands --------------------------------------------------------------------------------------


def _integers(dtype: ir.DataType, shape: Sequence[int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """All zero, all at the type's ends, and random."""
    np_type = dtype.numpy()
    info = np.iinfo(np_type)
    return {"zero": np.zeros(shape, np_type), "max": np.full(shape, info.max, np_type), "min": np.full(shape, info.min, np_type),
            "random": rng.integers(info.min, int(info.max) + 1, shape).astype(np_type)}


def _zero_points(dtype: ir.DataType, rng: np.random.Generator) -> list[np.ndarray]:
    info = np.iinfo(dtype.numpy())
    return [np.array(v, dtype.numpy()) for v in (info.min, info.max, rng.integers(info.min, int(info.max) + 1))]


def _known(site: LoweredSite, index: int, fallback: Callable[[], tuple[int, ...] | None]) -> tuple[int, ...]:
    shape = site.shapes[index] if site.constants[index] is None else site.constants[index].shape
    shape = shape or fallback()
    if shape is None:
        raise _Unsynthesizable(f"the shape of {site.inputs[index]!r} is unknown")
    return shape


def _product_cases(site: LoweredSite, rng: np.random.Generator) -> Cases:
    """MatMulInteger and ConvInteger: inputs (activation, weight, activation zero point, weight zero point)."""
    a_type, w_type = site.types[:2]
    if a_type is None or w_type is None:
        raise _Unsynthesizable("an operand's type is unknown")
    weights = site.constants[1]
    conv = site.op_type == "ConvInteger"
    if conv:
        w_shape = _known(site, 1, lambda: None)
        group = int(site.attributes.get("group", 1))
        side = [2 * k + 1 for k in w_shape[2:]]
        a_shape = _known(site, 0, lambda: (2, w_shape[1] * group, *side))
    else:
        a_shape = _known(site, 0, lambda: None if site.shapes[1] is None and weights is None
                         else (4, (weights.shape if weights is not None else site.shapes[1])[-2]))
        w_shape = _known(site, 1, lambda: (a_shape[-1], 5))
    names, constants = [*site.inputs, None, None][:4], [*site.constants, None, None][:4]
    activations = _integers(a_type, a_shape, rng)
    if weights is not None and not conv and len(a_shape) == 2:
        # Each row drives one output column to its largest reachable sum: the activation at the
        # type's end where the centred weight has that sign (the zero points cover both ends).
        info = np.iinfo(a_type.numpy())
        centred = weights.astype(np.int64) - (0 if constants[3] is None else constants[3].astype(np.int64))
        columns = np.resize(np.arange(centred.shape[-1]), a_shape[0])
        activations["bound"] = np.where(centred[:, columns].T >= 0, info.max, info.min).astype(a_type.numpy())
    weight_sets = {"constant": weights} if weights is not None else _integers(w_type, w_shape, rng)

    def points(index: int, dtype: ir.DataType) -> list[np.ndarray | None]:
        """A zero point's values: absent, ORIGINAL's constant, or both ends of the type and a random one."""
        if names[index] is None or constants[index] is not None:
            return [constants[index]]
        return _zero_points(dtype, rng)

    for (a_class, a), (w_class, w) in zip(activations.items(), _cycle(weight_sets, len(activations))):
        w_points = points(3, w_type)
        for k, a_zp in enumerate(points(2, a_type)):
            w_zp = w_points[k % len(w_points)]
            yield f"{a_class} activations, zero point {a_zp}, {w_class} weights", a_class, [a, w, a_zp, w_zp][: len(site.inputs)]


def _cycle(items: dict[str, np.ndarray], count: int) -> list[tuple[str, np.ndarray]]:
    pairs = list(items.items())
    return [pairs[i % len(pairs)] for i in range(count)]


def _quantization_cases(site: LoweredSite, rng: np.random.Generator) -> Cases:
    """QuantizeLinear and DequantizeLinear: x, with ORIGINAL's constant scale and zero point."""
    scale = site.constants[1]
    if scale is None or (len(site.inputs) > 2 and site.inputs[2] is not None and site.constants[2] is None):
        raise _Unsynthesizable("its scale or zero point is not constant in ORIGINAL")
    axis = int(site.attributes.get("axis", 1))
    per_axis = scale.size > 1
    shape = _known(site, 0, lambda: (3, scale.size, 5) if per_axis and axis in (1, -2) else None if per_axis else (64,))
    if site.op_type == "DequantizeLinear":
        for label, x in _integers(site.types[0], shape, rng).items():
            yield label, label, [x, scale, *site.constants[2:]]
        return
    size = int(np.prod(shape))
    steps = scale.reshape(-1)[0] * np.arange(-300, 300, 0.5, dtype=np.float32)  # ties of x / scale, and past both ends
    specials = np.array([0, -0.0, np.inf, -np.inf, 1e30, -1e30, 1e-40], np.float32)
    for label, x in {"ties": np.resize(steps, size), "specials": np.resize(specials, size),
                     "random": rng.standard_normal(size).astype(np.float32) * 100, "zero": np.zeros(size, np.float32)}.items():
        yield label, label, [x.astype(np.float32).reshape(shape), scale, *site.constants[2:]]


def _expected(site: LoweredSite, arrays: list[np.ndarray | None]) -> np.ndarray:
    attributes = site.attributes
    if site.op_type == "MatMulInteger":
        return reference.matmul_integer(*arrays)
    if site.op_type == "ConvInteger":
        spatial = arrays[0].ndim - 2
        pads = attributes.get("pads")
        if attributes.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            pads = _same_pads(arrays[0].shape[2:], arrays[1].shape[2:], attributes, attributes["auto_pad"])
        return reference.conv_integer(
            *arrays, pads=pads, strides=attributes.get("strides"), dilations=attributes.get("dilations"),
            group=int(attributes.get("group", 1)),
        ) if spatial else reference.conv_integer(*arrays)
    axis = int(attributes.get("axis", 1))
    if site.op_type == "QuantizeLinear":
        dtype = ir.DataType(attributes.get("output_dtype") or ir.DataType.UINT8).numpy()
        return reference.quantize_linear(*arrays, axis=axis, dtype=dtype)
    return reference.dequantize_linear(*arrays, axis=axis)


def _same_pads(sizes, kernel, attributes, mode: str) -> list[int]:
    """Explicit pads of auto_pad SAME_UPPER / SAME_LOWER, as ONNX defines them."""
    strides = attributes.get("strides") or [1] * len(sizes)
    dilations = attributes.get("dilations") or [1] * len(sizes)
    begins, ends = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if mode == "SAME_UPPER" else large)
        ends.append(large if mode == "SAME_UPPER" else small)
    return begins + ends


def _declare_shapes(model: ir.Model, operands: Sequence[Sequence[np.ndarray]]) -> None:
    """Give the replacement's inputs the shapes of the operands fed to them (a dimension that varies
    is symbolic): a runtime may need an input's rank to read the model (OpenVINO's Conv does)."""
    for k, value in enumerate(model.graph.inputs):
        shapes = {np.shape(arrays[k]) for arrays in operands}
        if len({len(shape) for shape in shapes}) == 1:
            value.shape = ir.Shape([
                sizes.pop() if len(sizes := {shape[axis] for shape in shapes}) == 1 else f"input{k}_{axis}"
                for axis in range(len(next(iter(shapes))))
            ])


def _session(
    model: ir.Model, runtime: runtimes.Runtime
) -> tuple[runtimes.Session | None, runtimes.Runtime, str | None]:
    """The replacement loaded on ``runtime``, else on ORT, with the runtime and why it is not checked
    on ``runtime``; no session when ORT, which runs the ops as ONNX defines them, cannot load it either."""
    try:
        return runtime.load(model, threads=1, optimize="basic"), runtime, None
    except runtimes.RuntimeFailure as error:
        reason = f"{runtime.name} cannot load the replacement: {one_line(error)}"
    ort = runtimes.get("onnxruntime")
    if runtime is ort:
        return None, ort, reason
    try:
        return ort.load(model, threads=1, optimize="basic"), ort, f"{reason}; checked on onnxruntime only"
    except runtimes.RuntimeFailure as error:
        return None, ort, f"{reason}; onnxruntime cannot load it either: {one_line(error)}"


def _check(site: LoweredSite, model: ir.Model, runtime: runtimes.Runtime, rng: np.random.Generator) -> SiteResult:
    result = SiteResult(site.name, site.graph, model_level="lowered op: its replacement checked against the int64 "
                        "reference; the final outputs at the model level")
    cases = list((_product_cases if site.op_type in ("MatMulInteger", "ConvInteger") else _quantization_cases)(site, rng))
    fed = _fed(site)
    _declare_shapes(model, [[arrays[i] for i in fed] for _, _, arrays in cases])
    session, runtime, reason = _session(model, runtime)
    if session is None:
        result.mismatches, result.detail = 1, reason
        return result
    result.not_checked = reason
    for name, category, arrays in cases:
        expected = _expected(site, arrays)
        try:
            (actual,) = session.run({f"input{k}": arrays[i] for k, i in enumerate(fed)})
            difference = bit_difference("output", actual, expected)
            problem = None if difference is None else difference.text
        except runtimes.RuntimeFailure as error:
            if runtime.name != "onnxruntime":  # another runtime's refusal of a piece: not checked there
                result.not_checked = result.not_checked or f"{runtime.name} cannot run case {name}: {one_line(error)}"
                continue
            problem = f"{runtime.name} failed: {one_line(error)}"  # an operand ORT cannot run is a mismatch
        result.cases += 1
        if problem is not None:
            result.mismatches += 1
            result.classes[category] = result.classes.get(category, 0) + 1
            if result.worst_case is None:
                result.worst_case, result.worst_class, result.detail = name, category, problem
    return result


def check_lowered(original: ir.Model, rewritten: ir.Model, seed: int, runtime: runtimes.Runtime) -> list[SiteResult]:
    """One row per integer op of ORIGINAL that REWRITTEN replaced, its replacement run on ``runtime``
    against the reference."""
    scopes = Scopes(rewritten)
    rng = np.random.default_rng(seed)
    results = []
    for site in lowered_sites(original):
        try:
            model = _replacement(rewritten, scopes, site)
            if model is None:
                continue  # REWRITTEN runs the op itself: the model level compares it
            results.append(_check(site, model, runtime, rng))
        except (NotReachable, _Unsynthesizable) as reason:
            results.append(SiteResult(site.name, site.graph, not_reachable=str(reason),
                                      model_level="lowered op: not checked against the reference"))
    logger.info("%d lowered ops of ORIGINAL checked against the reference", len(results))
    return results
