"""Whether a model will run where it is deployed: what still blocks it on a runtime.

The runtime's stated lacks are checked on every op the model uses; where the runtime is installed,
the model is also loaded there and run once on a small synthesized input set, since only a load
tells of an op no lack names (a contrib op, a shape the runtime cannot infer).
"""

from __future__ import annotations

__all__ = ["Blockers", "blockers"]

import dataclasses
from collections.abc import Mapping

import onnx_ir as ir

from dql_pass import runtimes
from dql_pass.errors import one_line
from dql_pass.graph.walk import ops_used
from dql_pass.op import ai_onnx_opset
from dql_pass.verification.synthesis import Unsynthesizable, input_sets


@dataclasses.dataclass
class Blockers:
    """What keeps a model from running on ``runtime``; true when anything does."""

    runtime: str
    reasons: list[str]
    not_tried: str | None = None  # why the model was not loaded there, when it was not

    def __bool__(self) -> bool:
        return bool(self.reasons)


def blockers(model: ir.Model, runtime: str, dims: Mapping[str, int] | None = None) -> Blockers:
    """What keeps ``model`` from running on ``runtime``: its stated lacks, and its refusal to load or run it."""
    runner = runtimes.get(runtime)
    opset = ai_onnx_opset(model.opset_imports) or 0
    reasons = [lack.describe() for lack in runtimes.lacking(runtime, ops_used(model), opset)]
    if not runner.installed():
        return Blockers(runtime, reasons,
                        f"{runtime} is not installed, so only its stated lacks were checked; {runner.install_hint()}")
    try:
        feeds = next(iter(input_sets(model, 1, 0, {}, dims or {}).values()))
    except Unsynthesizable as reason:
        feeds, not_tried = None, f"loaded on {runtime} but not run: {reason}"
    else:
        not_tried = None
    try:
        session = runner.load(model)
    except runtimes.RuntimeTimeout as error:  # slow is not unable: not tried, not a blocker
        return Blockers(runtime, reasons, f"not checked whether {runtime} loads it: {one_line(error)}")
    except runtimes.RuntimeFailure as error:
        return Blockers(runtime, [*reasons, f"{runtime} cannot load it: {one_line(error)}"])
    if feeds is not None:
        try:
            session.run(feeds)
        except runtimes.RuntimeTimeout as error:
            not_tried = f"loaded on {runtime}, not checked whether it runs there: {one_line(error)}"
        except runtimes.RuntimeFailure as error:
            reasons.append(f"{runtime} loads it but cannot run it: {one_line(error)}")
    return Blockers(runtime, reasons, not_tried)
