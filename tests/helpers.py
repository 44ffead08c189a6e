"""Shared test helpers, imported by name: one-node DQL models, sessions through the runtime layer, bitwise comparison."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnx.backend.test.loader
import onnx.inliner
import onnxruntime as ort

import dql_pass
from dql_pass import runtimes
from dql_pass.op import MAX_OPSET, one_node_model


MODELS = Path(__file__).resolve().parent.parent / "models"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def onnx_body(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every DQL replaced by ONNX's own function body, as onnx's inliner writes it (unguarded)."""
    return onnx.inliner.inline_selected_functions(model, [("", "DynamicQuantizeLinear")], inline_schema_functions=True)


def dql_model(opset: int, rank: int = 1, domain: str = "") -> onnx.ModelProto:
    """A model holding one DynamicQuantizeLinear node on an input of ``rank`` symbolic dims."""
    return one_node_model([f"d{i}" for i in range(rank)], opset, domain=domain)


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
            session(dql_pass.expand(dql_model(opset), runtime=None))
        except ort.capi.onnxruntime_pybind11_state.NotImplemented:  # an opset newer than ORT's kernels
            continue
        assert opset >= 21, f"the ORT this project needs runs opset 21 and more, not only {opset}"
        return opset
    raise RuntimeError("ORT runs no expanded opset")


@functools.cache
def cached_session(opset: int, rank: int, variant: str | None = None, mode: str = "inline") -> runtimes.Session:
    """ORT session for the one-node model (``variant=None``) or its expansion."""
    model = dql_model(opset, rank)
    return session(model if variant is None else dql_pass.expand(model, variant=variant, mode=mode))


def run_cached(x: np.ndarray, opset: int = 13, variant: str | None = None, mode: str = "inline") -> list:
    return cached_session(opset, x.ndim, variant, mode).run({"x": x})
