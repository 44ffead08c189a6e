"""The family's sections of RUNTIMES.md: one per op, each runtime's outcomes on the family's conformance suite.

Run from the repository root::

    python -m tools.family_runtimes [--runtime NAME ...] [--opsets 10,21] [--size small] [--out FILE]

It writes the family suite (``dql-pass gen-tests --ops ...``) to a temporary folder, runs it on each
runtime (``run-tests``: one op x runtime row each), and prints the sections (or writes them to
``--out``). ``tools.runtimes --family`` appends the same sections to RUNTIMES.md in its run.
"""

from __future__ import annotations

__all__ = ["FAMILY", "measure", "render", "sections"]

import argparse
import collections
import logging
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path

from dql_pass import runtimes, suites
from dql_pass.suites import family, matrix

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


def render(found: matrix.Matrix, opsets: Collection[int] | None, seconds: float) -> str:
    """One ``## `` section per op: a row per runtime, with the first failure or the reason of the skips."""
    lines = [
        "## The quantization family on each runtime",
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
        lines += [f"### {op}", "",
                  "| runtime | version | passed | failed | xfail | skipped | first failure, or why skipped |",
                  "|---|---|---:|---:|---:|---:|---|"]
        for row in by_op.get(op, []):
            note = _first(found, row.runtime, op, "FAIL") or "; ".join(
                f"{n} x {why}" for why, n in row.why_skipped.items()).replace("|", "\\|")
            lines.append(f"| {row.runtime} | {runtimes.get(row.runtime).version()} | {row.passed} | {row.failed} | "
                         f"{row.xfail} | {row.skipped} | {note} |")
        lines.append("")
    if not_installed:
        lines += ["Not installed here: "
                  + "; ".join(f"{row.runtime} ({next(iter(row.why_skipped))})" for row in not_installed), ""]
    return "\n".join(lines)


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
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(name)s: %(message)s", level=logging.WARNING)
    opsets = None if args.opsets == "all" else {int(o) for o in args.opsets.split(",")}
    text = sections(args.runtime or list(runtimes.RUNTIMES), opsets, args.size)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
