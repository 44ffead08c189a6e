"""The family's sections of RUNTIMES.md: one per op, each runtime's outcomes on the family's conformance suite.

Run from the repository root::

    python -m tools.family_runtimes [--runtime NAME ...] [--opsets 10,21] [--size small] [--out FILE [--merge]]

It writes the family suite (``dql-pass gen-tests --ops ...``) to a temporary folder, runs it on each
runtime (``run-tests``: one op x runtime row each), and prints the sections (or writes them to
``--out``). ``tools.runtimes --family`` appends the same sections to RUNTIMES.md in its run.
``--merge`` puts the rows of the runtimes named into the sections ``--out`` holds, keeps the other
rows as they were, and says which run each merged row came from: a runtime installed on another
machine (onnxruntime-cuda on a GPU) is measured there alone.
"""

from __future__ import annotations

__all__ = ["FAMILY", "HEADING", "measure", "merge", "render", "sections"]

import argparse
import collections
import datetime
import logging
import re
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from dql_pass import runtimes, suites
from dql_pass.suites import family, matrix
from tools import harness

logger = logging.getLogger(__name__)

FAMILY = tuple(family.REGISTRY)
# Opset 10 holds every op's first version, 21 every case of QuantizeLinear and DequantizeLinear but
# the float16 ones of 19 to 22 and opset 23's float16 division.
DEFAULT_OPSETS = (10, 21)


def measure(
    names: Sequence[str], opsets: Collection[int] | None = DEFAULT_OPSETS, size: str = "small"
) -> matrix.Matrix:
    """The family suite at ``opsets`` run on each runtime of ``names``."""
    with tempfile.TemporaryDirectory(prefix="family.") as scratch:
        path = Path(scratch) / "suite"
        suites.generate_suite(path, ops=FAMILY, family_opsets=opsets, size=size)
        return matrix.run_matrix(path, names)


def _first(found: matrix.Matrix, runtime: str, op: str, status: str) -> str:
    report = found.reports.get(runtime)
    outcomes = [o for o in (report.outcomes if report is not None else []) if o.op == op and o.status == status]
    if not outcomes:
        return ""
    first = min(outcomes, key=lambda o: o.name)
    return f"`{first.name}`: {first.detail}".replace("|", "\\|")


HEADING = "## The quantization family on each runtime"
_NOT_INSTALLED = "Not installed here: "
_TABLE = ("| runtime | version | passed | failed | xfail | skipped | first failure, or why skipped |",
          "|---|---|---:|---:|---:|---:|---|")


def render(found: matrix.Matrix, opsets: Collection[int] | None, seconds: float) -> str:
    """One ``## `` section per op: a row per runtime, with the first failure or the reason of the skips."""
    lines = [
        HEADING,
        "",
        f"Written by `python -m tools.family_runtimes` in {seconds:.0f} s: `dql-pass gen-tests --ops "
        f"{','.join(FAMILY)}` at opsets {', '.join(map(str, sorted(opsets))) if opsets else 'all'}, run with "
        "`dql-pass run-tests --runtime ...`; every output compared bit for bit with the NumPy reference, which "
        "reads like the ONNX spec. *xfail* are onnxruntime's known differences from the spec, each case with ORT's "
        "answer; `run-tests --report-dir DIR` writes a divergence report per failing row.",
        "",
    ]
    by_op: dict[str, list[matrix.Row]] = collections.defaultdict(list)
    for row in found.rows:
        by_op[row.op].append(row)
    not_installed = [row for row in by_op.pop("*", [])]
    for op in FAMILY:
        lines += [f"### {op}", "", *_TABLE]
        for row in by_op.get(op, []):
            note = _first(found, row.runtime, op, "FAIL") or "; ".join(
                f"{n} x {why}" for why, n in row.why_skipped.items()).replace("|", "\\|")
            lines.append(f"| {row.runtime} | {runtimes.get(row.runtime).version()} | {row.passed} | {row.failed} | "
                         f"{row.xfail} | {row.skipped} | {note} |")
        lines.append("")
    if not_installed:
        lines += [_NOT_INSTALLED
                  + "; ".join(f"{row.runtime} ({next(iter(row.why_skipped))})" for row in not_installed), ""]
    return "\n".join(lines)


