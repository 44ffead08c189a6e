"""Every way of running a model, behind one small interface, and what each runtime lacks, as data.

Each adapter is one module and one :class:`~dql_pass.runtimes.base.Runtime` subclass; comparing
runtimes is one loop over :data:`RUNTIMES`. Adapters import their runtime only when a model is
loaded, so listing them, reading their limits and picking a target cost no runtime import.
"""

from __future__ import annotations

__all__ = [
    "ELSEWHERE", "RUNTIMES", "TIMEOUT_OPTION", "ComputedOtherwise", "Elsewhere", "InexactProduct", "KnownDifference",
    "Lack", "Runtime", "RuntimeFailure", "RuntimeTimeout", "Session", "get", "lacking", "refused",
]

from collections.abc import Iterable

from dql_pass.errors import InputError
from dql_pass.runtimes.base import (
    TIMEOUT_OPTION, ComputedOtherwise, InexactProduct, KnownDifference, Lack, Runtime, RuntimeFailure, RuntimeTimeout,
    Session, refused,
)
from dql_pass.runtimes.elsewhere import ELSEWHERE, Elsewhere
from dql_pass.runtimes.iree import Iree
from dql_pass.runtimes.litert import LiteRt, LiteRtXnnpack
from dql_pass.runtimes.mnn import Mnn
from dql_pass.runtimes.openvino import OpenVino
from dql_pass.runtimes.ort import OnnxRuntime, OnnxRuntimeCuda
from dql_pass.runtimes.reference import OnnxReference
from dql_pass.runtimes.tinygrad import Tinygrad
from dql_pass.runtimes.torch import OnnxToPytorch, OnnxToTorch
from dql_pass.runtimes.tract import Tract
from dql_pass.runtimes.tvm import Tvm
from dql_pass.runtimes.web import Wasm, WebGpu

RUNTIMES: dict[str, Runtime] = {
    runtime.name: runtime
    for runtime in (
        OnnxRuntime(),
        OnnxRuntimeCuda(),
        OnnxReference(),
        Tract(),
        OpenVino(),
        Tinygrad(),
        Tvm(),
        Iree(),
        OnnxToTorch(),
        OnnxToPytorch(),
        WebGpu(),
        Wasm(),
        LiteRt(),
        LiteRtXnnpack(),
        Mnn(),
    )
}


def get(name: str) -> Runtime:
    """The runtime called ``name``; :class:`InputError` naming the known ones otherwise."""
    if name in ELSEWHERE:
        other = ELSEWHERE[name]
        raise InputError(
            f"{other.title} has no adapter here, so it cannot be a target: it lacks {', '.join(other.lacks)} "
            f"({other.source}); for it run `dql-pass lower INPUT -o OUTPUT` with no --target, which leaves none of "
            f"them (`dql-pass advise INPUT --runtime {name}` says what a model needs there)"
        )
    if name not in RUNTIMES:
        raise InputError(f"unknown runtime {name!r}; choose from {', '.join(RUNTIMES)}; "
                         f"without an adapter: {', '.join(ELSEWHERE)} (`dql-pass advise --list-targets`)")
    return RUNTIMES[name]


def _schema_version(domain: str, op_type: str, opset: int) -> int | None:
    import onnx  # here: listing the runtimes needs no graph library

    try:
        return onnx.defs.get_schema(op_type, opset, domain).since_version
    except onnx.defs.SchemaError:
        return None


def lacking(runtime: str, ops: Iterable[tuple[str, str]], opset: int) -> list[Lack]:
    """What ``runtime`` lacks of ops ``(domain, op_type)`` at ai.onnx ``opset``."""
    wanted = set(ops)
    return [
        lack for lack in get(runtime).lacks
        if (lack.domain, lack.op_type) in wanted
        and (_schema_version(lack.domain, lack.op_type, opset) or 0) >= lack.since_version
    ]
