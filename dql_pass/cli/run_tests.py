"""``dql-pass run-tests``: run_suite on one runtime, or run_matrix on several (with divergence reports)."""

from __future__ import annotations

import argparse
import os
import shlex
from typing import TYPE_CHECKING

from dql_pass.cli.output import note, say

if TYPE_CHECKING:
    from dql_pass.suites.matrix import Matrix


def run(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass
    from dql_pass.suites import matrix

    names = matrix.choose_runtimes(args.runtime)
    if len(names) > 1 or args.report_dir:
        return _run_matrix(args, names)
    report = dql_pass.run_suite(args.outdir, names[0], raw=args.raw,
                                progress=None if args.quiet else lambda outcome: print(outcome.line(), flush=True))
    say(args, report.format())
    if not report.ok and not args.quiet:
        again = ["dql-pass", "run-tests", args.outdir, "--runtime", names[0], *(["--raw"] if args.raw else [])]
        note(f"next: {shlex.join(again)} --report-dir DIR "
             "writes a report a runtime's maintainers can act on (each failing test's files, the differing bits)")
    return (0 if report.ok else 1), report.to_dict(raw=args.raw)


def _with_progress(args: argparse.Namespace, names: list[str]) -> Matrix:
    from pathlib import Path

    from dql_pass.cli.progress import Progress
    from dql_pass.suites import matrix
    from dql_pass.suites.layout import MODEL

    progress, done = Progress("run-tests"), dict.fromkeys(names, 0)
    total = sum(os.path.lexists(folder / MODEL) for folder in Path(args.outdir).iterdir() if folder.is_dir())

    def tick(runtime: str, outcome: object) -> None:
        progress(f"tests on {runtime}", done[runtime], total)
        done[runtime] += 1

    try:
        return matrix.run_matrix(args.outdir, names, raw=args.raw, progress=tick)
    finally:
        progress.close()


def _run_matrix(args: argparse.Namespace, names: list[str]) -> tuple[int, dict]:
    from dql_pass.suites import divergence, matrix

    if args.report_dir:
        divergence.check_report_dir(args.report_dir)
    if args.verbose:  # every test's line
        found = matrix.run_matrix(args.outdir, names, raw=args.raw,
                                  progress=lambda runtime, outcome: print(f"{runtime}: {outcome.line()}", flush=True))
    elif args.quiet:
        found = matrix.run_matrix(args.outdir, names, raw=args.raw)
    else:  # a runtime may take minutes over a suite (IREE compiles every model): a line every few seconds
        found = _with_progress(args, names)
    say(args, found.format())
    written = divergence.write_reports(args.report_dir, args.outdir, found) if args.report_dir else []
    for path in written:
        say(args, f"wrote the divergence report {path}")
    if not found.ok and not args.quiet and not args.verbose:
        note("next: -v lists every test as it runs" + ("" if written else
             "; --report-dir DIR writes a report a runtime's maintainers can act on for each failing runtime and op"))
    return (0 if found.ok else 1), found.to_dict(raw=args.raw, reports=written)
