"""Runtimes dql_pass has no adapter for, which users name all the same: what each lacks of a
``quantize_dynamic`` model, as data with its source, so that ``advise`` and an unknown ``--target``
can say what to run for them. None of it is measured here (no such runtime runs on this machine);
each record names the page that states it.
"""

from __future__ import annotations

__all__ = ["ELSEWHERE", "Elsewhere"]

import dataclasses


@dataclasses.dataclass(frozen=True)
class Elsewhere:
    """A runtime without an adapter: the ops it cannot run (or runs only on the CPU) and why."""

    name: str
    title: str
    lacks: tuple[str, ...]  # ai.onnx op types
    reason: str
    source: str
    # What the user still has to do with the lowered model there, if anything.
    after: str | None = None

    def describe(self) -> str:
        return f"{self.title}: {self.reason} (source: {self.source}; not measured here)"


_INTEGER_OPS = ("DynamicQuantizeLinear", "MatMulInteger", "ConvInteger")
_TF32 = "keep its float32 products exact: no TF32, FP16 or BF16 (docs/lower.md, Limits)"

ELSEWHERE: dict[str, Elsewhere] = {
    record.name: record
    for record in (
        Elsewhere(
            "tensorrt", "TensorRT", _INTEGER_OPS,
            "no DynamicQuantizeLinear, MatMulInteger or ConvInteger; QuantizeLinear and DequantizeLinear only with "
            "zero points of 0",
            "onnx-tensorrt docs/operators.md", "build the engine without BuilderFlag.TF32, FP16 and BF16",
        ),
        Elsewhere(
            "coreml", "ONNX Runtime's CoreML EP", _INTEGER_OPS,
            "its supported-operator list has none of DynamicQuantizeLinear, MatMulInteger and ConvInteger: those "
            "nodes run on ORT's CPU provider, outside CoreML",
            "onnxruntime.ai docs, execution-providers/CoreML-ExecutionProvider, Supported operators", _TF32,
        ),
        Elsewhere(
            "qnn", "ONNX Runtime's QNN EP", _INTEGER_OPS,
            "DynamicQuantizeLinear, MatMulInteger and ConvInteger only as the fusion DynamicQuantizeLinear -> "
            "MatMulInteger/ConvInteger -> Cast -> Mul with constant weights, computed as QNN's own MatMul or Conv, "
            "not as ORT's integer kernels; anything else falls back to the CPU",
            "onnxruntime-qnn docs/execution_providers/QNN-ExecutionProvider.md, Supported ONNX operators and "
            "Supported operator fusions", "run it in float32 (QNN's CPU or GPU backend, or HTP without fp16)",
        ),
        Elsewhere(
            "candle", "candle (candle-onnx)", _INTEGER_OPS,
            "candle-onnx's evaluator maps no int8 tensor type (its table has uint8, uint32, int64 and the floats), so "
            "quantize_dynamic's int8 weights, and the integer ops that read them, do not load",
            "huggingface/candle, candle-onnx/src/eval.rs", None,
        ),
        Elsewhere(
            "burn", "burn (burn-onnx)", _INTEGER_OPS,
            "its import does not support DynamicQuantizeLinear, MatMulInteger or ConvInteger",
            "tracel-ai/burn-onnx, SUPPORTED-ONNX-OPS.md", None,
        ),
    )
}