def _tables(text: str) -> dict[str, dict[str, str]]:
    """Each op's rows in the family's sections of ``text``, by runtime, as written, the ops in order."""
    tables: dict[str, dict[str, str]] = {}
    for block in re.split(r"(?m)^(?=### )", text)[1:]:
        op, *lines = block.splitlines()
        rows = [line for line in lines if line.startswith("| ") and line != _TABLE[0]]
        tables[op.removeprefix("### ").strip()] = {row.split(" | ")[0].removeprefix("| "): row for row in rows}
    return tables


def merge(report: str, text: str, names: Sequence[str]) -> str:
    """``report`` (which holds the family's sections, at its end) with the rows of ``names`` from the
    sections ``text`` of a run that measured them; every other row stays as it was. Raises ValueError
    where the two runs are not of the same suite."""
    at = report.find(HEADING)
    if at < 0:
        raise ValueError(f"it has no section {HEADING!r} to merge into")
    head, old = report[:at], report[at:]
    suite = re.compile(r"--ops \S+` at opsets .+?, run with")
    if suite.search(old) is None or suite.search(old).group() != suite.search(text).group():
        raise ValueError("its family sections are of another suite (ops or opsets): run without --merge")
    missing = [name for name in names if f"{name} (" in text.partition(_NOT_INSTALLED)[2]]
    if missing:
        raise ValueError(f"{', '.join(missing)} not installed here: nothing to merge")
    run = f"Rows of {', '.join(names)}: "
    intro = "\n".join(line for line in old.partition("\n### ")[0].splitlines() if not line.startswith(run))
    seconds = re.search(r" in (\d+) s:", text).group(1)
    command = f"python -m tools.family_runtimes --runtime {' --runtime '.join(names)} --merge"
    when = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
    lines = [*intro.rstrip().splitlines(), "",
             f"{run}`{command}` on {when} ({harness.machine()}), in {seconds} s; the other rows are from the run "
             "above.", ""]
    order, measured = list(runtimes.RUNTIMES), _tables(text)
    for op, kept in _tables(old).items():
        listed = list(kept)  # a measured row in its old place; a new one before the first that comes after it
        for name in measured.get(op, {}).keys() - kept.keys():
            later = [i for i, r in enumerate(listed) if order.index(r) > order.index(name)]
            listed.insert(later[0] if later else len(listed), name)
        rows = {**kept, **measured.get(op, {})}
        lines += [f"### {op}", "", *_TABLE, *(rows[r] for r in listed), ""]
    left = old.partition(_NOT_INSTALLED)[2].strip()
    still = [entry for entry in left.split("; ") if entry and entry.split(" (")[0] not in names]
    if still:
        lines += [_NOT_INSTALLED + "; ".join(still), ""]
    return head + "\n".join(lines)


def sections(names: Sequence[str], opsets: Collection[int] | None = DEFAULT_OPSETS, size: str = "small") -> str:
    began = time.perf_counter()
    found = measure(names, opsets, size)
    return render(found, opsets, time.perf_counter() - began)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", action="append", choices=list(runtimes.RUNTIMES), help="repeatable; default: all")
    parser.add_argument("--opsets", default=",".join(map(str, DEFAULT_OPSETS)), help="comma-separated, or all")
    parser.add_argument("--size", choices=("small", "full"), default="small")
    parser.add_argument("--out", type=Path, help="write the sections here (default: print them)")
    parser.add_argument("--merge", action="store_true",
                        help="put the rows of the --runtime named into the family sections --out holds")
    args = parser.parse_args(argv)
    if args.merge and not (args.out and args.runtime):
        parser.error("--merge needs --out (the report that holds the sections) and --runtime")
    logging.basicConfig(format="%(name)s: %(message)s", level=logging.WARNING)
    opsets = None if args.opsets == "all" else {int(o) for o in args.opsets.split(",")}
    text = sections(args.runtime or list(runtimes.RUNTIMES), opsets, args.size)
    if args.merge:
        try:
            text = merge(args.out.read_text(), text, args.runtime)
        except (OSError, ValueError) as error:
            print(f"error: cannot merge into {args.out}: {error}", file=sys.stderr)
            return 2
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
