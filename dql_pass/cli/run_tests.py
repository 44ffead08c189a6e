"""``dql-pass run-tests``: run_suite on one runtime, or run_matrix on several (with divergence reports)."""

from __future__ import annotations

import argparse
import functools
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from dql_pass.cli.output import note, say

if TYPE_CHECKING:
    from dql_pass.suites.run import Outcome


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


def _run_matrix(args: argparse.Namespace, names: list[str]) -> tuple[int, dict]:
    from dql_pass.cli.progress import Progress
    from dql_pass.suites import divergence, matrix
    from dql_pass.suites.run import test_folders

    if args.report_dir:
        divergence.check_report_dir(args.report_dir)
    bar = None
    if args.verbose:  # every test's line
        def progress(runtime: str, outcome: Outcome) -> None:
            print(f"{runtime}: {outcome.line()}", flush=True)
    elif args.quiet:
        progress = None
    else:  # a runtime may take minutes over a suite (IREE compiles every model): a line every 2 s
        bar, done = Progress("run-tests"), dict.fromkeys(names, 0)
        # Counted at the first outcome: run_suite has found the folder a suite by then.
        total = functools.cache(lambda: len(test_folders(Path(args.outdir))))

        def progress(runtime: str, outcome: Outcome) -> None:
            bar(f"tests on {runtime}", done[runtime], total())
            done[runtime] += 1
    try:
        found = matrix.run_matrix(args.outdir, names, raw=args.raw, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    say(args, found.format())
    written = divergence.write_reports(args.report_dir, args.outdir, found) if args.report_dir else []
    for path in written:
        say(args, f"wrote the divergence report {path}")
    if not found.ok and not args.quiet and not args.verbose:
        note("next: -v lists every test as it runs" + ("" if written else
             "; --report-dir DIR writes a report a runtime's maintainers can act on for each failing runtime and op"))
    return (0 if found.ok else 1), found.to_dict(raw=args.raw, reports=written)
