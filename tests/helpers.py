"""Shared test helpers, imported by name: one-node DQL models, the sample models and edits of their
decomposed graphs, sessions through the runtime layer, the skip for a runtime that is not installed,
bitwise comparison."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.backend.test.loader
import onnx.inliner
import onnx_ir as ir
import pytest

import dql_pass
from dql_pass import runtimes
from dql_pass.op import MAX_OPSET, one_node_model


MODELS = Path(__file__).resolve().parent.parent / "models"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def _sample_bytes(name: str) -> bytes:
    return (MODELS / f"{name}.onnx").read_bytes()


def sample(name: str) -> onnx.ModelProto:
    """A fresh copy of models/NAME.onnx (read from disk once)."""
    return onnx.load_from_string(_sample_bytes(name))


def dql_outputs(model: onnx.ModelProto | ir.Model) -> dict[str, list[tuple[str, ...]]]:
    """Graph path -> the output names of its DQL nodes."""
    if isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    return {
        label: sorted(tuple(v.name for v in node.outputs) for node in nodes)
        for label, nodes in dql_pass.find_sites(model).items()
    }


def edit_graph(model: onnx.ModelProto, edit: Callable[[ir.Graph], None]) -> onnx.ModelProto:
    """A copy of ``model`` with ``edit`` applied to its main graph."""
    ir_model = ir.serde.deserialize_model(model)
    edit(ir_model.graph)
    return ir.serde.serialize_model(ir_model)


def site_nodes(graph: ir.Graph, prefix: str = "input_QuantizeLinear/") -> dict[str, ir.Node]:
    """The nodes dql_pass stamped for the DQL named ``input_QuantizeLinear``, by op type and occurrence."""
    nodes: dict[str, ir.Node] = {}
    for node in graph:
        if node.name.startswith(prefix):
            key = node.op_type
            while key in nodes:
                key += "'"
            nodes[key] = node
    return nodes


def without_clip(graph: ir.Graph) -> None:
    """y = Cast(Add(...)) without the Clip to [0, 255] (arithmetic variant): a near miss fusion leaves alone."""
    clip = site_nodes(graph)["Clip"]
    clip.outputs[0].replace_all_uses_with(clip.inputs[0])
    graph.remove(clip, safe=True)


def onnx_body(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every DQL replaced by ONNX's own function body, as onnx's inliner writes it (unguarded)."""
    return onnx.inliner.inline_selected_functions(model, [("", "DynamicQuantizeLinear")], inline_schema_functions=True)


def dql_model(opset: int, rank: int = 1, domain: str = "") -> onnx.ModelProto:
    """A model holding one DynamicQuantizeLinear node on an input of ``rank`` symbolic dims."""
    return one_node_model([f"d{i}" for i in range(rank)], opset, domain=domain)


_TORCHVISION = ("it imports torchvision, which loads only beside torch's CUDA build (5.5 GB), not beside the CPU "
                "wheel of torch 2.13.0 on this machine's disk ('operator torchvision::nms does not exist')")

# Why CI leaves a runtime out of the test extra (pyproject.toml), which installs every other adapter.
LEFT_OUT_OF_CI = {
    "tinygrad": "its CPU device compiles with clang, which pip cannot install (apt-get install clang)",
    "iree": "480 MB and some 45 s of tests, to stay well inside its 10-minute budget",
    "onnx2torch": _TORCHVISION,
    "onnx2pytorch": _TORCHVISION,
    **dict.fromkeys(("litert", "litert-xnnpack"), "onnx2tf's environment takes 660 MB and 80 to 150 s to install, "
                    "and a conversion 1 to 4 s per input shape: python -m tools.runtimes --runtime litert measures it"),
}


def installed(name: str) -> runtimes.Runtime:
    """The runtime ``name``; when it is not installed, the test is skipped, saying how to install it
    and why CI does not."""
    runtime = runtimes.get(name)
    if not runtime.installed():
        why = (f"CI leaves it out: {LEFT_OUT_OF_CI[name]}" if name in LEFT_OUT_OF_CI
               else "CI installs it through the test extra: pip install '.[test]'" if runtime.extra
               else "CI sets it up after the README's test command (.ci/run)")
        pytest.skip(f"{name} is not installed: {runtime.install_hint()} ({why})")
    return runtime


def session(model: onnx.ModelProto | str, *, optimize: bool = True) -> runtimes.Session:
    """One-thread ORT CPU session; ``optimize=False`` runs every node as written (no fusion, no folding)."""
    return runtimes.get("onnxruntime").load(model, threads=1, optimize="all" if optimize else "none")


def assert_outputs_bits_equal(actual, expected) -> None:
    """As many outputs on both sides, each equal in dtype, shape and bits."""
    actual, expected = list(actual), list(expected)
    assert len(actual) == len(expected), (len(actual), len(expected))
    for got, want in zip(actual, expected):
        assert_bits_equal(got, want)


