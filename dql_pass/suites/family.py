"""The dynamic-quantization family beside DynamicQuantizeLinear: one registry of ops, their versions, their cases.

- :data:`REGISTRY` holds each op with its case builder; its opsets are the versions onnx's schemas
  give it (``since_version``), up to :data:`NEWEST_OPSET`.
- :func:`write_cases` writes one test folder per (case, opset) in ONNX's backend-test layout: the
  data inputs as graph inputs with their ``input_N.pb``, scales, zero points and weights as
  initializers (as in a QDQ or ``quantize_dynamic`` model), the expected outputs from
  :mod:`dql_pass.reference`.
- Where onnxruntime knowingly differs from the spec (:mod:`dql_pass.suites.family_ort`), the
  folder also holds ORT's answer under ``answer_onnxruntime/``, and its manifest entry says why.
- What a runtime cannot run (:func:`dql_pass.runtimes.lacking`) is listed in the entry's ``lacks``;
  run-tests skips it there with the reason.
"""

from __future__ import annotations

__all__ = ["NEWEST_OPSET", "REGISTRY", "FamilyOp", "check_ops", "opsets_of", "write_cases"]

import dataclasses
import json
import logging
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dql_pass import runtimes
from dql_pass.errors import InputError
from dql_pass.op import NAME, version
from dql_pass.suites import family_ort
from dql_pass.suites.family_cases import SIZES, Case, dequantize_linear_cases, quantize_linear_cases
from dql_pass.suites.family_integer import conv_integer_cases, matmul_integer_cases
from dql_pass.suites.layout import DATA, DATA_SET, MODEL, SuiteEntry

logger = logging.getLogger(__name__)

# The newest opset written: onnxruntime 1.32 has no QuantizeLinear-28 or DequantizeLinear-28 kernel.
NEWEST_OPSET = 25
ANSWER = "answer_{runtime}"  # the folder of a runtime's known answer, beside test_data_set_0


@dataclasses.dataclass(frozen=True)
class FamilyOp:
    """An op of the family: its type and what builds its cases (from a size, :data:`SIZES`)."""

    op_type: str
    cases: Callable[[str], list[Case]]


REGISTRY: dict[str, FamilyOp] = {op.op_type: op for op in (
    FamilyOp("MatMulInteger", matmul_integer_cases),
    FamilyOp("ConvInteger", conv_integer_cases),
    FamilyOp("QuantizeLinear", quantize_linear_cases),
    FamilyOp("DequantizeLinear", dequantize_linear_cases),
)}


def opsets_of(op_type: str) -> list[int]:
    """The opsets at which ``op_type`` changed, by onnx's schemas, up to :data:`NEWEST_OPSET`."""
    found = set()
    for opset in range(1, NEWEST_OPSET + 1):
        try:
            found.add(onnx.defs.get_schema(op_type, opset, "").since_version)
        except onnx.defs.SchemaError:
            continue
    return sorted(found)


def check_ops(ops: Collection[str]) -> list[str]:
    """The chosen op types in the registry's order, DynamicQuantizeLinear first; a refusal naming the known ones."""
    known = [NAME, *REGISTRY]
    unknown = sorted(set(ops) - set(known))
    if unknown:
        raise InputError(f"no conformance suite for op {unknown[0]!r}; choose from {', '.join(known)}")
    if not ops:
        raise InputError(f"choose at least one op from {', '.join(known)}")
    return [op for op in known if op in ops]


def _model(case: Case, opset: int, name: str) -> onnx.ModelProto:
    names = list(case.inputs)
    while names and case.inputs[names[-1]] is None:  # trailing optional inputs left out
        names.pop()
    fed = [n for n in names if case.inputs[n] is not None and n not in case.constants]
    constants = [numpy_helper.from_array(case.inputs[n], n) for n in names
                 if n in case.constants and case.inputs[n] is not None]

    def info(value_name: str, array: np.ndarray) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(value_name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)

    node = helper.make_node(case.op, [n if case.inputs[n] is not None else "" for n in names], ["y"], **case.attributes)
    graph = helper.make_graph([node], name, [info(n, case.inputs[n]) for n in fed], [info("y", case.expected[0])],
                              constants)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets),
                              producer_name="dql_pass", producer_version=version())
    model.doc_string = case.description
    return model


