"""Where onnxruntime knowingly gives other outputs than the spec, case by case, with ORT's answer.

Each rule is data: which cases it covers, why (measured on onnxruntime 1.32.0, x86-64 with AVX2 and
no VNNI), and ORT's answer where it can be computed (None where ORT refuses the model or its
outputs are not reproducible). run-tests calls a case XFAIL on ORT only when ORT gives that answer
(any difference where there is none); one that matches the spec instead is reported as matched.
"""

from __future__ import annotations

__all__ = ["RULES", "Difference", "Rule", "difference"]

import dataclasses
from collections.abc import Callable

import numpy as np

from dql_pass.suites.family_cases import Case


@dataclasses.dataclass(frozen=True)
class Difference:
    reason: str
    answer: tuple[np.ndarray, ...] | None  # ORT's outputs; None: ORT refuses the model, or they are not reproducible


@dataclasses.dataclass(frozen=True)
class Rule:
    applies: Callable[[Case, int], bool]
    reason: str
    answer: Callable[[Case], tuple[np.ndarray, ...]] | None = None


def _size(case: Case, name: str) -> int:
    value = case.inputs.get(name)
    return 0 if value is None else value.size


def _saturating_u8s8(case: Case) -> tuple[np.ndarray, ...]:
    """ORT's u8s8 MatMulInteger on AVX2 without VNNI: vpmaddubsw sums the products of k = 2j and 2j + 1 and
    saturates the sum to int16; the zero points' terms are added exactly afterwards."""
    a, b = case.inputs["A"], case.inputs["B"]
    a_zp, b_zp = case.inputs["a_zero_point"], case.inputs["b_zero_point"]
    a2, b2 = (a[None, :] if a.ndim == 1 else a).astype(np.int64), (b[:, None] if b.ndim == 1 else b).astype(np.int64)
    k = a2.shape[-1]
    if k % 2:
        a2 = np.concatenate([a2, np.zeros((*a2.shape[:-1], 1), np.int64)], axis=-1)
        b2 = np.concatenate([b2, np.zeros((*b2.shape[:-2], 1, b2.shape[-1]), np.int64)], axis=-2)
    products = a2[..., :, :, None] * b2[..., None, :, :]  # [..., M, K, N]
    pairs = products[..., 0::2, :] + products[..., 1::2, :]
    raw = np.clip(pairs, -(1 << 15), (1 << 15) - 1).sum(axis=-2)
    a_zp = 0 if a_zp is None else int(a_zp.reshape(()))  # ORT runs only a scalar a_zp
    b_zp = np.zeros(()) if b_zp is None else b_zp.astype(np.int64)  # scalar or per column
    raw = raw - a_zp * b2.sum(axis=-2, keepdims=True) - b_zp * a2.sum(axis=-1, keepdims=True) + k * a_zp * b_zp
    return (raw.astype(np.int64).astype(np.int32).reshape(case.expected[0].shape),)


RULES: tuple[Rule, ...] = (
    Rule(lambda case, opset: case.op == "MatMulInteger" and _size(case, "a_zero_point") > 1,
         "onnxruntime refuses a zero point of A per row (\"input1 zero point must be a scalar or 1D tensor of size 1\")"
         "; the spec allows one per row"),
    Rule(lambda case, opset: case.op == "ConvInteger" and _size(case, "w_zero_point") > 1,
         "onnxruntime refuses a zero point of W per output channel (\"Non per-tensor quantization is not supported "
         "now\"); the spec allows one per output channel"),
    Rule(lambda case, opset: case.op == "MatMulInteger" and case.inputs["A"].shape[-1] == 0
         and _size(case, "a_zero_point") <= 1,
         "onnxruntime leaves MatMulInteger's output uninitialized when K = 0 (measured: values like 189059120); "
         "the spec's sum over no terms is 0"),
    Rule(lambda case, opset: case.op == "MatMulInteger" and case.inputs["A"].dtype == np.uint8
         and case.inputs["B"].dtype == np.int8 and _size(case, "a_zero_point") <= 1 and case.inputs["A"].shape[-1] > 0,
         "onnxruntime's u8s8 MatMulInteger kernel on x86 without VNNI saturates each sum of two products to int16 "
         "(vpmaddubsw; onnxruntime PR #12088); machines with VNNI give the spec's sums", _saturating_u8s8),
    Rule(lambda case, opset: case.op == "ConvInteger" and case.inputs["x"].dtype == np.int8
         and case.inputs["w"].dtype == np.uint8 and _size(case, "w_zero_point") <= 1,
         "onnxruntime's ConvInteger multiplies u8 W by s8 im2col(x) in its u8s8 kernel, which on x86 without VNNI "
         "saturates each sum of two products to int16 (onnxruntime PR #12088); machines with VNNI give the spec's "
         "sums"),
    Rule(lambda case, opset: case.op in ("QuantizeLinear", "DequantizeLinear") and case.attributes.get("block_size")
         and (case.inputs.get("y_scale") if case.op == "QuantizeLinear" else case.inputs["x_scale"]).size == 1,
         "onnxruntime refuses a blocked scale of one block (\"block_size must be 0 for per-tensor quantization\"); "
         "the spec allows any number of blocks"),
)


def difference(case: Case, opset: int) -> Difference | None:
    """ORT's known difference from the spec on ``case`` at ``opset``, or None."""
    for rule in RULES:
        if rule.applies(case, opset):
            answer = None if rule.answer is None else rule.answer(case)
            if answer is not None and all(np.array_equal(a, e) for a, e in zip(answer, case.expected, strict=True)):
                return None  # ORT's way gives the spec's outputs on this case
            return Difference(rule.reason, answer)
    return None
