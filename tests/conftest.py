"""Shared helpers: one-node DQL models, ORT sessions, and bitwise comparison."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx.backend.test.loader
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import dql_pass
from dql_pass.functions import MAX_OPSET


def dql_model(opset: int, rank: int = 1, domain: str = "") -> onnx.ModelProto:
    """A model holding one DynamicQuantizeLinear node on an input of ``rank`` symbolic dims."""
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "y_scale", "y_zero_point"], domain=domain)
    dims = [f"d{i}" for i in range(rank)]
    graph = helper.make_graph(
        [node],
        "dql",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [
            helper.make_tensor_value_info("y", TensorProto.UINT8, dims),
            helper.make_tensor_value_info("y_scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("y_zero_point", TensorProto.UINT8, []),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


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
    return [t for t in tests if t.name.startswith("test_dynamicquantizelinear") and "expanded" not in t.name]


@functools.cache
def newest_ort_opset() -> int:
    """The newest ai.onnx opset at which ORT runs the expanded quantizelinear variant."""
    for opset in range(MAX_OPSET, 10, -1):
        try:
            session(dql_pass.expand(dql_model(opset)))
        except Exception:  # ORT says NOT_IMPLEMENTED for opsets it does not know yet
            continue
        return opset
    raise RuntimeError("ORT runs no expanded opset")


@functools.cache
def cached_session(opset: int, rank: int, variant: str | None = None, mode: str = "inline") -> ort.InferenceSession:
    """ORT session for the one-node model (``variant=None``) or its expansion."""
    model = dql_model(opset, rank)
    return session(model if variant is None else dql_pass.expand(model, variant=variant, mode=mode))


def run_cached(x: np.ndarray, opset: int = 13, variant: str | None = None, mode: str = "inline") -> list:
    return cached_session(opset, x.ndim, variant, mode).run(None, {"x": x})


@pytest.fixture(scope="session")
def ort_opset() -> int:
    return newest_ort_opset()
