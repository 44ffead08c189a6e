"""Check lowered quantize_dynamic models on every runtime, bit for bit against ORT on the original.

Run from the repository root::

    python -m tools.check_lowered [--runtime NAME ...] [--minilm]

Each model is lowered with ``target=`` the runtime (its exact expansion variant) and run through
:mod:`dql_pass.runtimes` on random, all-zero and extreme inputs (±1000: every DQL output at 0 or
255); the outputs must equal ORT's on the original (optimisation "basic", kernels as written) in
every bit. The models: the sample models with MatMulInteger or ConvInteger, the CNN of
:func:`tools.models.cnn_model` with uint8 and int8 weights, per tensor and per channel, and a tiny
transformer (``--minilm``: the MiniLM-sized one). The transformer keeps float MatMul, Softmax, Erf
and LayerNormalization, which each runtime sums in its own order: it is expected to differ off ORT.

Prints one line per runtime and model; exits 1 if a model that should be exact differs or fails to
run. A model the target cannot take (an op it lacks) is "refused", with the reason.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

import dql_pass
from dql_pass import runtimes
from dql_pass.errors import one_line
from tools import harness, models

DEFAULT_RUNTIMES = ("onnxruntime", "onnx2torch", "onnx2pytorch", "tract")
TINY = models.TransformerShape(layers=2, hidden=64, heads=4, intermediate=256, seq=16)


def _models(folder: Path, transformer: models.TransformerShape) -> dict[str, tuple[onnx.ModelProto, bool]]:
    """Each model, and whether it must be exact on every runtime (only elementwise float ops left)."""
    built = {path.name: (onnx.load(path), True) for path in sorted((harness.REPO / "models").glob("*_dynamic.onnx"))}
    for weight_type in ("QUInt8", "QInt8"):
        for per_channel in (False, True):
            name = f"cnn_{weight_type}_{'channel' if per_channel else 'tensor'}"
            path = models.quantize(models.cnn_model(), folder, f"{name}.onnx", ("Conv", "MatMul"),
                                   weight_type=weight_type, per_channel=per_channel)
            built[name] = (onnx.load(path), True)
    built["transformer"] = (onnx.load(models.quantize(models.minilm_model(transformer), folder, "transformer.onnx")),
                            False)
    return built


def _inputs(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, dict[str, np.ndarray]]:
    feeds = models.random_feeds(model, rng, size=2)
    return {
        "random": feeds,
        "zero": {name: np.zeros_like(a) for name, a in feeds.items()},
        "extreme": {name: np.where(rng.random(a.shape) < 0.5, -1e3, 1e3).astype(np.float32)
                    for name, a in feeds.items()},
    }


def check(runtime: str, model: onnx.ModelProto) -> str:
    """'exact', what differs or failed, or why the model cannot be lowered for ``runtime`` ('refused: ...')."""
    try:
        lowered, report = dql_pass.lower(model, target=runtime)
    except dql_pass.InputError as error:  # the target cannot load its variant at the model's opset
        return f"refused: {error}"
    if report.lacking:
        return "refused: lacks " + "; ".join(lack.describe() for lack in report.lacking)
    expected = runtimes.get("onnxruntime").load_exact(model, threads=1, optimize="basic")
    try:
        session = runtimes.get(runtime).load(lowered, threads=1, optimize="basic")
        for label, feeds in _inputs(model, np.random.default_rng(0)).items():
            if not harness.same_outputs(expected.run(feeds), session.run(feeds)):
                return f"differs on {label} inputs"
    except runtimes.RuntimeFailure as error:
        return f"fails: {one_line(error)}"
    return "exact"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", action="append", help="a runtime to check (repeatable; default: %(default)s)")
    parser.add_argument("--minilm", action="store_true", help="the MiniLM-sized transformer instead of a tiny one")
    args = parser.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory(prefix="check_lowered.") as folder:
        built = _models(Path(folder), models.MINILM if args.minilm else TINY)
        for runtime in args.runtime or DEFAULT_RUNTIMES:
            if runtime not in runtimes.RUNTIMES or not runtimes.get(runtime).installed():
                print(f"{runtime}: no adapter registered, or not installed; skipped")
                continue
            for name, (model, must_be_exact) in built.items():
                outcome = check(runtime, model)
                failed |= must_be_exact and outcome != "exact" and not outcome.startswith("refused")
                print(f"{runtime:14s} {name:24s} {outcome}"
                      f"{'' if must_be_exact else ' (float MatMul/Softmax left: not expected exact)'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
