"""Run an expanded DynamicQuantizeLinear as a GPU may: a worst-case divider, fused products and
flushed subnormals, on ``onnx.reference`` with NumPy, deterministically.

The freedoms, each optional:

- ``moves=m``: every float32 Div returns the correctly rounded quotient moved by up to ``m`` ulp,
  the amount (``-m`` to ``m``) picked by a hash of both operands' bits, so that the same division
  always gives the same answer. WGSL allows 2.5 ulp from the exact quotient; 3 from the correctly
  rounded one covers it. Infinite and NaN quotients stay; a finite one never becomes infinite.
- ``fused=True``: every Add or Sub that reads a Mul's output reads the exact product instead, one
  rounding for both (an FMA), as a compiler that contracts ``a * b + c`` computes it; so does every
  Gemm (each is an outer product plus C, K = 1).
- ``flush=True``: x and every float32 value computed are flushed to zero when subnormal (FTZ and
  DAZ), sign kept.

``python -m tools.gpu_divider`` prints, per variant, how many inputs of the catalogue, its large
cases and seeded random ones each setting keeps bit-exact against the reference.
"""

from __future__ import annotations

__all__ = ["SUBNORMAL", "FREEDOMS", "exact_inputs", "freed", "run", "subnormal_input"]

import argparse
import functools
import logging
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.reference
from onnx import helper
from onnx.reference.op_run import OpRun

from dql_pass import decomposition
from dql_pass.inputs import cases, large_cases
from dql_pass.compare import compare_site
from dql_pass.api import expand
from dql_pass.op import MAX_OPSET, VARIANTS, one_node_model
from dql_pass.reference import dynamic_quantize_linear

logger = logging.getLogger(__name__)
_DOMAIN = "gpu_divider"
_SMALLEST_NORMAL = np.float32(2.0**-126)
SUBNORMAL = "subnormal x or y_scale"  # the inputs a flushing runtime cannot get right
# The settings main() reports, by name.
FREEDOMS: dict[str, dict] = {
    "exact": {},
    "Div +-1 ulp": {"moves": 1},
    "Div +-3 ulp": {"moves": 3},
    "Div +-3 ulp, fused": {"moves": 3, "fused": True},
    "Div +-3 ulp, fused, flushed": {"moves": 3, "fused": True, "flush": True},
}


def _moved(quotient: np.ndarray, a: np.ndarray, b: np.ndarray, moves: int) -> np.ndarray:
    """``quotient`` moved by a hash of a's and b's bits, from ``-moves`` to ``moves`` ulp."""
    a_bits, b_bits = (np.broadcast_to(v, quotient.shape).view(np.uint32).astype(np.uint64) for v in (a, b))
    with np.errstate(over="ignore"):
        mixed = ((a_bits * np.uint64(0x9E3779B97F4A7C15))
                 ^ ((b_bits + np.uint64(0x632BE59BD9B4E019)) * np.uint64(0xC2B2AE3D27D4EB4F)))
    step = ((mixed >> np.uint64(33)) % np.uint64(2 * moves + 1)).astype(np.int64) - moves
    bits = quotient.view(np.int32).astype(np.int64)
    # Floats in order as integers: -0 and +0 both 0, each step one ulp.
    ordered = np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    largest = np.int64(np.float32(np.finfo(np.float32).max).view(np.int32))
    shifted = np.clip(ordered + step, -largest, largest)
    moved = np.where(shifted < 0, (-shifted) | 0x80000000, shifted).astype(np.uint32).view(np.float32)
    return np.where(np.isfinite(quotient) & (step != 0), moved, quotient)


class Div(OpRun):  # named as the op it runs
    op_domain = _DOMAIN

    def _run(self, a, b, moves=None):
        with np.errstate(all="ignore"):
            quotient = np.divide(a, b)
        if quotient.dtype == np.float32 and moves:
            quotient = _moved(np.asarray(quotient), np.asarray(a), np.asarray(b), moves)
        return (np.asarray(quotient),)


