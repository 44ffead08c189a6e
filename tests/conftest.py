"""Fixtures only; shared helpers live in helpers.py and are imported by name."""

from __future__ import annotations

import onnx
import pytest
from helpers import MODELS, newest_ort_opset

from dql_pass import suites


@pytest.fixture(scope="session")
def ort_opset() -> int:
    return newest_ort_opset()


@pytest.fixture()
def small_suite(tmp_path):
    """Two inputs, every form, one opset: cheap to edit."""
    path = tmp_path / "dql"
    suites.generate_suite(path, opsets=(18,), include_large=False, names=("spec_example", "rank_0"))
    return path


@pytest.fixture(scope="module")
def mlp() -> onnx.ModelProto:
    return onnx.load(MODELS / "mlp_dynamic.onnx")
