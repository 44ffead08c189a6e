"""What verify found, as data: one row per site, one per final output, and the verdict.

Rules: PASS only when every site was checked and the model level compared something, with no
mismatch; a mismatch anywhere is FAIL; anything not checked without a mismatch is INCOMPLETE. A
difference that the runtime REWRITTEN ran on states for those inputs is a known difference: listed
and counted, not a mismatch. A site model that the runtime cannot load, where ORT runs it, is not
checked there (the runtime's reason, whole), not a mismatch: the runtime may refuse a piece of a
model it runs whole.
The exit code is 0 for PASS only.
"""

from __future__ import annotations

__all__ = ["OutputResult", "SiteResult", "Tally", "VerifyReport", "counted", "verdict"]

import dataclasses
import math
from collections.abc import Iterable

from dql_pass.compare import SiteDifference
from dql_pass.inputs import describe


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless the count is 1: "1 site", "3 sites"."""
    return f"{count} {noun}{'s' * (count != 1)}"


@dataclasses.dataclass
class SiteResult:
    """One DQL site of ORIGINAL: how many inputs it ran and what went wrong."""

    name: str
    graph: str
    cases: int = 0
    mismatches: int = 0
    worst_case: str | None = None
    worst_class: str | None = None
    detail: str | None = None
    # Mismatches by input class (dql_pass.inputs.CLASSES, or "no class"; a case counts under each of its
    # classes), "model input" (the model level) or "lost output".
    classes: dict[str, int] = dataclasses.field(default_factory=dict)
    known: dict[str, int] = dataclasses.field(default_factory=dict)  # the runtime's stated differences, by reason
    model_level: str = ""
    not_reachable: str | None = None
    not_checked: str | None = None  # why its cases did not all run on the runtime REWRITTEN runs on
    block: str | None = None  # what was checked of a site lower kept in float32, in place of y and y_zero_point
    dropped: str | None = None  # why a site REWRITTEN drops needs no check: no graph output of ORIGINAL depends on it
    unread: str | None = None  # the outputs of a live site that nothing reads and REWRITTEN dropped: not checked
    form: str | None = None  # what REWRITTEN computes a DQL site with, read off its ops: "native" or a variant

    @property
    def passed(self) -> bool:
        return self.mismatches == 0 and self.not_reachable is None and self.not_checked is None


class Tally:
    """Counts the mismatches of one row (a DQL site or a lowered op) and keeps the most severe."""

    def __init__(self, result: SiteResult):
        self.result = result
        self.worst: SiteDifference | None = None

    def add(
        self, case: str, classes: str | Iterable[str], diff: SiteDifference | None, *, run: bool = True,
        known: str | None = None,
    ) -> None:
        """One case run: a mismatch counts under each of the case's ``classes`` (a DQL site's input
        classes of :mod:`dql_pass.inputs`, ``model input`` at the model level, ``lost output``; a
        lowered op's operand class, one string)."""
        self.result.cases += run
        if diff is None:
            return
        if known is not None:  # the runtime's stated difference: counted apart, never a pass in disguise
            self.result.known[known] = self.result.known.get(known, 0) + 1
            return
        self.result.mismatches += 1
        classes = [classes] if isinstance(classes, str) else sorted(classes)
        for name in classes or [describe(classes)]:
            self.result.classes[name] = self.result.classes.get(name, 0) + 1
        if self.worst is None or diff.severity > self.worst.severity:
            self.worst = diff
            self.result.worst_case, self.result.worst_class, self.result.detail = case, describe(classes), diff.detail


@dataclasses.dataclass
class OutputResult:
    """One final output of ORIGINAL compared with REWRITTEN over all input sets."""

    name: str
    identical: bool
    differing: int = 0
    max_abs: float | None = None
    max_rel: float | None = None
    detail: str | None = None


