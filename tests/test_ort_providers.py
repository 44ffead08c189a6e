"""dql_pass.runtimes.ort: ONNX Runtime's providers as runtimes. The CPU provider is the contract's;
the CUDA provider (onnxruntime-cuda) is what a user of onnxruntime-gpu runs, checked here without a
GPU for what it must refuse, and on a GPU, where there is one, for what it must compute."""

from __future__ import annotations

import onnx
import pytest
from helpers import MODELS, Result, assert_bad_input, installed

from dql_pass import runtimes
from dql_pass.cli import main
from dql_pass.op import one_node_model
from dql_pass.runtimes import ort as ort_adapter

CUDA = runtimes.get("onnxruntime-cuda")


def _cuda_starts() -> bool:
    ort = ort_adapter.import_onnxruntime()
    return "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.mark.skipif(_cuda_starts(), reason="this onnxruntime starts CUDA: nothing falls back here")
def test_a_provider_that_does_not_start_is_a_refusal_not_a_quiet_run_on_the_cpu():
    # onnxruntime only warns when a provider it was asked for is missing, and runs on the CPU:
    # a verdict on that run would be the CPU's, under the GPU's name.
    with pytest.raises(runtimes.RuntimeFailure, match="has no CUDAExecutionProvider"):
        CUDA._load(one_node_model(["n"], 21), threads=1, optimize="all")


@pytest.mark.skipif(CUDA.installed(), reason="onnxruntime-gpu is installed here")
def test_onnxruntime_cuda_without_onnxruntime_gpu_is_one_line_naming_what_to_install(capsys):
    model = str(MODELS / "mlp_dynamic.onnx")
    assert main(["verify", model, model, "--runtime", "onnxruntime-cuda"]) == 2
    assert_bad_input(Result(2, *capsys.readouterr()), "the runtime onnxruntime-cuda is not installed; "
                     "pip uninstall onnxruntime && pip install onnxruntime-gpu")


@pytest.mark.parametrize("name", sorted(p.name for p in MODELS.glob("*.onnx")))
def test_every_sample_lowered_for_cuda_passes_verify_on_the_gpu(tmp_path, capsys, name):
    installed("onnxruntime-cuda")
    out = tmp_path / "cuda.onnx"
    assert main(["lower", str(MODELS / name), "-o", str(out), "--target", "onnxruntime-cuda", "--verify"]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.fixture
def fresh_probe():
    """The saturation probe run anew in the test, and forgotten after it."""
    ort_adapter._saturating_products.cache_clear()
    yield
    ort_adapter._saturating_products.cache_clear()


def test_the_saturation_probe_names_the_lowest_ir_version_its_opset_needs(monkeypatch, fresh_probe):
    # onnx's own IR version can be newer than an onnxruntime reads: onnx 1.23 writes 14 by default,
    # onnxruntime-gpu 1.31 (the CUDA build's newest) refuses anything above 13.
    ort = ort_adapter.import_onnxruntime()
    create, versions = ort.InferenceSession, []

    def spy(model, *args, **kwargs):
        versions.append(onnx.load_from_string(model).ir_version)
        return create(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", spy)
    runtimes.get("onnxruntime").saturating_products()
    assert versions and set(versions) == {onnx.helper.find_min_ir_version_for([onnx.helper.make_opsetid("", 13)])}


def test_an_onnxruntime_that_cannot_run_the_saturation_probe_is_a_refusal(monkeypatch, fresh_probe):
    ort = ort_adapter.import_onnxruntime()
    fail = ort.capi.onnxruntime_pybind11_state.Fail

    def refuse(model, *args, **kwargs):
        raise fail("Unsupported model IR version: 14, max supported IR version: 13")

    monkeypatch.setattr(ort, "InferenceSession", refuse)
    with pytest.raises(runtimes.RuntimeFailure, match="IR version"):
        runtimes.get("onnxruntime").saturating_products()
