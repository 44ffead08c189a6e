"""External data as a model may declare it: a tensor with only a location is read from offset zero;
a declared length that is not the tensor's size is refused before anything is written."""

from __future__ import annotations

import onnx
import pytest
from helpers import assert_bad_input, computed, run_cli, weighted_model


def test_an_external_tensor_with_only_a_location_is_read_from_offset_zero(tmp_path):
    source = weighted_model(tmp_path, "a.onnx", 3.0, 1.0)
    model = onnx.load(source, load_external_data=False)
    for tensor in model.graph.initializer:
        if tensor.external_data:
            del tensor.external_data[1:]  # location only
    onnx.save(model, tmp_path / "loc.onnx")
    (tmp_path / "out").mkdir()
    for command in ("expand", "fuse"):
        out = tmp_path / "out" / f"{command}.onnx"
        run = run_cli(command, tmp_path / "loc.onnx", "-o", out)
        assert run.returncode == 0, run.stderr
        assert computed(out) == 4.0
    run = run_cli("verify", tmp_path / "loc.onnx", tmp_path / "out" / "expand.onnx")
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stdout + run.stderr


@pytest.mark.parametrize("length", ["16", "4000000000"])
def test_a_declared_length_that_is_not_the_tensors_size_is_refused(tmp_path, length):
    source = weighted_model(tmp_path, "a.onnx", 3.0, 1.0)
    model = onnx.load(source, load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "length":
                entry.value = length
    onnx.save(model, tmp_path / "bad.onnx")
    (tmp_path / "out").mkdir()
    assert_bad_input(run_cli("expand", tmp_path / "bad.onnx", "-o", tmp_path / "out" / "o.onnx"), "bytes")
    assert list((tmp_path / "out").iterdir()) == []