def _write_outputs(folder: Path, arrays: Sequence[np.ndarray]) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for i, array in enumerate(arrays):
        (folder / f"output_{i}.pb").write_bytes(numpy_helper.from_array(np.asarray(array), "y").SerializeToString())
    return [f"{folder.name}/output_{i}.pb" for i in range(len(arrays))]


def _write_folder(stage: Path, case: Case, opset: int) -> SuiteEntry:
    folder_name = f"test_{case.op.lower()}_{case.name}_opset{opset}"
    folder = stage / folder_name
    model = _model(case, opset, folder_name)
    onnx.checker.check_model(model, full_check=True)
    (folder / DATA_SET).mkdir(parents=True)
    (folder / MODEL).write_bytes(model.SerializeToString())
    (folder / DATA).write_text(json.dumps({"atol": 0, "rtol": 0}) + "\n")
    files = [MODEL, DATA, DATA_SET]
    for i, value in enumerate(model.graph.input):
        (folder / DATA_SET / f"input_{i}.pb").write_bytes(
            numpy_helper.from_array(case.inputs[value.name], value.name).SerializeToString())
        files.append(f"{DATA_SET}/input_{i}.pb")
    files += _write_outputs(folder / DATA_SET, case.expected)
    known: dict[str, str] = {}
    answers: dict[str, list[str]] = {}
    difference = family_ort.difference(case, opset)
    if difference is not None:
        known["onnxruntime"] = difference.reason
        if difference.answer is not None:
            answer = ANSWER.format(runtime="onnxruntime")
            answers["onnxruntime"] = _write_outputs(folder / answer, difference.answer)
            files += [answer, *answers["onnxruntime"]]
    lacks = {name: "; ".join(lack.describe() for lack in found) for name in runtimes.RUNTIMES
             if (found := _lacking(name, case, opset))}
    first = next(a for a in case.inputs.values() if a is not None)
    return SuiteEntry(
        name=case.name, folder=folder_name, category=case.op, opset=opset, variant="native", policy="spec",
        description=case.description, shape=tuple(first.shape), policy_dependent=False, comparable=case.comparable,
        known_differences=known, op=case.op, files=files, answers=answers, lacks=lacks,
    )


def _lacking(runtime: str, case: Case, opset: int) -> list[runtimes.Lack]:
    """What ``runtime`` lacks to run ``case``: a lack that constant operands lift does not count where they are
    constants."""
    names = list(case.inputs)
    return [lack for lack in runtimes.lacking(runtime, {("", case.op)}, opset)
            if not (lack.unless_constant and all(names[i] in case.constants for i in lack.unless_constant))]


def write_cases(stage: Path, ops: Sequence[str], opsets: Collection[int] | None, size: str) -> list[SuiteEntry]:
    """Write every case of ``ops`` (family ops of :data:`REGISTRY`) at each of their opsets (those in ``opsets``
    when given) in ``stage``; the manifest entries."""
    if size not in SIZES:
        raise InputError(f"unknown suite size {size!r}; choose from {', '.join(SIZES)}")
    entries = []
    for op in ops:
        versions = [v for v in opsets_of(op) if opsets is None or v in opsets]
        if not versions:
            raise InputError(f"{op} changed at opsets {', '.join(map(str, opsets_of(op)))} only; choose one of those")
        cases = REGISTRY[op].cases(size)
        for opset in versions:
            written = [_write_folder(stage, case, opset) for case in cases
                       if case.since <= opset <= (case.until or opset)]
            entries += written
            logger.info("wrote %d %s cases at opset %d", len(written), op, opset)
    return entries
