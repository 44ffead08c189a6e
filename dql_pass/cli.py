"""The ``dql-pass`` command line: a thin shell over the public API.

Exit codes: 0 on success, 1 when verify finds a mismatch or run-tests a failure, 2 on bad input (one
line on stderr, no traceback), 130 on Ctrl-C, 143 on SIGTERM and 129 on SIGHUP (see
:mod:`dql_pass.interrupts`).

The parser is built from leaf modules only (the variant records, the suite defaults), and every
command imports what it runs, so that ``--help`` and a usage error cost no graph library.
"""

from __future__ import annotations

__all__ = ["main", "run"]

import argparse
import collections
import dataclasses
import gc
import json
import logging
import math
import os
import signal
import stat
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from dql_pass import interrupts, variants
from dql_pass.errors import InputError, MissingDependency

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir

    from dql_pass.verification import VerifyReport



def _say(args: argparse.Namespace, text: str = "") -> None:
    """A line of the command's own output: stdout, unless -q."""
    if not args.quiet:
        print(text)


def _expand(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass

    start = time.perf_counter()
    result = dql_pass.expand_file(
        args.input, args.output, variant=args.variant, mode=args.mode, zero_range=args.zero_range, target=args.target,
        share_data=args.share_data,
    )
    elapsed = time.perf_counter() - start
    done = result.report  # what the pass did, variant and target included
    report = {"input": args.input, "output": args.output, "seconds": elapsed, **dataclasses.asdict(done)}
    if not done.sites:
        _say(args, f"{args.input}: no DynamicQuantizeLinear; wrote it unchanged to {args.output} ({elapsed:.2f} s)")
    else:
        _say(args, f"expanded {sum(done.sites.values())} DynamicQuantizeLinear (variant {done.variant}"
                   f"{f' for {done.target}' if done.target else ''}, mode {done.mode}, zero range {done.zero_range}) "
                   f"into {args.output} in {elapsed:.2f} s")
        for label, count in done.sites.items():
            _say(args, f"  {count:6d}  {label}")
        if done.target is None and not args.quiet:
            print(f"variant {done.variant} is the exact target of {', '.join(_runtimes_targeting(done.variant)) or 'no runtime'}; "
                  f"for another runtime give --target (see --list-targets, or `dql-pass advise {args.input}`)",
                  file=sys.stderr)
    report["shared_data"] = _shared(args)
    return _deployable(args, report)


def _advise(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass

    advice = dql_pass.advise(args.model, args.runtime or None, load=args.load)
    _say(args, advice.format())
    return 0, advice.to_dict()


def _runtimes_targeting(variant: str) -> list[str]:
    from dql_pass import runtimes

    return [name for name, runtime in runtimes.RUNTIMES.items() if runtime.variant == variant]


def _lower(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass

    start = time.perf_counter()
    result = dql_pass.lower_file(args.input, args.output, target=args.target, weights=args.weights, blocks=args.blocks,
                                 share_data=args.share_data)
    elapsed = time.perf_counter() - start
    report = result.report
    before, after = _footprint(args.input), _footprint(args.output)  # the input is never written
    if result.modified:
        counts = collections.Counter(node.op_type for node in report.lowered)
        _say(args, f"lowered {len(report.lowered)} nodes ({', '.join(f'{n} {op}' for op, n in counts.items())}) "
                   f"into {args.output} in {elapsed:.2f} s (weights {report.weights})")
        for line in _lower_summary(args, report, before, after):
            _say(args, line)
    else:
        _say(args, f"{args.input}: nothing to lower; wrote it unchanged to {args.output} ({elapsed:.2f} s)")
    shared = _shared(args)
    if report.format():
        if args.verbose:
            _say(args, report.format())
        else:  # the proof of each node is for -v; what was left alone and what still blocks, always
            for line in report.format().splitlines():
                if not line.startswith("  "):
                    _say(args, line)
    return _deployable(args, {"input": args.input, "output": args.output, "seconds": elapsed,
                              "nodes_before": before[0], "nodes_after": after[0], "bytes_before": before[1],
                              "bytes_after": after[1], **dataclasses.asdict(report), "shared_data": shared})


def _footprint(path: str) -> tuple[int, int]:
    """The nodes of the model at ``path`` (every graph and function) and its size on disk with its data files."""
    import onnx_ir as ir

    from dql_pass.files import external_tensors

    model = ir.load(path)  # external data stays unread
    nodes = sum(1 for root in (model.graph, *model.functions.values()) for _ in ir.traversal.RecursiveGraphIterator(root))
    files = {os.path.realpath(path)} | {os.path.realpath(tensor.path) for tensor in external_tensors(model)}
    return nodes, sum(os.path.getsize(file) for file in files if os.path.isfile(file))


def _lower_summary(args: argparse.Namespace, report: Any, before: tuple[int, int], after: tuple[int, int]) -> list[str]:
    """What lower did, in a few lines: each kind of rewrite with its count, nodes and size before and
    after, and the weights with why; the proof of each node is under -v."""
    import re

    kinds = collections.Counter((node.op_type, re.sub(r" \(.*\)$", "", node.proof)) for node in report.lowered)
    lines = [f"  {n:4d} {op}: {proof}" for (op, proof), n in kinds.items()]
    lines.append(f"  nodes {before[0]:,} -> {after[0]:,}; size {before[1]:,} -> {after[1]:,} bytes "
                 f"({after[1] / max(before[1], 1):.1f}x)")
    why = ("as --weights asked" if args.weights else f"{args.target}'s default" if args.target
           else "the default without --target")
    kept = ("8-bit weights kept as they are, cast and shifted in the graph, which runtimes fold when they load it"
            if report.weights == "integer" else
            "8-bit weights stored cast and shifted as float32, four times their size; --weights integer keeps them 8-bit")
    lines.append(f"  weights {report.weights} ({why}): {kept}")
    if not args.verbose:
        lines.append("  (-v gives the proof of each node)")
    return lines


def _shared(args: argparse.Namespace) -> list[str]:
    """With --share-data, the input's data files the output refers to, said in a line of its own."""
    if not args.share_data:
        return []
    from dql_pass.files import shared_data_files

    shared = shared_data_files(args.output, args.input)
    if shared:
        _say(args, f"{args.output} refers to the input's data {'files' if len(shared) > 1 else 'file'} "
                   f"{', '.join(shared)} (--share-data): it needs {'them' if len(shared) > 1 else 'it'} where "
                   f"{'they are' if len(shared) > 1 else 'it is'}")
    else:
        _say(args, f"{args.output} stands alone: --share-data shares only the input's data files in the output's "
                   "folder, and this output keeps none")
    return shared


def _deployable(args: argparse.Namespace, report: dict) -> tuple[int, dict]:
    """With --target: what still blocks the written model there, on stderr, and exit 1 if anything
    does; then --verify."""
    if args.target is None:
        return _verified(args, report)
    import dql_pass
    from dql_pass.verification.deployable import blockers

    from dql_pass import runtimes

    where = runtimes.get(args.target).where
    if runtimes.get(args.target).installed() and not args.quiet:
        print(f"dql-pass: checking {args.output} on {args.target}{f' ({where})' if where else ''}...", file=sys.stderr,
              flush=True)
    found = blockers(dql_pass.load_model(args.output), args.target, _dims(args))
    if found.not_tried is None and not args.quiet:
        print(f"dql-pass: {args.target}: {'refused it' if found else 'loads and runs it'}", file=sys.stderr)
    report["blockers"] = found.reasons
    for reason in found.reasons:
        if reason in report.get("lacking", ()):
            continue  # lower's report printed it
        print(f"dql-pass: still blocks {args.target}: {reason}", file=sys.stderr)
    if found.not_tried:
        print(f"dql-pass: note: {found.not_tried}", file=sys.stderr)
    if args.command == "expand":
        _point_to_lower(args, found.reasons)
    code, report = _verified(args, report)
    return (1 if found else code), report


def _point_to_lower(args: argparse.Namespace, reasons: Sequence[str]) -> None:
    """After expand --target: name `lower` when the target lacks integer ops the model still has, or
    runs them off its accelerator (webgpu sends them to the CPU)."""
    import dql_pass
    from dql_pass import runtimes
    from dql_pass.graph.walk import ops_used
    from dql_pass.lowering import LOWERED  # the ops lower turns into float ones

    used = {op for domain, op in ops_used(dql_pass.load_model(args.output)) if domain == ""}
    elsewhere = sorted(used & set(LOWERED) & set(runtimes.get(args.target).no_kernel))
    if elsewhere:
        print(f"dql-pass: note: {', '.join(elsewhere)} still run on the CPU, not on {args.target}: it has no kernel "
              "for them", file=sys.stderr)
    if elsewhere or any(op in reason for reason in reasons for op in LOWERED):
        print(f"dql-pass: `dql-pass lower {args.input} -o OUTPUT --target {args.target}` turns the integer ops into "
              "float ones", file=sys.stderr)


def _verified(args: argparse.Namespace, report: dict) -> tuple[int, dict]:
    """The exit code of expand or lower: 0, or with --verify the verdict of verify on what it wrote."""
    if not args.verify:
        return 0, report

    # An expansion for a target is verified there.
    verified = _verify_with_progress(args, args.input, args.output, zero_range=args.zero_range, dims=_dims(args),
                                     runtime=args.target or "onnxruntime")
    code, report["verify"] = _show(args, verified)
    return code, report


class _Progress:
    """verify's progress on stderr, as the field shows it: a bar per stage where stderr is a
    terminal (tqdm), a plain line every couple of seconds elsewhere (a log, CI), nothing under -q."""

    _EVERY = 2.0  # seconds between plain lines; the first comes once verify has taken that long

    def __init__(self) -> None:
        self._start = self._last = time.monotonic()
        self._bar = None
        self._stage: str | None = None
        self._terminal = sys.stderr.isatty()

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self._terminal:
            from tqdm import tqdm

            if stage != self._stage:
                self.close()
                self._bar, self._stage = tqdm(total=total, desc=f"verify: {stage}", unit="", leave=False), stage
            self._bar.update(done + 1 - self._bar.n)
            return
        now = time.monotonic()
        if now - self._last >= self._EVERY:
            print(f"dql-pass: verify: {stage} {done + 1} of {total} ({now - self._start:.0f} s)", file=sys.stderr, flush=True)
            self._last = now

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _verify_with_progress(args: argparse.Namespace, original: Any, rewritten: Any, **options: Any) -> VerifyReport:
    import dql_pass

    progress = None if args.quiet else _Progress()
    try:
        return dql_pass.verify(original, rewritten, progress=progress, **options)
    finally:
        if progress is not None:
            progress.close()


def _show(args: argparse.Namespace, report: VerifyReport) -> tuple[int, dict]:
    if args.quiet:
        return report.exit_code, report.to_dict()
    print(report.format())
    return report.exit_code, report.to_dict()


def _pairs(items: Sequence[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise InputError(f"{option} {item!r}: expected NAME=VALUE")
        pairs[name] = value
    return pairs


def _dims(args: argparse.Namespace) -> dict[str, int]:
    dims = {}
    for name, size in _pairs(args.dim, "--dim").items():
        if not _is_whole_number(size):
            raise InputError(f"--dim {name}: the size must be a whole number, not {size!r}")
        dims[name] = int(size)
    return dims


def _load_array(name: str, path: str, budget: int, limit: int) -> np.ndarray:
    """Read a .npy file, once its header is known to describe no more bytes than the file holds
    and than the ``budget`` left of the ``limit`` verify allows."""
    import numpy as np

    from dql_pass.errors import one_line

    headers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError("not a regular file")  # a FIFO would block the read for good
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            read_header = headers.get(version)
            if read_header is None:
                raise ValueError(f"it is in .npy format version {version[0]}.{version[1]}; 1.0 and 2.0 are read")
            shape, _, dtype = read_header(file)
            available = os.fstat(file.fileno()).st_size - file.tell()
            if dtype.hasobject:
                raise ValueError("it holds Python objects, which are not loaded")
            needed = math.prod(shape) * dtype.itemsize
            if needed > available:
                raise ValueError(f"its header declares {needed:,} bytes of data, but the file holds {available:,}")
            if needed > budget:
                raise ValueError(f"with it the inputs would take more than the {limit >> 30} GiB verify allows")
            file.seek(0)
            return np.load(file, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise InputError(f"--input {name}: cannot read {path}: {one_line(error)}") from None


def _verify(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass
    from dql_pass.verification import MAX_INPUT_BYTES

    dims = _dims(args)
    inputs: dict[str, np.ndarray] = {}
    for name, path in _pairs(args.input, "--input").items():
        budget = MAX_INPUT_BYTES - sum(array.nbytes for array in inputs.values())
        inputs[name] = _load_array(name, path, budget, MAX_INPUT_BYTES)
    original, rewritten = dql_pass.load_model(args.original), dql_pass.load_model(args.rewritten)
    report = _verify_with_progress(
        args, original, rewritten, samples=args.samples, seed=args.seed, inputs=inputs, dims=dims,
        zero_range=args.zero_range, runtime=args.runtime,
    )
    # verify names in-memory models after their graphs; the report names the files.
    return _show(args, dataclasses.replace(report, original=args.original, rewritten=args.rewritten))


# A report replaces a file only if that file is a report of dql-pass too: whatever else it is (a
# model, in any format, its weights, an input array, a suite's manifest) is never lost to a
# mistyped --json.
_MAX_REPORT_BYTES = 64 << 20
_REPORT_KEYS = frozenset({"command", "exit_code"})


def _check_report_path(path: str, files: Mapping[str, str], folders: Mapping[str, str]) -> Path:
    """Refuse a --json path that cannot be written, that is one of ``files`` or lies in one of
    ``folders`` (by what they are), or that holds anything but a report of dql-pass."""
    from dql_pass.files import check_output_path

    report = check_output_path(path, "report")
    for what, file in files.items():
        if Path(file).resolve() == report.resolve() or _same_file(file, report):
            raise InputError(f"{path}: the report would overwrite {what}; choose another path")
    # The report replaces a link itself, so the folder it lands in is the link's, not its target's.
    landing = Path(os.path.abspath(report)).parent.resolve() / report.name
    for what, folder in folders.items():
        if any(place.is_relative_to(Path(folder).resolve()) for place in (landing, report.resolve())):
            raise InputError(f"{path}: the report would be written into {what}; choose a path outside it")
    if os.path.lexists(report):
        _check_not_data_of(path, report, files)
    try:
        if os.stat(report).st_size > _MAX_REPORT_BYTES:
            raise ValueError
        held = json.loads(report.read_bytes())
        if not (isinstance(held, dict) and _REPORT_KEYS <= held.keys()):
            raise ValueError
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        raise InputError(f"{path}: holds something other than a report of dql-pass; it is never replaced by one") from None
    return report


def _check_not_data_of(path: str, report: Path, files: Mapping[str, str]) -> None:
    """Refuse an existing report path that is an external data file of one of the command's models,
    whatever its bytes look like (read only when the path exists: a new file is no one's data)."""
    from dql_pass.files import external_tensors, load_model

    for what, file in files.items():
        try:
            tensors = external_tensors(load_model(file))
        except InputError:
            continue  # not a model (an array, an output not written yet)
        if any(_same_file(tensor.path, report) for tensor in tensors):
            raise InputError(f"{path}: the report would overwrite the external data of {what}; choose another path")


def _same_file(a: str | Path, b: str | Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _write_report(path: Path, report: dict) -> None:
    from dql_pass.files import atomic_path

    text = json.dumps(report, indent=2, default=_jsonable, allow_nan=False) + "\n"
    with atomic_path(path, "report") as temporary:
        Path(temporary).write_text(text)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float spelled as a string: JSON has no inf or NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _is_whole_number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit alone accepts "²", which int() refuses


def _whole_number(text: str) -> int:
    if not _is_whole_number(text):
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, not {text!r}")
    return seconds


def _opsets(text: str) -> list[int]:
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected opsets like 11,13,21, not {text!r}") from None


def _gen_tests(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass
    from dql_pass.suites.defaults import DEFAULT_OPSETS

    suite = dql_pass.generate_suite(
        args.outdir, opsets=args.opsets or DEFAULT_OPSETS, forms=[v.strip() for v in args.variants.split(",") if v.strip()],
        zero_range=args.zero_range, include_unspecified=args.include_unspecified, include_large=not args.no_large,
        force=args.force, ops=[op.strip() for op in args.ops.split(",") if op.strip()], size=args.size,
        family_opsets=args.opsets,
    )
    size = f"{suite.size_bytes / 1e6:.1f} MB" if suite.size_bytes >= 1e6 else f"{suite.size_bytes / 1e3:.0f} kB"
    _say(args, f"wrote {len(suite.entries)} test folders from {suite.inputs} inputs to {suite.path}: {size} in {suite.seconds:.1f} s")
    return 0, {"path": str(suite.path), "folders": len(suite.entries), "inputs": suite.inputs,
               "size_bytes": suite.size_bytes, "seconds": suite.seconds}


def _outcome_record(outcome) -> dict:
    return {key: getattr(outcome, key) for key in ("name", "status", "detail", "form", "op")}


def _run_tests(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass
    from dql_pass.suites import matrix

    names = matrix.choose_runtimes(args.runtime)
    if len(names) > 1 or args.report_dir:
        return _run_matrix(args, names)
    report = dql_pass.run_suite(args.outdir, names[0], raw=args.raw,
                                progress=None if args.quiet else lambda outcome: print(outcome.line(), flush=True))
    _say(args, report.table())
    _say(args, report.summary)
    return (0 if report.ok else 1), {"runtime": report.runtime, "raw": args.raw, "summary": report.summary,
                                     "ok": report.ok, "counts": report.counts(),
                                     "outcomes": [_outcome_record(o) for o in report.outcomes]}


def _run_matrix(args: argparse.Namespace, names: list[str]) -> tuple[int, dict]:
    from dql_pass.suites import divergence, matrix

    if args.report_dir:
        divergence.check_report_dir(args.report_dir)
    found = matrix.run_matrix(args.outdir, names, raw=args.raw, progress=None if args.quiet or not args.verbose
                              else lambda runtime, outcome: print(f"{runtime}: {outcome.line()}", flush=True))
    _say(args, found.table())
    written = divergence.write_reports(args.report_dir, args.outdir, found) if args.report_dir else []
    for path in written:
        _say(args, f"wrote the divergence report {path}")
    return (0 if found.ok else 1), {
        "raw": args.raw, "ok": found.ok, "rows": [dataclasses.asdict(row) for row in found.rows],
        "reports": [str(path) for path in written],
        "outcomes": {name: [_outcome_record(o) for o in report.outcomes] for name, report in found.reports.items() if report is not None},
    }


def _fuse(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass

    start = time.perf_counter()
    result = dql_pass.fuse_file(args.input, args.output, share_data=args.share_data)
    elapsed = time.perf_counter() - start
    report = result.report
    if report.total:
        _say(args, f"fused {report.total} DynamicQuantizeLinear into {args.output} in {elapsed:.2f} s")
        for label, by_rule in report.fused.items():
            for rule, count in by_rule.items():
                _say(args, f"  {count:6d}  {label}  ({rule})")
    else:
        _say(args, f"{args.input}: nothing to fuse; wrote it unchanged to {args.output} ({elapsed:.2f} s)")
    shared = _shared(args)
    for function in report.dropped_functions:
        _say(args, f"dropped the model-local function {function}: nothing calls it any more")
    for rule, note in report.notes.items():
        count = sum(by_rule.get(rule, 0) for by_rule in report.fused.values())
        _say(args, f"behaviour change of the {count} node(s) fused by {rule}: {note}")
    if report.left_alone:
        _say(args, f"left alone {len(report.left_alone)} ReduceMin/ReduceMax pair(s) that look like DynamicQuantizeLinear:")
        for item in report.left_alone:
            closest = f"closest rule {item.rule}, {item.matched_nodes} nodes matched: " if item.rule else ""
            _say(args, f"  {item.graph}, x {item.x!r}: {closest}{item.reason}")
    return 0, {"input": args.input, "output": args.output, "seconds": elapsed, "total": report.total,
               **dataclasses.asdict(report), "shared_data": shared}


def _some(items: Sequence[str], most: int = 4) -> str:
    """``items`` joined, the first ``most`` of them named, or "-"."""
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more if items else "-"


def _targets(verbose: bool = False) -> list[str]:
    """One line per target: its variant, lower's weights, whether it is installed, the ops it lacks and
    the inputs where its variant still differs; then the runtimes without an adapter and their command.
    ``verbose``: each lack and difference with its measured reason, under its target."""
    from dql_pass import runtimes

    rows = [("target", "variant", "weights", "installed", "lacks", "still differs on")]
    details = []
    for name, runtime in runtimes.RUNTIMES.items():
        differs = [d for d in runtime.known_differences if runtime.variant in d.forms]
        version = runtime.version()
        rows.append((name, runtime.variant, runtime.weights, version or f"no: {runtime.install_hint()}",
                     _some([lack.op_type for lack in runtime.lacks]),
                     ", ".join(sorted({d.inputs or "any" for d in differs})) or "-"))
        details.append(f"{name}:")
        if runtime.blocks:
            details.append("  lower drops the Cast pair after each lowered product" + (
                " and keeps y - y_zero_point in float32 where only lowered products read it (blocks)"
                if variants.BY_NAME[runtime.variant].float_y else f" (blocks; variant {runtime.variant} keeps y in uint8)"))
        details += [f"  differs on {d.inputs or 'any'} inputs: {d.reason}" for d in differs]
        details += [f"  lacks {lack.op_type}-{lack.since_version}: {lack.reason}" for lack in runtime.lacks]
        details += [f"  lower leaves {p.op_type} alone: {p.reason}" for p in runtime.inexact_products]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] for row in rows]
    lines += ["", "without an adapter (not a --target; for them run `dql-pass lower INPUT -o OUTPUT`, no --target):"]
    lines += [f"  {name:<{widths[0]}}  {other.title}: lacks {', '.join(other.lacks)} ({other.source})"
              for name, other in runtimes.ELSEWHERE.items()]
    if verbose:
        lines += ["", *details]
    return lines


class _ListTargets(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        print("\n".join(_targets(getattr(namespace, "verbose", False))))
        parser.exit(0)


class _Version(argparse.Action):
    """--version, read from the installed metadata only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        import dql_pass

        print(f"dql-pass {dql_pass.__version__}")
        parser.exit(0)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line like every other bad input (``-h`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog.split()[0]}: error: {message}\n")


def _common(top: bool) -> argparse.ArgumentParser:
    """-v, -q and --json, taken before the command or after it; a command's copy leaves the top's value alone."""
    common = argparse.ArgumentParser(add_help=False)
    unset = {} if top else {"default": argparse.SUPPRESS}
    loudness = common.add_mutually_exclusive_group()
    loudness.add_argument("-v", "--verbose", action="store_true", help="log what each step does", **unset)
    loudness.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors; the exit code tells",
                          **unset)
    common.add_argument("--json", metavar="FILE", help="also write the command's report as JSON to FILE", **unset)
    return common


def _runtime_name(text: str) -> str:
    # Checked against the registry when the command runs: the parser imports no runtime.
    return text


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dql-pass", parents=[_common(top=True)],
        description="Expand ONNX DynamicQuantizeLinear into primitive ops, bit-exact with ONNX Runtime.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    common = [_common(top=False)]
    target_help = "; see `dql-pass expand --list-targets` for the runtimes"
    list_targets_help = ("print one line per target (its variant, lower's weights, whether it is installed, what it "
                         "lacks, where it still differs) and the runtimes without an adapter, and exit; with -v before it, "
                         "each reason too")
    timeout = _Parser(add_help=False)
    timeout.add_argument("--runtime-timeout", type=_seconds, metavar="SECONDS",
                         help="seconds the runtime may take to load or run a model once, where its adapter limits them "
                              "(webgpu and wasm: 120 to load, 60 to run; mnn and litert: 600 to convert); past it, "
                              "what it kept unchecked is reported as such")
    zero_range_help = "the scale of an all-zero or empty input: 1.0 (onnxruntime, default) or 1/255 (onnx-reference)"
    share_help = ("an output in the input's folder refers to the input's external data files instead of copying "
                  "what it keeps into its own (fast for large models; the output then needs those files). "
                  "Default: the output and the data file written for it stand alone")
    dim_help = ("size of symbolic dimension NAME (repeatable; default: its size in an --input array, else 2 for "
                "a batch-like one (named batch, or an input's first axis), 1 if ORIGINAL does not run at 2, else 16)")

    expand = commands.add_parser("expand", parents=[*common, timeout], help="rewrite every DynamicQuantizeLinear into primitive ops")
    expand.add_argument("input", help="the ONNX model to read; it is never modified")
    expand.add_argument("-o", "--output", required=True, help="where to write the expanded model")
    chosen = expand.add_mutually_exclusive_group()
    chosen.add_argument("--variant", choices=variants.NAMES,
                        help="; ".join(f"{v.name}: {v.summary}" for v in variants.REGISTRY) + " (default quantizelinear)")
    chosen.add_argument("--target", metavar="RUNTIME", type=_runtime_name,
                        help="the runtime the model is for: the variant that is exact there" + target_help)
    expand.add_argument("--list-targets", action=_ListTargets, help=list_targets_help)
    expand.add_argument("--mode", choices=variants.MODES, default="inline",
                        help="inline the ops (default) or call one model-local function")
    expand.add_argument("--zero-range", choices=variants.ZERO_RANGE_POLICIES, default="onnxruntime", help=zero_range_help)
    expand.add_argument("--verify", action="store_true",
                        help="run `dql-pass verify INPUT OUTPUT` on the result; exit 1 if it finds a mismatch")
    expand.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="with --verify: " + dim_help)
    expand.add_argument("--share-data", action="store_true", help=share_help)
    expand.set_defaults(run=_expand)

    lower = commands.add_parser("lower", parents=[*common, timeout], help="rewrite the quantization ops of a quantize_dynamic "
                                "model into float primitives, bit-exact, with the proof per node")
    lower.add_argument("input", help="the ONNX model to read; it is never modified")
    lower.add_argument("-o", "--output", required=True, help="where to write the lowered model")
    lower.add_argument("--target", metavar="RUNTIME", type=_runtime_name,
                       help="the runtime to lower for: its exact DynamicQuantizeLinear variant, and the ops it "
                            "still lacks in the report (default: no target, variant arithmetic)" + target_help)
    lower.add_argument("--list-targets", action=_ListTargets, help=list_targets_help)
    lower.add_argument("--weights", choices=variants.WEIGHTS,
                       help="integer: keep constant int8/uint8 weights as they are, cast and shifted in the graph, "
                            "which runtimes fold at load; float: store them cast and shifted as float32, four times "
                            "larger (default: the target's, see --list-targets; float without a target)")
    lower.add_argument("--blocks", action=argparse.BooleanOptionalAction,
                       help="where only lowered MatMulInteger/ConvInteger read a DynamicQuantizeLinear's y and zero "
                            "point, keep y - zero point in float32: no uint8 tensor, no Cast out and back, and no "
                            "Cast pair after the product (default: the target's, on for webgpu and wasm; off "
                            "without a target)")
    lower.add_argument("--verify", action="store_true",
                       help="run `dql-pass verify INPUT OUTPUT` on the result; exit 1 if it finds a mismatch")
    lower.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="with --verify: " + dim_help)
    lower.add_argument("--share-data", action="store_true", help=share_help)
    lower.set_defaults(run=_lower, zero_range="onnxruntime")

    advise = commands.add_parser("advise", parents=common, help="say, per runtime, what a model needs there that the "
                                 "runtime lacks and the dql-pass command that gives it")
    advise.add_argument("model", help="the ONNX model to deploy")
    advise.add_argument("--runtime", action="append", default=[], metavar="RUNTIME", type=_runtime_name,
                        help="answer for this runtime only (repeatable; default: every runtime dql_pass knows, with "
                             "an adapter or not: see --list-targets)")
    advise.add_argument("--load", action=argparse.BooleanOptionalAction, default=None,
                        help="also load and run the model on each installed runtime with an adapter, since a load "
                             "tells of what no stated lack names (default: only on the runtimes named with --runtime)")
    advise.add_argument("--list-targets", action=_ListTargets, help=list_targets_help)
    advise.set_defaults(run=_advise)

    fuse = commands.add_parser("fuse", parents=common, help="turn decomposed DynamicQuantizeLinear back into single nodes")
    fuse.add_argument("input", help="the ONNX model to read; it is never modified")
    fuse.add_argument("-o", "--output", required=True, help="where to write the fused model")
    fuse.add_argument("--share-data", action="store_true", help=share_help)
    fuse.set_defaults(run=_fuse)

    verify = commands.add_parser("verify", parents=[*common, timeout], help="check a rewritten model against the original, bit for bit")
    verify.add_argument("original", help="the model with DynamicQuantizeLinear")
    verify.add_argument("rewritten", help="the rewritten model, by dql-pass or any other tool")
    verify.add_argument("--samples", type=_whole_number, default=2, help="random input sets for the model level (default 2), "
                        "besides all-zero, all-negative, all-positive and heavy-tailed sets when there is a float input")
    verify.add_argument("--seed", type=_whole_number, default=0, help="seed of the random catalogue cases and model inputs")
    verify.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="use this array for model input NAME in every input set (repeatable)")
    verify.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help=dim_help)
    verify.add_argument("--zero-range", choices=variants.ZERO_RANGE_POLICIES, default="onnxruntime",
                        help="the policy the reference follows on all-zero and empty inputs (default onnxruntime)")
    verify.add_argument("--runtime", metavar="RUNTIME", type=_runtime_name, default="onnxruntime",
                        help="run REWRITTEN on this runtime (its sites also on ORT); the expected values stay the "
                        "NumPy reference (default onnxruntime)" + target_help)
    verify.set_defaults(run=_verify)

    # The suites' defaults, as leaves: the suite package loads only when a suite is written or run.
    from dql_pass.suites.defaults import DEFAULT_OPSETS, DEFAULT_OUTDIR, FORMS

    gen_tests = commands.add_parser("gen-tests", parents=common, help="write a conformance suite in ONNX's backend-test layout")
    gen_tests.add_argument("outdir", nargs="?", default=DEFAULT_OUTDIR,
                           help="the suite folder (default %(default)s, created with its parents); onnx's loader reads it "
                                "with data_dir=its parent, kind=its name")
    gen_tests.add_argument("--opsets", type=_opsets, default=None,
                           help="ai.onnx opsets, comma-separated (default: %s for DynamicQuantizeLinear; every opset "
                                "at which each other op changed)" % ",".join(map(str, DEFAULT_OPSETS)))
    gen_tests.add_argument("--ops", default="DynamicQuantizeLinear",
                           help="the ops to write suites for, comma-separated, from DynamicQuantizeLinear, "
                                "MatMulInteger, ConvInteger, QuantizeLinear, DequantizeLinear (default %(default)s)")
    gen_tests.add_argument("--size", choices=("small", "full"), default="small",
                           help="the family's sweeps: small for CI, full for larger sweeps and tensors (default %(default)s)")
    gen_tests.add_argument("--variants", default=",".join(FORMS),
                           help="native (the DQL node) and the expansion variants to write, comma-separated "
                                "(default %(default)s)")
    gen_tests.add_argument("--zero-range", choices=variants.ZERO_RANGE_POLICIES, default="onnxruntime",
                           help="the policy of the expected outputs and of the expansion (default onnxruntime)")
    gen_tests.add_argument("--include-unspecified", action="store_true",
                           help="also write NaN inputs; their outputs are unspecified, so they are not compared")
    gen_tests.add_argument("--no-large", action="store_true",
                           help="leave out the input of about a million elements (5 MB per folder)")
    gen_tests.add_argument("--force", action="store_true",
                           help="replace the suite in OUTDIR even when it holds files that gen-tests did not write")
    gen_tests.set_defaults(run=_gen_tests)

    run_tests = commands.add_parser("run-tests", parents=[*common, timeout], help="run a conformance suite and compare every output bit for bit")
    run_tests.add_argument("outdir", nargs="?", default=DEFAULT_OUTDIR,
                           help="the suite folder (default %(default)s); manifest.json is optional")
    run_tests.add_argument("--runtime", "--backend", metavar="RUNTIME", type=_runtime_name, default="onnxruntime",
                           help="the runtime to run it on, a comma-separated list of them, or all; with more than one, "
                                "the counts per op x runtime (default onnxruntime)" + target_help)
    run_tests.add_argument("--report-dir", metavar="DIR",
                           help="write a divergence report per failing runtime x op under DIR (a new or empty folder)")
    run_tests.add_argument("--raw", action="store_true",
                           help="ignore the manifest's known differences: every difference is a FAIL (for a runtime's author)")
    run_tests.set_defaults(run=_run_tests)
    return parser


def _heavy_modules(args: argparse.Namespace) -> list[str]:
    """The libraries the command will load: the graph libraries always, ORT (through its adapter,
    which turns its telemetry off) where it runs models, onnxscript's rewriter to fuse."""
    modules = ["dql_pass.api"]
    if args.command in ("verify", "gen-tests", "run-tests") or getattr(args, "verify", False) or getattr(args, "target", None):
        modules.append("onnxruntime")
    if args.command == "fuse":
        modules.append("dql_pass.fusion")
    return modules


def _import_held(*modules: str) -> None:
    """Import ``modules`` with Ctrl-C, SIGTERM and SIGHUP held back until they are in: an interrupt inside a
    library's import leaves it half made (onnxruntime turns it into an ImportError with a
    traceback); held, it arrives a moment later, where it unwinds cleanly."""
    import importlib

    held = signal.pthread_sigmask(signal.SIG_BLOCK, set(interrupts.SIGNALS))
    try:
        for module in modules:
            if module == "onnxruntime":
                from dql_pass.runtimes.ort import import_onnxruntime

                import_onnxruntime()
            else:
                importlib.import_module(module)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _set_timeout(args: argparse.Namespace) -> None:
    """--runtime-timeout: the limit of the runtime the command runs besides ORT."""
    if getattr(args, "runtime_timeout", None) is None:
        return
    from dql_pass import runtimes

    for name in {getattr(args, "target", None), getattr(args, "runtime", None)} - {None}:
        runtimes.get(name).timeout = args.runtime_timeout


_FILE_LABELS = {"input": "the input model", "output": "the output model", "original": "ORIGINAL", "rewritten": "REWRITTEN",
                "model": "the model"}


def _files_of(args: argparse.Namespace) -> dict[str, str]:
    """The files a command reads or writes, by what they are: its --json report never replaces one."""
    files = {label: getattr(args, key) for key, label in _FILE_LABELS.items() if isinstance(getattr(args, key, None), str)}
    if args.command == "verify":
        files.update((f"the input array {name}", path) for name, path in _pairs(args.input, "--input").items())
    return files


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code."""
    try:
        parser = _parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # a usage error (one line, exit 2), --help or --version (exit 0)
            return done.code
        if args.command is None:  # a bare dql-pass: the commands, as --help lists them
            parser.print_help(sys.stderr)
            return 2
        logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR if args.quiet else logging.WARNING,
                            format="%(name)s: %(message)s")
        folders = {"the suite folder": args.outdir} if args.command in ("gen-tests", "run-tests") else {}
        report_path = _check_report_path(args.json, _files_of(args), folders) if args.json else None
        _import_held(*_heavy_modules(args))
        _set_timeout(args)
        code, report = args.run(args)
        if report_path is not None:
            _write_report(report_path, _finite({"command": args.command, "exit_code": code, **report}))
        return code
    except (InputError, MissingDependency) as error:
        print(f"dql-pass: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:  # the temporary files are gone by now: every write undoes itself
        return interrupts.report(interrupt)


def run() -> None:
    """Run the command of ``sys.argv`` and end the process (:mod:`dql_pass.__main__` loads it)."""
    # A short-lived process that builds large graphs: the cyclic GC would only rescan them, and
    # freeing them object by object at exit takes as long as writing them; the OS frees at once.
    try:
        gc.disable()
        if hasattr(signal, "SIGPIPE"):
            # Die quietly when the reader goes away (`| head`), as command-line tools do.
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        interrupts.install()
        code = main()
        sys.stdout.flush()
        sys.stderr.flush()
    except KeyboardInterrupt as interrupt:  # before main, or while flushing
        code = interrupts.report(interrupt)
    os._exit(code)