class Fused(OpRun):
    """``a * b + c`` (sign 1) or ``c - a * b`` (sign -1), or ``a * b - c`` (sign 1, negate_c 1), rounded once."""

    op_domain = _DOMAIN

    def _run(self, a, b, c, sign=None, negate_c=None):
        if a.dtype != np.float32:
            raise TypeError("fused products are float32 only")
        with np.errstate(all="ignore"):
            product = a.astype(np.float64) * b.astype(np.float64) * sign  # exact: 48 bits
            addend = c.astype(np.float64) * (-1.0 if negate_c else 1.0)
            total = product + addend
            # TwoSum: total + error is the exact sum; only a total on a float32 midpoint needs it.
            back = total - product
            error = (product - (total - back)) + (addend - back)
            rounded = total.astype(np.float32)
            other = np.nextafter(rounded, np.where(total > rounded, np.float32(np.inf), np.float32(-np.inf)))
            midpoint = (rounded.astype(np.float64) + other.astype(np.float64)) / 2
            on_midpoint = np.isfinite(total) & (total == midpoint) & (total != rounded) & (error != 0)
            toward = np.where(error > 0, np.maximum(rounded, other), np.minimum(rounded, other))
        return (np.asarray(np.where(on_midpoint, toward, rounded), np.float32),)


class Flush(OpRun):
    op_domain = _DOMAIN

    def _run(self, v):
        if v.dtype != np.float32:
            return (v,)
        with np.errstate(invalid="ignore"):
            tiny = np.abs(v) < _SMALLEST_NORMAL
        return (np.where(tiny, np.copysign(np.float32(0), v), v).astype(np.float32),)


def _fuse(graph: onnx.GraphProto) -> None:
    """Every Add or Sub reading a float Mul's output, and every Gemm, becomes one fused node."""
    products = {n.output[0]: n for n in graph.node if n.op_type == "Mul" and n.domain == ""}
    nodes = []
    for node in graph.node:
        readers = [i for i, name in enumerate(node.input) if name in products] if node.op_type in ("Add", "Sub") else []
        if node.domain != "" or not readers:
            nodes.append(node)
            continue
        index = readers[0]
        product, addend = products[node.input[index]], node.input[1 - index]
        # Add: p + c; Sub(p, c): p - c; Sub(c, p): c - p.
        sign = -1 if (node.op_type == "Sub" and index == 1) else 1
        negate_c = node.op_type == "Sub" and index == 0
        nodes.append(helper.make_node("Fused", [*product.input, addend], list(node.output),
                                      domain=_DOMAIN, sign=sign, negate_c=int(negate_c), name=node.name))
    del graph.node[:]
    graph.node.extend(nodes)
    # A Gemm of [1, 1] by [1, n] (K = 1, alpha +-1, beta 1) is c +- a * b: fused, one rounding.
    for node in graph.node:
        if node.op_type == "Gemm" and node.domain == "":
            alpha = {a.name: helper.get_attribute_value(a) for a in node.attribute}.pop("alpha", 1.0)
            assert {a.name for a in node.attribute} <= {"alpha"} and alpha in (1.0, -1.0), "not a fused product"
            node.op_type, node.domain = "Fused", _DOMAIN
            del node.attribute[:]
            node.attribute.extend([helper.make_attribute("sign", int(alpha)), helper.make_attribute("negate_c", 0)])


def _flush(graph: onnx.GraphProto) -> None:
    """x, the constants and every node output pass through a flush to zero."""
    sources = [v.name for v in graph.input] + [t.name for t in graph.initializer]
    nodes = [helper.make_node("Flush", [name], [f"{name}__flushed"], domain=_DOMAIN) for name in sources]
    flushed = {name: f"{name}__flushed" for name in sources}
    for node in graph.node:
        inputs = [flushed.get(i, i) for i in node.input]
        outputs = list(node.output)
        raw = [f"{o}__raw" if o else o for o in outputs]
        del node.input[:], node.output[:]
        node.input.extend(inputs)
        node.output.extend(raw)
        nodes.append(node)
        nodes.extend(helper.make_node("Flush", [r], [o], domain=_DOMAIN) for r, o in zip(raw, outputs) if o)
    del graph.node[:]
    graph.node.extend(nodes)


