"""The one vocabulary of input classes, the catalogue that draws from it, and the generators of inputs."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

from dql_pass import inputs, runtimes
from dql_pass.reference import dynamic_quantize_linear
from dql_pass.runtimes.base import KnownDifference


def test_a_known_difference_naming_an_unknown_class_raises():
    with pytest.raises(ValueError, match="unknown input class 'reciprocals'"):
        KnownDifference(("native",), "reciprocals", "a misspelt class", outputs=("y",))


def test_an_adapter_with_a_misspelt_class_fails_at_import(tmp_path, monkeypatch):
    (tmp_path / "misspelt_adapter.py").write_text(
        "from dql_pass.runtimes.base import KnownDifference, Runtime\n"
        "class Misspelt(Runtime):\n"
        "    name = 'misspelt'\n"
        "    known_differences = (KnownDifference(('native',), 'reciprocals', 'divides through a reciprocal',"
        " outputs=('y',)),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="reciprocals"):
        importlib.import_module("misspelt_adapter")
    assert "misspelt_adapter" not in sys.modules


def test_every_known_difference_names_a_class_of_the_vocabulary():
    """Or None: any input, only for a form that is not the runtime's target."""
    stated = {d.inputs for runtime in runtimes.RUNTIMES.values() for d in runtime.known_differences}
    assert stated and stated - {None} <= inputs.CLASSES
    assert [(r.name, d.reason) for r in runtimes.RUNTIMES.values() for d in r.known_differences
            if d.inputs is None and r.variant in d.forms] == []


@pytest.mark.parametrize("policy", ["onnxruntime", "onnx-reference"])
def test_the_catalogue_reaches_every_class_and_no_other(policy):
    found = set().union(*(case.classes(policy) for case in inputs.cases() if case.comparable))
    assert found == inputs.CLASSES


def test_zero_range_is_one_class_for_the_catalogue_and_the_known_differences():
    zero_range = {c.name for c in inputs.cases() if "zero range" in c.classes("onnxruntime")}
    assert zero_range == {c.name for c in inputs.cases() if c.policy_dependent}
    assert zero_range == {"zeros", "negative_zero", "signed_zeros", "empty", "empty_rank_3"}


def test_input_classes_names_only_classes_of_the_vocabulary():
    for x in [np.zeros(0, np.float32), np.array([np.inf, 1e-45], np.float32), np.array([0.5, 1.5], np.float32)]:
        assert inputs.input_classes(x, "onnxruntime") <= inputs.CLASSES


def test_the_large_cases_repeat_the_catalogues_exact_ties_with_the_ends_last():
    ties = next(c.x for c in inputs.cases() if c.name == "tie_exact_fractional_scale")
    for case in [c for c in inputs.large_cases() if c.name.startswith("large_ties")]:
        flat = case.x.ravel()
        assert flat.size > 1000 and flat[-2:].tobytes() == ties[:2].tobytes()
        assert set(flat[:-2].tolist()) == set(ties[2:].tolist()) and "near tie" in case.classes("onnxruntime")


def test_the_boundary_cases_straddle_every_rounding_step_on_each_side_of_the_zero_point():
    """Each quantized step k -> k + 1 once on each side of its boundary, below and above 0, at six scales."""
    boundaries = [c for c in inputs.large_cases() if c.name.startswith("boundaries")]
    assert len(boundaries) == 12
    for case in boundaries:
        y, _, zero_point = dynamic_quantize_linear(case.x)
        steps = y[2:].astype(int).reshape(-1, 2)  # the range's ends first, then pairs around each boundary
        assert (steps[:, 1] - steps[:, 0] == 1).all() and len(steps) == 255 and len(np.unique(y)) == 256
        assert zero_point in (0, 255)


def test_the_independent_inputs_are_seeded_and_reach_the_classes_runtimes_differ_on():
    first, again = inputs.independent_inputs(60, seed=5), inputs.independent_inputs(60, seed=5)
    assert [(n, x.tobytes()) for n, x in first] == [(n, x.tobytes()) for n, x in again]
    assert {x.shape for _, x in first} == set(inputs.INDEPENDENT_SHAPES)
    reached = set().union(*(inputs.input_classes(x, "onnxruntime") for _, x in first))
    assert {"near tie", "reciprocal", "subnormal", "tiny scale"} <= reached, reached
