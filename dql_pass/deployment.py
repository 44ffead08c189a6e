"""Whether a model that expand or lower wrote for a target (``--target``) runs there, as a report.

The target's stated lacks are records (:class:`dql_pass.runtimes.Lack`) and are matched by their
fields; what the runtime said when it refused the model is only ever shown, never parsed.
"""

from __future__ import annotations

__all__ = ["TargetCheck", "check_target", "checking"]

import dataclasses
from collections.abc import Mapping

from dql_pass import runtimes
from dql_pass.files import load_model
from dql_pass.graph.walk import ops_used
from dql_pass.lowering import LOWERED  # the ops lower turns into float ones
from dql_pass.op import ai_onnx_opset
from dql_pass.runtimes.base import Lack
from dql_pass.verification.deployable import Blockers, blockers


@dataclasses.dataclass
class TargetCheck:
    """What keeps the model ``output``, written by ``command`` from ``source``, from running on ``target``:
    its stated ``lacks``, and ``found`` (those and what the runtime refused); ``off_accelerator``: the
    integer ops it still holds that the target runs on the CPU. True when anything blocks it."""

    command: str
    source: str
    output: str
    target: str
    lacks: list[Lack]
    found: Blockers
    off_accelerator: list[str]

    def __bool__(self) -> bool:
        return bool(self.found)

    def format(self, quiet: bool = False) -> str:
        """The lines for stderr, each prefixed ``dql-pass: ``; ``quiet`` leaves out the verdict."""
        lines = []
        if self.found.not_tried is None and not quiet:
            lines.append(f"{self.target}: {'refused it' if self.found else 'loads and runs it'}")
        stated = {lack.describe() for lack in self.lacks}
        # lower's own report has said the stated lacks already.
        told = stated if self.command == "lower" else set()
        lines += [f"still blocks {self.target}: {reason}" for reason in self.found.reasons if reason not in told]
        if self.found.not_tried:
            lines.append(f"note: {self.found.not_tried}")
        if self.command == "expand":
            lines += self._point_to_lower()
        return "\n".join(f"dql-pass: {line}" for line in lines)

    def _point_to_lower(self) -> list[str]:
        """Name `lower` when the target lacks integer ops the model still has, or runs them off its
        accelerator (webgpu sends them to the CPU)."""
        lines = []
        if self.off_accelerator:
            lines.append(f"note: {', '.join(self.off_accelerator)} still run on the CPU, not on {self.target}: it has "
                         "no kernel for them")
        if self.off_accelerator or any(lack.op_type in LOWERED for lack in self.lacks):
            lines.append(f"`dql-pass lower {self.source} -o OUTPUT --target {self.target}` turns the integer ops into "
                         "float ones")
        return lines

    def to_dict(self) -> dict:
        return {"blockers": self.found.reasons}


def checking(output: str, target: str) -> str | None:
    """The line to show before the check when it loads the model on the target (it takes a while)."""
    runtime = runtimes.get(target)
    if not runtime.installed():
        return None
    return f"dql-pass: checking {output} on {target}{f' ({runtime.where})' if runtime.where else ''}..."


def check_target(command: str, source: str, output: str, target: str,
                 dims: Mapping[str, int] | None = None) -> TargetCheck:
    """Check the model ``output`` that ``command`` wrote from ``source`` on ``target``."""
    model = load_model(output)
    used = ops_used(model)
    lacks = runtimes.lacking(target, used, ai_onnx_opset(model.opset_imports) or 0)
    found = blockers(model, target, dims)
    off = sorted({op for domain, op in used if domain == ""} & set(LOWERED) & set(runtimes.get(target).no_kernel))
    return TargetCheck(command, source, output, target, lacks, found, off)