def freed(model: onnx.ModelProto, *, moves: int = 0, fused: bool = False, flush: bool = False) -> onnx.ModelProto:
    """``model`` (inline, no subgraphs) with its float divisions, fused sums and flushes as the freedoms ask."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    for node in graph.node:
        if node.op_type == "Div" and node.domain == "":
            node.domain = _DOMAIN
            node.attribute.append(helper.make_attribute("moves", moves))
    if fused:
        _fuse(graph)
    if flush:
        _flush(graph)
    model.opset_import.append(helper.make_opsetid(_DOMAIN, 1))
    return model


@functools.cache
def _evaluator(variant: str, rank: int, zero_range: str, moves: int, fused: bool, flush: bool):
    model = expand(one_node_model([f"d{i}" for i in range(rank)], MAX_OPSET), variant=variant, zero_range=zero_range,
                   runtime=None)[0]
    return onnx.reference.ReferenceEvaluator(freed(model, moves=moves, fused=fused, flush=flush),
                                             new_ops=[Div, Fused, Flush])


def run(variant: str, x: np.ndarray, zero_range: str = "onnxruntime", **freedoms) -> list[np.ndarray]:
    """y, y_scale and y_zero_point of ``variant`` on ``x`` under ``freedoms`` (see :func:`freed`)."""
    key = (freedoms.get("moves", 0), freedoms.get("fused", False), freedoms.get("flush", False))
    with np.errstate(all="ignore"):
        return _evaluator(variant, x.ndim, zero_range, *key).run(None, {"x": x})


def subnormal_input(x: np.ndarray) -> bool:
    """Whether x or its y_scale is subnormal: what a flushing runtime cannot compute."""
    with np.errstate(invalid="ignore"):
        tiny = lambda v: bool(np.any((v != 0) & (np.abs(v) < _SMALLEST_NORMAL)))  # noqa: E731
        return tiny(x) or tiny(dynamic_quantize_linear(x)[1])


def exact_inputs(
    variant: str, inputs: Sequence[np.ndarray], zero_range: str = "onnxruntime", **freedoms
) -> tuple[int, list[int]]:
    """How many ``inputs`` ``variant`` gets bit-exact under ``freedoms``, and the indices it does not.

    With ``flush``, inputs with a subnormal x or y_scale are left out of both (see :data:`SUBNORMAL`).
    """
    exact, wrong = 0, []
    for index, x in enumerate(inputs):
        if freedoms.get("flush") and subnormal_input(x):
            continue
        if compare_site(run(variant, x, zero_range, **freedoms), dynamic_quantize_linear(x, zero_range)) is None:
            exact += 1
        else:
            wrong.append(index)
    return exact, wrong


def default_inputs(random_count: int = 200) -> list[np.ndarray]:
    """The catalogue's comparable inputs with ``random_count`` seeded random ones, and verify's large cases."""
    catalogue = [c for c in cases(random_count=random_count) if c.comparable]
    return [c.x for c in catalogue + large_cases()]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", choices=VARIANTS, help="default: every variant")
    parser.add_argument("--random", type=int, default=200, help="seeded random inputs beside the catalogue")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    inputs = default_inputs(args.random)
    flushable = sum(not subnormal_input(x) for x in inputs)
    logger.info("%d inputs (%d without a subnormal x or y_scale)", len(inputs), flushable)
    for variant in args.variant or VARIANTS:
        counts = []
        for name, freedoms in FREEDOMS.items():
            exact, _ = exact_inputs(variant, inputs, **freedoms)
            counts.append(f"{name}: {exact}/{flushable if freedoms.get('flush') else len(inputs)}")
        logger.info("%-14s %3d nodes  %s", variant, decomposition.variant(variant).nodes, "; ".join(counts))


if __name__ == "__main__":
    main()