@dataclasses.dataclass(kw_only=True)
class VerifyReport:
    """Everything verify found; :meth:`format` prints it, :meth:`to_dict` is the JSON form.

    The verdict (:func:`verdict`) is decided by the sites' rows, the final outputs, ``model_error``
    (REWRITTEN did not run: a mismatch), ``kept_differences`` and ``input_differences`` (each a mismatch),
    ``model_not_checked`` (why the model level compared nothing: an input that cannot be
    synthesized, ORIGINAL that ORT cannot load, input sets that give no element to compare;
    INCOMPLETE at best), ``narrowed`` (nodes REWRITTEN computes in float16 that the runtime computes in float32:
    no value through them is checked; INCOMPLETE at best) and ``cannot_run``
    (the runtime runs neither model: its own verdict). The other fields describe what was run.
    """

    original: str
    rewritten: str
    zero_range: str
    sites: list[SiteResult]
    outputs: list[OutputResult]
    input_sets: list[str]
    model_error: str | None = None
    seconds: float = 0.0
    notes: list[str] = dataclasses.field(default_factory=list)
    model_not_checked: str | None = None
    narrowed: str | None = None
    runtime: str = "onnxruntime"
    # Constant inputs and attributes of nodes REWRITTEN keeps that differ from ORIGINAL's: each a mismatch.
    kept_differences: list[str] = dataclasses.field(default_factory=list)
    # Graph inputs of ORIGINAL that REWRITTEN does not take, takes otherwise, or no longer reads: each a mismatch.
    input_differences: list[str] = dataclasses.field(default_factory=list)
    dims: dict[str, int] = dataclasses.field(default_factory=dict)  # the size each symbolic dimension took
    # The runtime runs neither REWRITTEN nor ORIGINAL (its reason, whole): its verdict, not a FAIL of the rewrite.
    cannot_run: str | None = None
    # With another runtime: REWRITTEN there against ORIGINAL on ORT, how far the deployed model is; apart from the
    # verdict.
    from_ort: list[OutputResult] = dataclasses.field(default_factory=list)

    @property
    def mismatches(self) -> int:
        return (sum(s.mismatches for s in self.sites) + sum(not o.identical for o in self.outputs)
                + bool(self.model_error) + len(self.kept_differences) + len(self.input_differences))

    @property
    def passed(self) -> bool:
        """No mismatch, every site checked, and the model level compared something (see :func:`verdict`)."""
        return self.verdict == "PASS"

    @property
    def verdict(self) -> str:
        return verdict(mismatches=self.mismatches, sites_checked=all(s.passed for s in self.sites),
                       not_checked=self.model_not_checked or self.narrowed, cannot_run=self.cannot_run)

    @property
    def exit_code(self) -> int:
        """0 for PASS, 3 when the runtime cannot run the models at all, else 1."""
        return {"PASS": 0, "CANNOT RUN": 3}.get(self.verdict, 1)

    def __bool__(self) -> bool:
        # `assert dql_pass.verify(a, b)` holds only for a PASS.
        return self.passed

    def __repr__(self) -> str:
        return f"<VerifyReport {self.summary}>"

    @property
    def summary(self) -> str:
        checked = [s for s in self.sites if s.not_reachable is None]
        unreachable = len(self.sites) - len(checked)
        identical = sum(o.identical for o in self.outputs)
        sets, sites = counted(len(self.input_sets), "input set"), counted(len(self.sites), "site")
        text = (
            f"{self.verdict}: {sites}, {sum(s.cases for s in self.sites)} cases, "
            f"{sum(s.mismatches for s in self.sites)} site mismatches; final outputs {identical} of "
            f"{len(self.outputs)} bit-identical over {sets}{self._shapes()}; "
            f"zero range {self.zero_range}; {self.seconds:.2f} s"
        )
        if self.runtime != "onnxruntime":
            known = sum(sum(s.known.values()) for s in self.sites)
            text += f"; REWRITTEN on {self.runtime}"  # whether it ran there, the rest says
            text += f", {known} known differences of {self.runtime}" if known else ""
        if unreachable:
            text += f"; {counted(unreachable, 'site')} not reachable, not checked"
        unchecked = sum(s.not_checked is not None for s in checked)
        if unchecked:
            text += f"; {counted(unchecked, 'site')} not checked on {self.runtime}"
        if self.kept_differences:
            text += f"; {len(self.kept_differences)} constants, attributes, types or places of kept nodes differ"
        if self.input_differences:
            text += f"; {counted(len(self.input_differences), 'graph input')} of ORIGINAL taken otherwise"
        if self.model_not_checked:
            text += f"; model level not checked: {self.model_not_checked}"
        if self.narrowed:
            text += f"; not checked on {self.runtime}: {self.narrowed}"
        if self.model_error:
            text += f"; {self.model_error}"
        return text

    def _shapes(self) -> str:
        return f" ({', '.join(f'{name}={size}' for name, size in self.dims.items())})" if self.dims else ""

    def format(self) -> str:
        lines = self._table() + self._site_lines() + self._known_lines()
        inside = [s.name for s in self.sites if s.graph != "main" and s.not_reachable is None and not s.dropped]
        if inside:
            lines.append(
                f"model level: {counted(len(inside), 'site')} inside subgraphs or functions "
                f"({', '.join(inside)}) {'were' if len(inside) != 1 else 'was'} checked on the catalogue only; their "
                "values cannot be graph outputs"
            )
        lines += [f"kept node changed: {difference}" for difference in self.kept_differences]
        lines += [f"graph input changed: {difference}" for difference in self.input_differences]
        lines += [f"final output {o.name!r} differs: {o.detail}" for o in self.outputs if not o.identical]
        if self.cannot_run:
            lines.append(f"cannot run: {self.cannot_run}")
        for o in self.from_ort:
            distance = "bit-identical" if o.identical else o.detail
            lines.append(f"from ORT: final output {o.name!r} on {self.runtime} against ORIGINAL on ORT: {distance}")
        lines += [f"note: {note}" for note in self.notes]
        lines.append(self.summary)
        return "\n".join(lines)

    def _table(self) -> list[str]:
        """One row per site, the columns aligned."""
        rows = [("site", "graph", "cases", "mismatches", "worst case (input class)")]
        for s in self.sites:
            worst = "-" if s.worst_case is None else f"{s.worst_case} ({s.worst_class})"
            mismatches = "not reachable" if s.not_reachable else str(s.mismatches)
            rows.append((s.name, s.graph, str(s.cases), mismatches, worst))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]

    def _site_lines(self) -> list[str]:
        """What each site's row cannot say: why it was not reached or checked, its block, its mismatch."""
        lines = []
        for s in self.sites:
            if s.not_reachable:
                lines.append(f"not reachable: {s.name} in {s.graph}: {s.not_reachable}")
            if s.not_checked:
                lines.append(f"not checked: {s.name} in {s.graph}: {s.not_checked}")
            if s.block:
                lines.append(f"block: {s.name} in {s.graph}: {s.block}")
            if s.dropped:
                lines.append(f"dropped: {s.name} in {s.graph}: {s.dropped}")
            if s.unread:
                lines.append(f"unread: {s.name} in {s.graph}: {s.unread}")
            if s.not_reachable is None and s.mismatches:
                ranked = sorted(s.classes.items(), key=lambda item: -item[1])  # stable: ties in the order seen
                classes = ", ".join(f"{name} {count}" for name, count in ranked)
                lines.append(f"mismatch: {s.name} in {s.graph}: {s.detail}; failing input classes: {classes}")
        return lines

    def _known_lines(self) -> list[str]:
        """The runtime's known differences: one line per reason, whatever the number of sites."""
        known: dict[str, list[int]] = {}  # reason: [sites, cases]
        for s in self.sites:
            for reason, count in s.known.items():
                tally = known.setdefault(reason, [0, 0])
                tally[0], tally[1] = tally[0] + 1, tally[1] + count
        return [f"known difference of {self.runtime}, {cases:,} cases at {counted(sites, 'site')}: {reason}"
                for reason, (sites, cases) in known.items()]

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        for output in data["outputs"] + data["from_ort"]:
            for key in ("max_abs", "max_rel"):
                if output[key] is not None and not math.isfinite(output[key]):
                    output[key] = str(output[key])  # JSON has no inf
        return {
            **data,
            "passed": self.passed,
            "verdict": self.verdict,
            "mismatches": self.mismatches,
            "summary": self.summary,
        }


def verdict(*, mismatches: int, sites_checked: bool, not_checked: str | None, cannot_run: str | None) -> str:
    """PASS when nothing differs, every site was checked and nothing else is ``not_checked``;
    FAIL on any mismatch; else CANNOT RUN where the runtime running neither model is all that kept
    the check from a PASS, and INCOMPLETE otherwise."""
    if not mismatches and sites_checked and not_checked is None:
        return "PASS"
    if mismatches:
        return "FAIL"
    return "CANNOT RUN" if cannot_run and sites_checked else "INCOMPLETE"
