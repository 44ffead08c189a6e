"""A suite run on several runtimes, counted per op x runtime: passed, failed, known differences, skipped and why.

A runtime that is not installed is one row of skips with what installs it; one that is runs every
folder through :func:`dql_pass.suites.run.run_suite`.
"""

from __future__ import annotations

__all__ = ["Matrix", "Row", "choose_runtimes", "run_matrix"]

import collections
import dataclasses
import os
from collections.abc import Callable, Sequence

from dql_pass import runtimes
from dql_pass.errors import InputError
from dql_pass.suites.run import Outcome, RunReport, run_suite


@dataclasses.dataclass(frozen=True)
class Row:
    """The outcomes of one op on one runtime: counts, and the reasons of its skips with how many each."""

    op: str
    runtime: str
    passed: int = 0
    failed: int = 0
    xfail: int = 0
    skipped: int = 0
    why_skipped: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Matrix:
    """Every runtime's report (None for one not installed, with the reason in its rows)."""

    reports: dict[str, RunReport | None]
    rows: list[Row]

    @property
    def ok(self) -> bool:
        return all(row.failed == 0 for row in self.rows) and any(row.passed for row in self.rows)

    def table(self) -> str:
        header = ("op", "runtime", "passed", "failed", "xfail", "skipped", "skipped because")
        lines = [header] + [
            (row.op, row.runtime, str(row.passed), str(row.failed), str(row.xfail), str(row.skipped),
             "; ".join(f"{n} x {why}" for why, n in row.why_skipped.items()))
            for row in self.rows
        ]
        widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
        return "\n".join(
            "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
            + "  " + line[-1]
            for line in lines
        ).rstrip()

    def format(self) -> str:
        return self.table()

    def to_dict(self, raw: bool = False, reports: Sequence[os.PathLike] = ()) -> dict:
        """``raw``: whether the runs ignored the manifest's known differences; ``reports``: the divergence
        reports written of it."""
        return {"raw": raw, "ok": self.ok, "rows": [dataclasses.asdict(row) for row in self.rows],
                "reports": [os.fspath(path) for path in reports],
                "outcomes": {name: [outcome.to_dict() for outcome in report.outcomes]
                             for name, report in self.reports.items() if report is not None}}


def choose_runtimes(text: str) -> list[str]:
    """``all`` (every adapter) or a comma-separated list of runtime names, checked against the registry."""
    if text.strip() == "all":
        return list(runtimes.RUNTIMES)
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        runtimes.get(name)
    if not names:
        raise InputError("choose at least one runtime")
    return names


def _short(reason: str) -> str:
    return reason if len(reason) <= 100 else reason[:97] + "..."


def _rows(runtime: str, outcomes: Sequence[Outcome]) -> list[Row]:
    by_op: dict[str, list[Outcome]] = collections.defaultdict(list)
    for outcome in outcomes:
        by_op[outcome.op].append(outcome)
    rows = []
    for op, found in by_op.items():
        status = collections.Counter(o.status for o in found)
        why = collections.Counter(_short(o.detail) for o in found if o.status == "SKIP")
        rows.append(Row(op, runtime, status["PASS"], status["FAIL"], status["XFAIL"], status["SKIP"],
                        dict(why.most_common())))
    return rows


def run_matrix(
    outdir: str | os.PathLike, names: Sequence[str], *, raw: bool = False,
    progress: Callable[[str, Outcome], None] | None = None,
) -> Matrix:
    """Run the suite in ``outdir`` on each runtime of ``names``; one not installed is skipped with what installs it."""
    reports: dict[str, RunReport | None] = {}
    rows: list[Row] = []
    for name in names:
        runtime = runtimes.get(name)
        if not runtime.installed():
            reports[name] = None
            rows.append(Row("*", name, why_skipped={f"not installed: {runtime.install_hint()}": 1}))
            continue
        report = run_suite(outdir, name, raw=raw,
                           progress=None if progress is None else lambda o, n=name: progress(n, o))
        reports[name] = report
        rows += _rows(name, report.outcomes)
    rows.sort(key=lambda row: (row.op, names.index(row.runtime)))
    return Matrix(reports, rows)
