"""LiteRT (``ai-edge-litert``, TensorFlow Lite's successor) on the CPU, on models that onnx2tf
converts to ``.tflite``: the ``litert`` runtime runs LiteRT's builtin kernels, ``litert-xnnpack``
its default delegate, XNNPACK (what an app gets unless it opts out).

Two runtimes, not one with a setting: what each gets wrong differs (XNNPACK flushes subnormals
and refuses empty inputs), and a runtime's lacks, known differences and target variant are one
record each, which ``verify --runtime`` and ``tools.runtimes`` read.

Rules:

- onnx2tf 2.x (flatbuffer_direct, no TensorFlow) needs Python >= 3.12, and pins onnx,
  onnxruntime and numpy below what dql_pass needs: it runs in a virtual environment of its own,
  which ``python -m dql_pass.runtimes.litert setup`` makes once in the cache folder
  (``$DQL_PASS_LITERT_CACHE``, default ``~/.cache/dql_pass/litert``) from a Python >= 3.12 it
  finds. LiteRT itself runs here, from the extra: ``pip install 'dql_pass[litert]'``.
- Each conversion is a fresh converter process (:mod:`dql_pass.runtimes.litert.convert`) on a
  private copy of the model with its inputs' shapes fixed, so a session converts once per input
  shape (conversion times in docs/performance.md); it is stopped after :attr:`LiteRt.conversion_timeout`,
  and a crash or a refusal is the runtime's refusal. The converter runs in a network namespace of
  its own where the system allows one (``unshare``), with proxies pointed at a closed port and
  pip told to use no index; inside, an audit hook refuses every connection and every new process.
- onnx2tf keeps the inputs' layout (``keep_shape_absolutely_input_names``), and makes rank-0
  inputs and outputs of shape [1]: inputs take the converted model's shapes, and outputs the
  shapes ONNX infers for the fixed inputs, where only dimensions of 1 differ; any other
  difference is a refusal.
- ``threads`` > 0 is LiteRT's ``num_threads``; ``optimize`` is ignored: onnx2tf's rewrites have
  no switch, and onnxsim (which onnx2tf would run as a command) is never run.
"""

from __future__ import annotations

__all__ = ["CACHE_VARIABLE", "ONNX2TF", "SETUP", "LiteRt", "LiteRtXnnpack", "cache", "convert", "converter",
           "environment", "missing"]

import contextlib
import hashlib
import importlib.util
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dql_pass.errors import InputError
from dql_pass.op import OUTPUTS
from dql_pass.runtimes import isolated
from dql_pass.runtimes.base import (
    TIMEOUT_OPTION, KnownDifference, Lack, Runtime, RuntimeFailure, RuntimeTimeout, Session, dequantizes_otherwise,
    quantizes_otherwise,
)
from dql_pass.runtimes.sessions import ShapeCachedSession, as_file, fed_inputs, hold, output_types, with_shapes

# onnx is imported where used: listing the adapters needs none of it.
if TYPE_CHECKING:
    import onnx

ONNX2TF = "2.6.9"  # the onnx2tf version measured; setup installs exactly this one
CACHE_VARIABLE = "DQL_PASS_LITERT_CACHE"
SETUP = "python -m dql_pass.runtimes.litert setup"
READY = "ready"  # the file setup writes into the environment last, once onnx2tf is in it
_WORKER = Path(__file__).with_name("convert.py")
_CACHED_BYTES = 1 << 20  # models up to this size are converted once per process
_MEASURED = f"2.3.0, onnx2tf {ONNX2TF}"


def cache() -> Path:
    """The folder the setup command makes the converter's environment in."""
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "dql_pass" / "litert")


def environment() -> Path:
    """The converter's virtual environment."""
    return cache() / f"onnx2tf-{ONNX2TF}"


def converter() -> Path | None:
    """The Python of the converter's environment; None until the setup has completed."""
    python = environment() / "bin" / "python"
    return python if (environment() / READY).is_file() and python.is_file() else None


def missing() -> str | None:
    """What the LiteRT runtimes need and is not there, as one line saying what to do; None: all there."""
    if importlib.util.find_spec("ai_edge_litert") is None:
        return "pip install 'dql_pass[litert]' (ai-edge-litert is not installed)"
    if converter() is None:
        return f"run `{SETUP}` (onnx2tf {ONNX2TF} is not in {environment()})"
    return None


