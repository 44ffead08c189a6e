"""verify's verdict on what it claims to check."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers import sample
from onnx import numpy_helper

import dql_pass
from dql_pass import runtimes


@pytest.mark.parametrize("name", sorted(runtimes.RUNTIMES))
def test_a_known_difference_on_any_input_never_covers_the_target_variant(name):
    # verify excuses a runtime's stated difference in the runtime's target variant: one stated for
    # inputs of any class there would excuse every mismatch of every site.
    runtime = runtimes.RUNTIMES[name]
    assert not [d for d in runtime.known_differences if d.inputs is None and runtime.variant in d.forms]


def _changed(model, name, change):
    changed = copy.deepcopy(model)
    for tensor in changed.graph.initializer:
        if tensor.name == name:
            tensor.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(tensor).copy()), name))
            return changed
    raise AssertionError(f"no initializer {name!r}")


def _flip_first(array: np.ndarray) -> np.ndarray:
    array.flat[0] ^= 1
    return array


@pytest.mark.parametrize(("initializer", "change"), [
    ("W2_quantized", _flip_first),  # the int8 weight kept in the file
    ("dql_pass_MatMul2_quant/zero_point", lambda a: a + np.float32(1)),  # what the in-graph Sub shifts it by
])
def test_a_changed_integer_weight_or_its_shift_fails_at_the_lowered_op(initializer, change):
    original = sample("mlp_dynamic")
    lowered, _ = dql_pass.lower(original, weights="integer")
    report = dql_pass.verify(original, _changed(lowered, initializer, change), samples=0)
    assert report.verdict == "FAIL"
    (row,) = [s for s in report.sites if s.name.startswith("MatMulInteger") and "MatMul2" in s.name]
    assert row.mismatches and "output differs" in row.detail
