"""The graph helpers and the one slice, reader match and tally that DQL sites and lowered sites share."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

import dql_pass
from dql_pass import runtimes
from dql_pass.graph.walk import ops_used
from dql_pass.lowering.rules import RULES
from dql_pass.verification.extract import Scopes
from dql_pass.verification.lowered import _check, _replacement, check_lowered, lowered_sites
from helpers import sample

ORT = runtimes.get("onnxruntime")


def _with_quantize(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with a QuantizeLinear of its input ``x`` in the main graph, output ``q``."""
    model.graph.initializer.extend([numpy_helper.from_array(np.array(0.5, np.float32), "q_scale"),
                                    numpy_helper.from_array(np.array(3, np.uint8), "q_zero_point")])
    model.graph.node.append(helper.make_node("QuantizeLinear", ["x", "q_scale", "q_zero_point"], ["q"],
                                             name="quantize"))
    model.graph.output.append(helper.make_tensor_value_info("q", TensorProto.UINT8, None))
    return model


def test_a_lowered_site_model_imports_only_the_domains_it_uses():
    # control_flow imports `local` for its FakeQuant function; the QuantizeLinear's replacement
    # uses none of it, and tinygrad refuses a model for an import it cannot parse.
    original = ir.from_proto(_with_quantize(sample("control_flow")))
    assert "local" in original.opset_imports
    rewritten, _ = dql_pass.lower(ir.from_proto(_with_quantize(sample("control_flow"))))
    (site,) = lowered_sites(original)
    replacement = _replacement(rewritten, Scopes(rewritten), site)
    assert replacement is not None
    model = replacement.model
    used = {domain for domain, _ in ops_used(model)}
    assert set(model.opset_imports) == {""} | used
    assert "local" not in model.opset_imports


def _reader_in_another_domain() -> tuple[ir.Model, ir.Model]:
    """ORIGINAL: q = QuantizeLinear(x), read by Identity; REWRITTEN: q lowered (and an output, so that
    it stays live), and in the Identity's place a ``custom`` Identity of the same output name that
    reads a wrong value."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])
    out = helper.make_tensor_value_info("out", TensorProto.UINT8, [8])
    original = helper.make_model(helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["q"], name="quantize"),
         helper.make_node("Identity", ["q"], ["out"], name="read")],
        "g", [x], [out],
        [numpy_helper.from_array(np.array(0.5, np.float32), "scale"),
         numpy_helper.from_array(np.array(3, np.uint8), "zero_point")],
    ), opset_imports=[helper.make_opsetid("", 21)])
    rewritten, _ = dql_pass.lower(ir.from_proto(original))
    graph = rewritten.graph
    (reader,) = [node for node in graph if node.op_type == "Identity" and node.outputs[0].name == "out"]
    wrong = ir.node("Cast", [graph.inputs[0]], attributes={"to": ir.DataType.UINT8})
    custom = ir.Node("custom", "Identity", [wrong.outputs[0]], name="read")
    graph.insert_before(reader, [wrong, custom])
    graph.outputs[0] = custom.outputs[0]
    graph.remove(reader, safe=True)
    custom.outputs[0].name = "out"
    graph.outputs.append(next(v for node in graph for v in node.outputs if v.name == "q"))
    rewritten.opset_imports["custom"] = 1
    return ir.from_proto(original), rewritten


def test_a_reader_in_another_domain_is_not_matched():
    original, rewritten = _reader_in_another_domain()
    (row,) = check_lowered(original, rewritten, 0, ORT)
    # The custom Identity is not ORIGINAL's reader: what is checked is the value named q, the
    # lowering, which is exact; matched on op_type alone, the Cast it reads failed.
    assert row.not_reachable is None
    assert row.cases > 0 and row.mismatches == 0, row.detail


class _Wrong:
    """A runtime that gives the reference with case ``i``'s first ``i`` elements off by one, and
    case 2 in int8: case 1 differs first, case 2 differs worst (a wrong type)."""

    name = "wrong"

    def __init__(self, expected: list[np.ndarray]):
        self.expected = iter(expected)
        self.calls = 0

    def load(self, model: ir.Model, **_: object) -> _Wrong:
        return self

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        actual = next(self.expected).copy()
        actual.reshape(-1)[: self.calls] += 1
        self.calls += 1
        return [actual.astype(np.int8) if self.calls == 3 else actual]


def test_a_lowered_row_keeps_its_most_severe_mismatch():
    original, rewritten = _reader_in_another_domain()
    (site,) = lowered_sites(original)
    replacement = _replacement(rewritten, Scopes(rewritten), site)
    rule = RULES[site.op_type]
    cases = list(rule.cases(site, np.random.default_rng(0)))
    runtime = _Wrong([rule.expected(arrays, site.attributes) for _, _, arrays in cases])
    result = _check(site, replacement, runtime, np.random.default_rng(0))
    assert result.cases == len(cases) and result.mismatches == len(cases) - 1
    assert result.worst_case == cases[2][0], result.detail  # kept first, it was cases[1]
    assert "dtype int8" in result.detail


# -- one home each ---------------------------------------------------------------------------------

PACKAGE = Path(dql_pass.__file__).parent
# Each graph helper, and the module that is its one home.
HOMES = {
    "backward_slice": "graph/slice.py", "site_model": "graph/slice.py", "NotReachable": "graph/slice.py",
    "free_name": "graph/names.py", "UniqueNames": "graph/names.py", "SharedConstants": "graph/names.py",
    "constant": "graph/constants.py", "drop_unused": "graph/constants.py",
    "ops_used": "graph/walk.py", "live": "graph/walk.py", "label": "graph/walk.py", "fed_inputs": "graph/walk.py",
    "graph_scopes": "graph/walk.py", "Tally": "verification/report.py",
}


def _definitions() -> dict[str, list[str]]:
    """Module-level function and class names of dql_pass -> the files defining them (runtimes/
    keeps its own ModelProto fed_inputs for now)."""
    found: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found.setdefault(node.name, []).append(path.relative_to(PACKAGE).as_posix())
    return found


def test_every_graph_helper_has_one_home():
    definitions = _definitions()
    homes = {name: [p for p in definitions.get(name, []) if not p.startswith("runtimes/")] for name in HOMES}
    assert homes == {name: [home] for name, home in HOMES.items()}


def test_only_the_slice_builds_a_site_graph():
    # A second slicing would build its own GraphView of the nodes it walked back through.
    builders = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                      if "GraphView(" in path.read_text())
    assert builders == ["graph/slice.py"]