def _environ(folder: Path) -> dict[str, str]:
    """The converter's environment variables (see :func:`~dql_pass.runtimes.isolated.environ`)."""
    return {**isolated.environ(folder, os.pathsep.join([str(environment() / "bin"), "/usr/bin", "/bin"])),
            "TQDM_DISABLE": "1",  # onnx2tf's progress bars cost a second a conversion
            "CUDA_VISIBLE_DEVICES": ""}


def convert(path: Path, timeout: float) -> bytes:
    """The ``.tflite`` that onnx2tf makes of the ONNX file ``path``, a private copy in a folder of
    its own, where the converter also writes; :class:`RuntimeFailure` when it refuses, crashes or
    takes longer than ``timeout`` seconds."""
    python = converter()
    if python is None:
        raise InputError(f"the LiteRT runtimes need onnx2tf: {missing()}")
    out = path.with_name(path.stem + ".tflite.d")
    command = isolated.command([str(python), "-I", str(_WORKER), str(path), str(out)])
    try:
        done = subprocess.run(command, env=_environ(path.parent), cwd=path.parent, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeTimeout(
            f"a timeout: onnx2tf did not finish in {timeout:g} s; {TIMEOUT_OPTION} gives it longer") from None
    tflite = out / f"{path.stem}_float32.tflite"
    if done.returncode != 0 or not tflite.is_file():
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        why = f"signal {-done.returncode}" if done.returncode < 0 else lines[-1] if lines else f"exit {done.returncode}"
        raise RuntimeFailure(f"onnx2tf did not convert the model: {why}")
    return tflite.read_bytes()


_converted: dict[str, bytes] = {}  # small models' conversions by digest: a catalogue converts the same
# one-node models for both LiteRT runtimes


def _convert_once(path: Path, timeout: float) -> bytes:
    """:func:`convert`, once per small model in a process."""
    folder = path.parent
    if sum(file.stat().st_size for file in folder.iterdir()) > _CACHED_BYTES:
        return convert(path, timeout)
    digest = hashlib.sha256()
    for file in sorted(folder.iterdir()):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    key = digest.hexdigest()
    if key not in _converted:
        _converted[key] = convert(path, timeout)
    return _converted[key]


def _declared_shapes(proto: onnx.ModelProto) -> list[tuple[int, ...] | None]:
    """The graph outputs' shapes ONNX infers for ``proto`` (None where it cannot tell)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    shapes = []
    for value in inferred.graph.output:
        tensor = value.type.tensor_type
        dims = list(tensor.shape.dim) if tensor.HasField("shape") else None
        known = dims is not None and all(d.HasField("dim_value") for d in dims)
        shapes.append(tuple(d.dim_value for d in dims) if known else None)
    return shapes


def _shaped(array: np.ndarray, shape: tuple[int, ...] | None, name: str) -> np.ndarray:
    """``array`` in ``shape``, where only dimensions of 1 tell them apart (onnx2tf makes a scalar
    of shape [1]); :class:`RuntimeFailure` for any other difference, a layout onnx2tf changed."""
    if shape is None or array.shape == shape:
        return array
    if [d for d in array.shape if d != 1] == [d for d in shape if d != 1]:
        return array.reshape(shape)
    raise RuntimeFailure(f"{name} has the shape {list(array.shape)} on one side and {list(shape)} on the other: "
                         "onnx2tf changed its layout")


_M = f"measured ({_MEASURED})"
_CLAMPED = (f"{_M}: LiteRT's builtin Sub, Mul and Div clamp an infinite result to ±FLT_MAX, so a range with ±inf "
            "in x, or one that overflows, comes out as FLT_MAX and the scale as FLT_MAX/255 = 1.3e36, not +inf")
_FLUSHED = (f"{_M}: XNNPACK flushes subnormal float32 to zero, in its reductions too, so a subnormal x, range or "
            "scale quantizes as zero")
# Measured on the .tflite: its tensors' arena offsets after allocate_tensors, and exact with
# experimental_preserve_all_tensors (no buffer shared), on a two-node Add -> Gather model too.
_IN_PLACE = (f"{_M}: onnx2tf wraps a binary op over a tensor of rank above 4 in RESHAPEs to a lower rank, and "
             "LiteRT's arena planner then lets an op write in place over a buffer that a later op still reads "
             "through one of those RESHAPEs")
_CONVERTED = (  # what onnx2tf does, whichever kernels run
    KnownDifference(("native",), "reciprocal",
                    f"{_M}: onnx2tf makes DynamicQuantizeLinear float ops that divide by the scale and by 255 through "
                    "a multiplication by the reciprocal", outputs=OUTPUTS),
    KnownDifference(("arithmetic",), "reciprocal",
                    f"{_M}: onnx2tf folds the variant's Div by the constant 255 into a Mul by float32(1/255), which "
                    "makes the scale 1 ulp off", outputs=OUTPUTS),
    KnownDifference(("native",), "zero range",
                    f"{_M}: onnx2tf's DynamicQuantizeLinear gives a zero range (all zero, or empty) the scale 0 and "
                    "the zero point 255 (the contract: scale 1, zero point 0)", outputs=OUTPUTS),
    KnownDifference(("lean",), "rank above 4", f"{_IN_PLACE}: the ADD of the index fix-up that onnx2tf puts before "
                    "each Gather overwrites the index it still reads, so lean's last Gather reads out of bounds and "
                    "does not run (shapes (2, 2, 2, 2, 2), (1, 2, 3, 4, 5))", outputs=OUTPUTS),
)


class LiteRt(Runtime):
    name = "litert"
    module = "ai_edge_litert"
    distribution = "ai-edge-litert"
    extra = "litert"
    conversion_timeout: float = 600.0  # seconds for one onnx2tf run (the MiniLM takes some 60 s here)
    xnnpack = False
    # portable: exact but for ±inf (LiteRT's builtin kernels clamp inf to FLT_MAX); residual, the
    # best other variant, loses tiny scales and underflowing ones too (976 of 1,056 against 1,050);
    # lean loses a rank-5 x besides, on both kernels (a Gather index out of bounds).
    variant = "portable"
    # lower's default, float: onnx2tf folds integer weights' Cast and Sub into float32 constants,
    # so the .tflite an app ships is as large either way (lowered MLP: 163,576 bytes from integer
    # weights, 163,528 from float), and both give ORT's bits on both kernels.
    lacks = (
        Lack("litert", "QuantizeLinear", 10, _MEASURED,
             "onnx2tf makes a QuantizeLinear whose scale is computed a custom op, ONNX_QUANTIZELINEAR, that LiteRT "
             "cannot resolve ('Encountered unresolved custom op')"),
        Lack("litert", "ConvInteger", 10, _MEASURED,
             "onnx2tf makes ConvInteger a custom op, ONNX_CONVINTEGER, that LiteRT cannot resolve ('Encountered "
             "unresolved custom op'): lower the model (`dql-pass lower --target litert`)"),
    )
    unloadable = {
        "float64": f"{_M}: onnx2tf converts float64 tensors, and LiteRT refuses them at run time ('Div only "
                   "supports FLOAT32, INT32 and quantized INT8, UINT8, INT16 now, got 11')",
    }
    # lean loses to the clamp the very inputs portable loses (6 of 256).
    computed_otherwise = (
        dequantizes_otherwise("litert", _MEASURED, 155, " (XNNPACK's is)"),
        quantizes_otherwise("litert", _MEASURED, 74),
    )
    known_differences = (
        *_CONVERTED,
        *(KnownDifference(("native", "arithmetic", "residual", "portable", "lean"), inputs, _CLAMPED, outputs=OUTPUTS)
          for inputs in ("infinite", "range overflows")),
        KnownDifference(("native", "arithmetic", "residual"), "x/scale overflows to +inf",
                        f"{_M}: where the scale underflows to 0, the builtin kernels give y 255 where the contract "
                        "gives 0 (x <= 0, whose quotient x/0 is -inf or NaN)", outputs=("y",)),
        KnownDifference(("residual",), "tiny scale",
                        f"{_M}: with a scale near 1.5e-38 the residual variant's remainders fall out of the normal "
                        "float32 range, where LiteRT loses their low bits (26 of 1,000 inputs built apart)",
                        outputs=OUTPUTS),
        KnownDifference(("residual", "portable"), "rank above 4",
                        f"{_IN_PLACE}: with the builtin kernels a Div overwrites a product that a later test "
                        "reads, and y comes out off (portable: 11 of 16 elements 1 off at shape (1, 2, 2, 2, 2), 53 "
                        "of 120 at (1, 2, 3, 4, 5), residual: 118 of 120; (2, 2, 2, 2, 2) is exact; XNNPACK, which "
                        "runs those ops, is exact)", outputs=("y",)),
    )

    def installed(self) -> bool:
        return missing() is None

    def version(self) -> str | None:
        version = super().version()
        return f"{version}, onnx2tf {ONNX2TF}" if version and converter() else None

    def install_hint(self) -> str:
        return missing() or f"run `{SETUP}`"

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        import onnx
        from ai_edge_litert import interpreter as litert

        resolver = (litert.OpResolverType.AUTO if self.xnnpack  # LiteRT's default: the XNNPACK delegate
                    else litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
        files = contextlib.ExitStack()  # the session's: the private copy lives as long as it
        try:
            path = files.enter_context(as_file(model))
            proto = onnx.load(path, load_external_data=False)
        except BaseException:
            files.close()
            raise
        inputs = [value.name for value in fed_inputs(proto)]
        outputs = [value.name for value in proto.graph.output]

        def compile(signature):
            fixed = with_shapes(proto, [shape for shape, _ in signature])
            # Beside the copy, so that its data file is found; removed once converted.
            with tempfile.TemporaryDirectory(prefix="shape.", dir=path.parent) as folder:
                copy = Path(folder) / "model.onnx"
                onnx.save(fixed, copy)
                for data in path.parent.glob(path.name + ".data"):
                    os.link(data, copy.with_name(data.name))  # our own copy's data, read only by the converter
                tflite = _convert_once(copy, self.timeout or self.conversion_timeout)
            interpreter = litert.Interpreter(model_content=tflite, num_threads=threads or None,
                                             experimental_op_resolver_type=resolver)
            interpreter.allocate_tensors()
            by_name = {d["name"]: d for d in interpreter.get_input_details()}
            results = {d["name"]: d for d in interpreter.get_output_details()}
            if set(inputs) - set(by_name) or set(outputs) - set(results):
                raise RuntimeFailure(f"onnx2tf named the converted model's tensors otherwise: {sorted(by_name)}, "
                                     f"{sorted(results)}")
            shapes = _declared_shapes(fixed)

            def run(arrays):
                for name, array in zip(inputs, arrays):
                    detail = by_name[name]
                    interpreter.set_tensor(detail["index"], _shaped(np.require(array, requirements="C"),
                                                                    tuple(detail["shape"]), name))
                interpreter.invoke()
                return [_shaped(interpreter.get_tensor(results[name]["index"]), shape, name)
                        for name, shape in zip(outputs, shapes)]
            return run

        session = ShapeCachedSession(inputs, outputs, output_types(proto), compile)
        hold(session, files.close)
        return session


class LiteRtXnnpack(LiteRt):
    name = "litert-xnnpack"
    xnnpack = True
    # Its DequantizeLinear is (x - zero_point) * scale (measured as LiteRT's above).
    computed_otherwise = (
        quantizes_otherwise("litert-xnnpack", _MEASURED, 74),
    )
    # portable: exact but for subnormals, which XNNPACK flushes; ±inf too is right here. lean loses
    # to the flush the very inputs portable loses (38 of 256), and -inf besides (a Gather index out
    # of bounds: its slot clamp's Where, below).
    known_differences = (
        *_CONVERTED,
        KnownDifference(("native", "arithmetic", "residual", "portable", "lean"), "subnormal", _FLUSHED,
                        outputs=OUTPUTS),
        KnownDifference(("native", "arithmetic", "residual"), "infinite",
                        f"{_M}: with XNNPACK, +inf in x quantizes to 255 (the contract: 0, for inf/inf)",
                        outputs=("y",)),
        KnownDifference(("lean",), "infinite",
                        f"{_M}: LiteRT's Where, as onnx2tf converts it, gives NaN where the branch it does not take "
                        "is infinite (Where(0 < e, e, 0) at e = -inf, on both kernels), and XNNPACK's Min keeps that "
                        "NaN, whose Cast to int32 is a Gather index out of bounds: lean does not run with -inf in x",
                        outputs=OUTPUTS),
        KnownDifference(("residual",), "reciprocal",
                        f"{_M}: with XNNPACK the residual variant's scale or quotients are 1 ulp off on 102 of 1,000 "
                        "inputs built apart, each one where dividing through the reciprocal changes an output; "
                        "the portable variant, built for fused products, is exact on them", outputs=OUTPUTS),
    )
