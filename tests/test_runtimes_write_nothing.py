"""Running a runtime leaves nothing in $HOME or $TMPDIR: onnxruntime and OpenVINO with their
telemetry (a device id, a database, a session file, a client id; events sent over the network),
Chromium with its crash-report settings and dconf's cache. Each command runs in a subprocess whose
HOME and TMPDIR are empty folders of its own, which must stay empty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx_ir as ir
import pytest
from helpers import MODELS, installed, short_tmpdir

import dql_pass
from dql_pass.runtimes import web
from dql_pass.runtimes.web.browser import Browser, chromium


def _private(tmp_path: Path) -> tuple[Path, Path]:
    home, tmpdir = tmp_path / "home", tmp_path / "tmpdir"
    home.mkdir()
    tmpdir.mkdir()
    return home, tmpdir


def _written(*folders: Path) -> list[str]:
    return sorted(str(path) for folder in folders for path in folder.rglob("*"))


@pytest.mark.parametrize(("runtime", "variant"), [
    ("onnxruntime", None), ("openvino", None),
    # tract cannot run the quantizelinear expansion: the session that failed keeps its private copy of the model
    # alive (the failure's traceback references it, and the command line exits without the GC or finalizers).
    ("tract", "quantizelinear"),
])
def test_verify_writes_nothing_to_home_or_tmpdir(tmp_path, runtime, variant):
    installed(runtime)
    lowered = tmp_path / "lowered.onnx"
    original = dql_pass.load_model(MODELS / "relu_dql.onnx")
    rewritten = dql_pass.lower(original) if variant is None else dql_pass.expand(original, variant=variant)
    dql_pass.save_model(rewritten[0], lowered)
    home, tmpdir = _private(tmp_path)
    # ORT's own switch, set off by the user: dql_pass sets it on whatever the caller says.
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmpdir), "ORT_DISABLE_TELEMETRY": "0"}
    done = subprocess.run([sys.executable, "-m", "dql_pass", "verify", "-q", "--runtime", runtime,
                           str(MODELS / "relu_dql.onnx"), str(lowered)], env=env, capture_output=True, text=True)
    # tract's case must fail, the path it exists for; the others may pass or fail, their leftovers are the point.
    assert done.returncode == 1 if runtime == "tract" else done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr
    assert _written(home, tmpdir) == []


def test_tinygrad_writes_nothing_to_home_or_tmpdir(tmp_path):
    """Its kernel cache went to ~/.cache/tinygrad, written by the compile pool it spawned. One one-node
    model, compiled and run in a fresh process whose HOME and TMPDIR are empty (verify took 20 s)."""
    installed("tinygrad")
    home, tmpdir = _private(tmp_path)
    run = ("import numpy as np; from dql_pass import runtimes; from dql_pass.op import one_node_model; "
           "model = one_node_model([4], 13); "
           "runtimes.get('tinygrad').load(model).run({'x': np.linspace(-1, 2, 4, dtype=np.float32)})")
    done = subprocess.run([sys.executable, "-c", run], env={**os.environ, "HOME": str(home), "TMPDIR": str(tmpdir)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _written(home, tmpdir) == []


def test_probing_ort_for_saturating_products_first_writes_nothing(tmp_path):
    """The probe may be the process's first ORT session (verify's notes, load_exact): ORT is
    imported with its telemetry off there too."""
    home, tmpdir = _private(tmp_path)
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmpdir), "ORT_DISABLE_TELEMETRY": "0"}
    probe = "from dql_pass.runtimes.ort import OnnxRuntime; OnnxRuntime().saturating_products()"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _written(home, tmpdir) == []


@pytest.mark.skipif(web.missing() is not None or chromium() is None, reason="the web runtimes are not set up")
def test_chromium_writes_nothing_to_home_or_tmpdir(tmp_path, monkeypatch):
    home, tmpdir = _private(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    for variable in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    browser = Browser(chromium(), "about:blank")
    try:
        assert browser.evaluate("1 + 1") == 2
    finally:
        browser.close()
    assert _written(home, tmpdir) == []


def test_quantizing_a_model_for_the_benchmarks_first_writes_nothing(tmp_path):
    """The tools import onnxruntime's quantization tool, which imports onnxruntime: through
    dql_pass.runtimes first, so its telemetry is off there too (tools.models, tools.gpu_cost,
    tools.cuda_time)."""
    home, tmpdir = _private(tmp_path)
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmpdir), "ORT_DISABLE_TELEMETRY": "0"}
    quantize = ("import sys; from pathlib import Path; from tools import models; "
                "models.quantize(models.cnn_model(), Path(sys.argv[1]), 'q.onnx', ('Conv',))")
    done = subprocess.run([sys.executable, "-c", quantize, str(tmp_path)], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert _written(home, tmpdir) == []


def test_every_tool_and_test_imports_onnxruntime_after_turning_its_telemetry_off():
    # ORT reads ORT_DISABLE_TELEMETRY at its first import; dql_pass.runtimes.ort.import_onnxruntime sets it.
    root = Path(__file__).resolve().parent.parent
    found = []
    for path in sorted([*(root / "tools").glob("*.py"), *(root / "tests").glob("*.py")]):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.lstrip().startswith(("import onnxruntime", "from onnxruntime")):
                if not any("import_onnxruntime()" in before for before in lines[max(0, i - 2):i]):
                    found.append(f"{path.relative_to(root)}:{i + 1}")
    assert found == []


@pytest.mark.skipif(web.missing() is not None or chromium() is None, reason="the web runtimes are not set up")
def test_a_failed_web_run_leaves_neither_its_copy_nor_its_browser_profile(tmp_path):
    """The failure's traceback keeps the session alive past the command's end, which runs no finalizer: the model
    copy and Chromium's profile stayed in TMPDIR."""
    rewritten = dql_pass.lower(dql_pass.load_model(MODELS / "relu_dql.onnx"))[0]
    rewritten.graph.inputs.append(ir.Value(name="extra", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([1])))
    dql_pass.save_model(rewritten, tmp_path / "extra.onnx")
    from dql_pass.runtimes.web import installation

    with short_tmpdir() as short:
        home, tmpdir = _private(short)
        env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmpdir),
               installation.CACHE_VARIABLE: str(installation.cache())}
        done = subprocess.run([sys.executable, "-m", "dql_pass", "verify", "--runtime", "wasm",
                               str(MODELS / "relu_dql.onnx"), str(tmp_path / "extra.onnx")], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        # The page loaded the model (Chromium started), then refused the run.
        assert "wasm cannot run REWRITTEN: the model takes inputs it was not given" in done.stdout, done.stdout
        assert _written(home, tmpdir) == []
