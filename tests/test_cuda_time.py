"""tools.cuda_time: the real-GPU timing of the forms of a quantized transformer, run here on the CPU
provider (no GPU in CI) for what it reports: every form, its nodes, and the original's bits."""

from __future__ import annotations

import re

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tools import cuda_time


def _float_model(path):
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), f"w{i}") for i in range(2)]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w0"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w1"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 16])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())


def test_every_form_is_timed_placed_and_compared_bit_for_bit_with_the_original(tmp_path, capsys):
    model = tmp_path / "model.onnx"
    _float_model(model)
    assert cuda_time.main([str(model), "--provider", "CPUExecutionProvider", "--budget", "0.05",
                           "--batch", "1", "3"]) == 0
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and not line.startswith("| form")}
    assert list(rows) == ["original", "lowered", "lowered onnxruntime-cuda", "lowered webgpu", "fp32"]
    for form, cells in rows.items():
        assert int(cells[1].replace(",", "")) > 0, (form, cells)  # nodes the profiler saw run
        assert all(re.fullmatch(r"[\d.]+ (s|ms|µs|ns) \([\d.]+x\)", cell) for cell in cells[3:5]), cells
        assert cells[-2:] == (["(another model)", "(another model) |"] if form == "fp32" else ["yes", "yes |"]), cells
    # The lowered forms run more nodes than the original's, which ORT fuses into integer kernels.
    assert int(rows["lowered webgpu"][1].replace(",", "")) > int(rows["original"][1].replace(",", ""))
