"""verify run from the command line: its progress on stderr (run-tests shows its own the same way), and its
report on stdout."""

from __future__ import annotations

__all__ = ["Progress", "show", "verify_with_progress"]

import argparse
import shlex
import sys
import time
from typing import TYPE_CHECKING, Any

from dql_pass.cli.output import note, say

if TYPE_CHECKING:
    from dql_pass.verification import VerifyReport


class Progress:
    """A command's progress on stderr, as the field shows it: a bar per stage where stderr is a
    terminal (tqdm), a plain line every couple of seconds elsewhere (a log, CI), nothing under -q."""

    _EVERY = 2.0  # seconds between plain lines; the first comes once the command has taken that long

    def __init__(self, command: str = "verify") -> None:
        self._command = command
        self._start = self._last = time.monotonic()
        self._bar = None
        self._stage: str | None = None
        self._terminal = sys.stderr.isatty()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self._terminal:
            from tqdm import tqdm

            if stage != self._stage:
                self.close()
                self._stage = stage
                self._bar = tqdm(total=total, desc=f"{self._command}: {stage}", unit="", leave=False)
            self._bar.update(done + 1 - self._bar.n)
            return
        now = time.monotonic()
        if now - self._last >= self._EVERY:
            print(f"dql-pass: {self._command}: {stage} {done + 1} of {total} ({now - self._start:.0f} s)",
                  file=sys.stderr, flush=True)
            self._last = now

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def verify_with_progress(args: argparse.Namespace, original: Any, rewritten: Any, **options: Any) -> VerifyReport:
    import dql_pass

    progress = None if args.quiet else Progress()
    try:
        return dql_pass.verify(original, rewritten, progress=progress, **options)
    finally:
        if progress is not None:
            progress.close()


def _other_forms(report: VerifyReport) -> list[str]:
    """The forms of the sites that had known differences where they are not the runtime's target variant."""
    from dql_pass import runtimes

    target = runtimes.get(report.runtime).variant
    return sorted({s.form for s in report.sites if s.known and s.form not in (None, target)})


def show(args: argparse.Namespace, report: VerifyReport) -> tuple[int, dict]:
    """Print verify's report; its exit code and its --json shape."""
    say(args, report.format())
    other_forms = _other_forms(report) if report.verdict == "PASS" else []
    if report.verdict == "PASS" and report.runtime == "onnxruntime" and not args.quiet:
        note("next: checked on onnxruntime; --runtime NAME checks it on the runtime it will run on "
             "(dql-pass expand --list-targets lists them)")
    elif other_forms and args.command == "verify" and not args.quiet:
        note(f"next: the known differences are {report.runtime}'s for {' and '.join(other_forms)}, the form "
             f"REWRITTEN has, not for its target; `dql-pass expand {shlex.quote(report.original)} -o OUT --target "
             f"{report.runtime} --verify` (lower, for the integer ops too) writes the one exact there")
    elif report.verdict == "FAIL" and args.command == "verify" and not args.quiet:  # someone else's rewrite
        target = "" if report.runtime == "onnxruntime" else f" --target {report.runtime}"
        note(f"next: REWRITTEN does not compute what ORIGINAL does (the lines above say where); `dql-pass expand "
             f"{shlex.quote(report.original)} -o OUT{target} --verify` (lower, for the integer ops too) writes one "
             "that does")
    elif report.verdict == "INCOMPLETE" and not args.quiet:
        note("next: nothing differs, but not everything was checked: the summary says what and why, and where "
             "an option checks it, which")
    return report.exit_code, report.to_dict()