def assert_bits_equal(actual, expected) -> None:
    """Equal dtype, shape and bits (float32 through its uint32 view, so -0.0 and 0.0 differ)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype == np.float32:
        actual, expected = actual.view(np.uint32), expected.view(np.uint32)
    np.testing.assert_array_equal(actual, expected)


@functools.cache
def onnx_node_tests() -> list:
    """ONNX's own DQL node tests (the one-node models, not their ``_expanded`` forms), built by its loader."""
    tests = onnx.backend.test.loader.load_model_tests(kind="node")
    found = [t for t in tests if t.name.startswith("test_dynamicquantizelinear") and "expanded" not in t.name]
    assert len(found) == 3, [t.name for t in found]  # the spec's three examples
    return found


@functools.cache
def newest_ort_opset() -> int:
    """The newest ai.onnx opset at which ORT runs the expanded quantizelinear variant."""
    for opset in range(MAX_OPSET, 10, -1):
        try:
            # The probe asks ORT itself, not the table of what it lacks.
            session(dql_pass.expand(dql_model(opset), runtime=None)[0])
        except runtimes.RuntimeFailure as failure:
            if "NotImplemented" not in str(failure):  # only an opset newer than ORT's kernels is expected
                raise
            continue
        assert opset >= 21, f"the ORT this project needs runs opset 21 and more, not only {opset}"
        return opset
    raise RuntimeError("ORT runs no expanded opset")


@functools.cache
def cached_session(opset: int, rank: int, variant: str | None = None, mode: str = "inline") -> runtimes.Session:
    """ORT session for the one-node model (``variant=None``) or its expansion."""
    model = dql_model(opset, rank)
    return session(model if variant is None else dql_pass.expand(model, variant=variant, mode=mode)[0])


def run_cached(x: np.ndarray, opset: int = 13, variant: str | None = None, mode: str = "inline") -> list:
    return cached_session(opset, x.ndim, variant, mode).run({"x": x})


def site_pairs(model: onnx.ModelProto) -> set[tuple[str, str]]:
    """(input name, y_scale name) of every DQL: the operands of the Div that quantizes x."""
    sites = dql_pass.find_sites(ir.from_proto(model))
    return {(n.inputs[0].name, n.outputs[1].name) for nodes in sites.values() for n in nodes}


def quotients(model: ir.Model, pairs: set[tuple[str, str]]) -> list[ir.Node]:
    return [
        node for node in ir.traversal.RecursiveGraphIterator(model.graph)
        if node.op_type == "Div" and (node.inputs[0].name, node.inputs[1].name) in pairs
    ]


def reciprocal_rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
    """The arithmetic expansion with x * Reciprocal(scale) in place of x / scale."""
    rewritten = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    for div in quotients(rewritten, site_pairs(model)):
        inverse = ir.node("Reciprocal", [div.inputs[1]])
        product = ir.node("Mul", [div.inputs[0], inverse.outputs[0]])
        div.graph.insert_before(div, [inverse, product])
        div.outputs[0].replace_all_uses_with(product.outputs[0])
        div.graph.remove(div, safe=True)
    return ir.to_proto(rewritten)


def constant_node(value: np.ndarray) -> ir.Node:
    return ir.node("Constant", [], attributes={"value": ir.tensor(value)})


def round_half_up(graph: ir.Graph) -> None:
    """Every Round of ``graph`` replaced by Floor(v + 0.5): ties round up, not to even."""
    for node in list(graph):
        if node.op_type == "Round":
            half = constant_node(np.float32(0.5))
            shifted = ir.node("Add", [node.inputs[0], half.outputs[0]])
            floored = ir.node("Floor", [shifted.outputs[0]])
            graph.insert_before(node, [half, shifted, floored])
            node.outputs[0].replace_all_uses_with(floored.outputs[0])
            graph.remove(node, safe=True)


def value_map(model: ir.Model) -> dict[str, ir.Value]:
    values = {v.name: v for v in model.graph.inputs}
    values.update((v.name, v) for node in model.graph for v in node.outputs)
    return values


def dangling_dql_rewrite(model: onnx.ModelProto, *, half_up: bool = True) -> onnx.ModelProto:
    """The arithmetic expansion with its DQL outputs renamed (the readers follow), and the original
    DQL nodes kept under the old names, read by nothing; ``half_up`` breaks the expansion's rounding."""
    rewritten = ir.from_proto(dql_pass.expand(model, variant="arithmetic")[0])
    if half_up:
        round_half_up(rewritten.graph)
    values = value_map(rewritten)
    for nodes in dql_pass.find_sites(ir.from_proto(model)).values():
        for site in nodes:
            dangling = ir.node("DynamicQuantizeLinear", [values[site.inputs[0].name]], num_outputs=3, name=site.name)
            for copy, output in zip(dangling.outputs, site.outputs):
                values[output.name].name = f"{output.name}_computed"
                copy.name = output.name
            rewritten.graph.append(dangling)
    return ir.to_proto(rewritten)
