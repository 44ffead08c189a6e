"""What each runtime cannot run, as data read without importing the runtime.

Each entry names an op version a runtime has no kernel for, the runtime versions it was measured
on, and what the runtime said. A version of the runtime newer than the ones measured is assumed to
lack it too, until it is measured: refusing a model that would run costs a flag, while writing one
that does not load costs the user a deployment.
"""

from __future__ import annotations

__all__ = ["RUNTIMES", "Lack", "lacking"]

import dataclasses
from collections.abc import Iterable

import onnx


@dataclasses.dataclass(frozen=True)
class Lack:
    """An op that ``runtime`` cannot run from ``since_version`` of its schema on."""

    runtime: str
    op_type: str
    since_version: int
    measured: str
    reason: str
    domain: str = ""

    def describe(self) -> str:
        return f"{self.op_type}-{self.since_version} does not run on {self.runtime} ({self.measured}): {self.reason}"


RUNTIMES: tuple[str, ...] = ("onnxruntime", "reference")

_LACKS: tuple[Lack, ...] = (
    Lack("onnxruntime", "QuantizeLinear", 28, "1.32.0",
         "no CPU kernel for QuantizeLinear(28); session creation fails with NOT_IMPLEMENTED"),
)


def _schema_version(domain: str, op_type: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None


def lacking(runtime: str, ops: Iterable[tuple[str, str]], opset: int) -> list[Lack]:
    """The entries of ``runtime`` that ops ``(domain, op_type)`` hit at ai.onnx ``opset``."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose from {RUNTIMES}")
    wanted = set(ops)
    return [
        lack for lack in _LACKS
        if lack.runtime == runtime and (lack.domain, lack.op_type) in wanted
        and (_schema_version(lack.domain, lack.op_type, opset) or 0) >= lack.since_version
    ]
