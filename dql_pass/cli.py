"""The ``dql-pass`` command line: a thin shell over the public API.

Exit codes: 0 on success, 1 when verify finds a mismatch or run-tests a failure, 2 on bad input (one
line on stderr, no traceback).
"""

from __future__ import annotations

__all__ = ["main", "run"]

import argparse
import collections
import dataclasses
import gc
import logging
import math
import os
import signal
import stat
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import numpy as np
import onnx_ir as ir

import dql_pass
from dql_pass import decomposition, runtimes, suites
from dql_pass.errors import MissingDependency
from dql_pass.modelfiles import check_output_path, external_tensors, one_line
from dql_pass.verify import MAX_INPUT_BYTES


def _expand(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    result = dql_pass.expand_file(
        args.input, args.output, variant=args.variant, mode=args.mode, zero_range=args.zero_range, target=args.target
    )
    elapsed = time.perf_counter() - start
    variant = args.variant or (dql_pass.target_variant(args.target) if args.target else "quantizelinear")
    if not result.sites:
        print(f"{args.input}: no DynamicQuantizeLinear; wrote it unchanged to {args.output} ({elapsed:.2f} s)")
        return _verified(args)
    total = sum(result.sites.values())
    print(
        f"expanded {total} DynamicQuantizeLinear (variant {variant}{f' for {args.target}' if args.target else ''}, mode {args.mode}, "
        f"zero range {args.zero_range}) into {args.output} in {elapsed:.2f} s"
    )
    for label, count in result.sites.items():
        print(f"  {count:6d}  {label}")
    return _verified(args)


def _lower(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    result = dql_pass.lower_file(args.input, args.output, target=args.target)
    elapsed = time.perf_counter() - start
    report = result.report
    if result.modified:
        counts = collections.Counter(node.op_type for node in report.lowered)
        print(f"lowered {len(report.lowered)} nodes ({', '.join(f'{n} {op}' for op, n in counts.items())}) "
              f"into {args.output} in {elapsed:.2f} s")
    else:
        print(f"{args.input}: nothing to lower; wrote it unchanged to {args.output} ({elapsed:.2f} s)")
    if report.format():
        print(report.format())
    return _verified(args)


def _verified(args: argparse.Namespace) -> int:
    """The exit code of ``expand``: 0, or with --verify the verdict of verify on what it wrote."""
    if not args.verify:
        return 0
    # An expansion for a target is verified there.
    runtime = args.target if getattr(args, "target", None) else "onnxruntime"
    return _show(dql_pass.verify(args.input, args.output, zero_range=args.zero_range, runtime=runtime))


def _show(report: dql_pass.VerifyReport, json_path: str | None = None) -> int:
    print(report.format())  # first: a report that cannot be written is still seen
    if json_path is not None:
        report.save_json(json_path)
    return report.exit_code


def _pairs(items: Sequence[str], option: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise dql_pass.InputError(f"{option} {item!r}: expected NAME=VALUE")
        pairs[name] = value
    return pairs


_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _load_array(name: str, path: str, budget: int) -> np.ndarray:
    """Read a .npy file, once its header is known to describe no more bytes than the file holds
    and than the ``budget`` left of what verify allows."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError("not a regular file")  # a FIFO would block the read for good
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            read_header = _NPY_HEADERS.get(version)
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
                raise ValueError(f"with it the inputs would take more than the {MAX_INPUT_BYTES >> 30} GiB verify allows")
            file.seek(0)
            return np.load(file, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise dql_pass.InputError(f"--input {name}: cannot read {path}: {one_line(error)}") from None


def _verify(args: argparse.Namespace) -> int:
    dims = {}
    for name, size in _pairs(args.dim, "--dim").items():
        if not _is_whole_number(size):
            raise dql_pass.InputError(f"--dim {name}: the size must be a whole number, not {size!r}")
        dims[name] = int(size)
    arrays = _pairs(args.input, "--input")
    inputs: dict[str, np.ndarray] = {}
    for name, path in arrays.items():
        inputs[name] = _load_array(name, path, MAX_INPUT_BYTES - sum(array.nbytes for array in inputs.values()))
    original, rewritten = dql_pass.load_model(args.original), dql_pass.load_model(args.rewritten)
    if args.json is not None:
        # Before the run, which can take minutes.
        _check_report_path(args.json, {args.original: original, args.rewritten: rewritten}, arrays.values())
    report = dql_pass.verify(
        original, rewritten, samples=args.samples, seed=args.seed, inputs=inputs, dims=dims, zero_range=args.zero_range,
        runtime=args.runtime,
    )
    # verify names in-memory models after their graphs; the report names the files.
    return _show(dataclasses.replace(report, original=args.original, rewritten=args.rewritten), args.json)


def _check_report_path(path: str, models: Mapping[str, ir.Model], arrays: Iterable[str]) -> None:
    """Refuse a report path that cannot be written, or that is a model, its external data or an input array."""
    report = check_output_path(path, "report").resolve()
    kept = {Path(model_path).resolve() for model_path in models}
    kept |= {Path(tensor.path).resolve() for model in models.values() for tensor in external_tensors(model)}
    kept |= {Path(array).resolve() for array in arrays}
    if report in kept:
        raise dql_pass.InputError(f"{path}: the report would overwrite a model, its external data or an input array; choose another path")


def _is_whole_number(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit alone accepts "²", which int() refuses


def _whole_number(text: str) -> int:
    if not _is_whole_number(text):
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}")
    return int(text)


def _opsets(text: str) -> list[int]:
    try:
        return [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected opsets like 11,13,21, not {text!r}") from None


def _gen_tests(args: argparse.Namespace) -> int:
    suite = dql_pass.generate_suite(
        args.outdir, opsets=args.opsets, forms=[v.strip() for v in args.variants.split(",") if v.strip()],
        zero_range=args.zero_range, include_unspecified=args.include_unspecified, include_large=not args.no_large,
        force=args.force,
    )
    size = f"{suite.size_bytes / 1e6:.1f} MB" if suite.size_bytes >= 1e6 else f"{suite.size_bytes / 1e3:.0f} kB"
    print(f"wrote {len(suite.entries)} test folders from {suite.inputs} inputs to {suite.path}: {size} in {suite.seconds:.1f} s")
    return 0


def _run_tests(args: argparse.Namespace) -> int:
    report = dql_pass.run_suite(args.outdir, args.runtime, progress=lambda outcome: print(outcome.line(), flush=True))
    print(report.summary())
    return 0 if report.ok else 1


def _fuse(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    result = dql_pass.fuse_file(args.input, args.output)
    elapsed = time.perf_counter() - start
    report = result.report
    if report.total:
        print(f"fused {report.total} DynamicQuantizeLinear into {args.output} in {elapsed:.2f} s")
        for label, by_rule in report.fused.items():
            for rule, count in by_rule.items():
                print(f"  {count:6d}  {label}  ({rule})")
    else:
        print(f"{args.input}: nothing to fuse; wrote it unchanged to {args.output} ({elapsed:.2f} s)")
    for function in report.dropped_functions:
        print(f"dropped the model-local function {function}: nothing calls it any more")
    for rule, note in report.notes.items():
        count = sum(by_rule.get(rule, 0) for by_rule in report.fused.values())
        print(f"behaviour change of the {count} node(s) fused by {rule}: {note}")
    if report.left_alone:
        print(f"left alone {len(report.left_alone)} ReduceMin/ReduceMax pair(s) that look like DynamicQuantizeLinear:")
        for item in report.left_alone:
            closest = f"closest rule {item.rule}, {item.matched_nodes} nodes matched: " if item.rule else ""
            print(f"  {item.graph}, x {item.x!r}: {closest}{item.reason}")
    return 0


def _targets() -> list[str]:
    """Each target: the variant it gets, whether it is installed, what it lacks and what still differs."""
    lines = []
    for name, runtime in runtimes.RUNTIMES.items():
        version = runtime.version()
        installed = f"{runtime.distribution} {version}" if version else f"not installed: {runtime.install_hint()}"
        lines.append(f"{name}: variant {runtime.target} ({installed})")
        lines += [f"  differs on {d.inputs} inputs: {d.reason}" for d in runtime.known_differences
                  if runtime.target in d.forms]
        lines += [f"  lacks {lack.op_type}-{lack.since_version}: {lack.reason}" for lack in runtime.lacks]
    return lines


class _ListTargets(argparse.Action):
    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        print("\n".join(_targets()))
        parser.exit(0)


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line like every other bad input (``-h`` shows the usage)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog.split()[0]}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dql-pass", description="Expand ONNX DynamicQuantizeLinear into primitive ops, bit-exact with ONNX Runtime."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what each pass does")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    expand = commands.add_parser("expand", help="rewrite every DynamicQuantizeLinear into primitive ops")
    expand.add_argument("input", help="the ONNX model to read; it is never modified")
    expand.add_argument("-o", "--output", required=True, help="where to write the expanded model")
    chosen = expand.add_mutually_exclusive_group()
    chosen.add_argument("--variant", choices=dql_pass.VARIANTS,
                        help="; ".join(f"{v}: {decomposition.variant(v).summary}" for v in dql_pass.VARIANTS)
                        + " (default quantizelinear)")
    chosen.add_argument("--target", choices=list(runtimes.RUNTIMES),
                        help="the runtime the model is for: the variant that is exact there (see --list-targets)")
    expand.add_argument("--list-targets", action=_ListTargets, help="print each target, its variant and what still differs there, and exit")
    expand.add_argument("--mode", choices=dql_pass.MODES, default="inline",
                        help="inline the ops (default) or call one model-local function")
    expand.add_argument("--zero-range", choices=dql_pass.ZERO_RANGE_POLICIES, default="onnxruntime",
                        help="the scale of an all-zero or empty input: 1.0 (onnxruntime) or 1/255 (onnx-reference)")
    expand.add_argument("--verify", action="store_true",
                        help="run `dql-pass verify INPUT OUTPUT` on the result; exit 1 if it finds a mismatch")
    expand.set_defaults(run=_expand)

    lower = commands.add_parser("lower", help="rewrite the quantization ops of a quantize_dynamic model into float "
                                "primitives, bit-exact, with the proof per node")
    lower.add_argument("input", help="the ONNX model to read; it is never modified")
    lower.add_argument("-o", "--output", required=True, help="where to write the lowered model")
    lower.add_argument("--target", choices=list(runtimes.RUNTIMES),
                       help="the runtime to lower for: its exact DynamicQuantizeLinear variant, and the ops it "
                            "still lacks in the report (default: no target, variant arithmetic)")
    lower.add_argument("--verify", action="store_true",
                       help="run `dql-pass verify INPUT OUTPUT` on the result; exit 1 if it finds a mismatch")
    lower.set_defaults(run=_lower, zero_range="onnxruntime")

    fuse = commands.add_parser("fuse", help="turn decomposed DynamicQuantizeLinear back into single nodes")
    fuse.add_argument("input", help="the ONNX model to read; it is never modified")
    fuse.add_argument("-o", "--output", required=True, help="where to write the fused model")
    fuse.set_defaults(run=_fuse)

    verify = commands.add_parser("verify", help="check a rewritten model against the original, bit for bit, on ORT")
    verify.add_argument("original", help="the model with DynamicQuantizeLinear")
    verify.add_argument("rewritten", help="the rewritten model, by dql-pass or any other tool")
    verify.add_argument("--samples", type=_whole_number, default=2, help="random input sets for the model level (default 2), "
                        "besides all-zero, all-negative, all-positive and heavy-tailed sets when there is a float input")
    verify.add_argument("--seed", type=_whole_number, default=0, help="seed of the random catalogue cases and model inputs")
    verify.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="use this array for model input NAME in every input set (repeatable)")
    verify.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="size of symbolic dimension NAME (default: its size in an --input array, else 2 for "
                             "batch-like names, 1 if ORIGINAL does not run at 2, else 128; repeatable)")
    verify.add_argument("--zero-range", choices=dql_pass.ZERO_RANGE_POLICIES, default="onnxruntime",
                        help="the policy the reference follows on all-zero and empty inputs (default onnxruntime)")
    verify.add_argument("--runtime", choices=list(runtimes.RUNTIMES), default="onnxruntime",
                        help="run REWRITTEN on this runtime (its sites also on ORT); the expected values stay the "
                        "NumPy reference (default onnxruntime)")
    verify.add_argument("--json", metavar="REPORT", help="also write the report as JSON to REPORT")
    verify.set_defaults(run=_verify)

    gen_tests = commands.add_parser("gen-tests", help="write a conformance suite in ONNX's backend-test layout")
    gen_tests.add_argument("outdir", nargs="?", default="conformance/dql",
                           help="the suite folder (default conformance/dql); onnx's loader reads it with "
                                "data_dir=its parent, kind=its name")
    gen_tests.add_argument("--opsets", type=_opsets, default=",".join(map(str, suites.DEFAULT_OPSETS)),
                           help="ai.onnx opsets, comma-separated (default %(default)s)")
    gen_tests.add_argument("--variants", default=",".join(suites.FORMS),
                           help="native (the DQL node) and the expansion variants to write, comma-separated "
                                "(default %(default)s)")
    gen_tests.add_argument("--zero-range", choices=dql_pass.ZERO_RANGE_POLICIES, default="onnxruntime",
                           help="the policy of the expected outputs and of the expansion (default onnxruntime)")
    gen_tests.add_argument("--include-unspecified", action="store_true",
                           help="also write NaN inputs; their outputs are unspecified, so they are not compared")
    gen_tests.add_argument("--no-large", action="store_true",
                           help="leave out the input of about a million elements (5 MB per folder)")
    gen_tests.add_argument("--force", action="store_true",
                           help="replace the suite in OUTDIR even when it holds files that gen-tests did not write")
    gen_tests.set_defaults(run=_gen_tests)

    run_tests = commands.add_parser("run-tests", help="run a conformance suite and compare every output bit for bit")
    run_tests.add_argument("outdir", nargs="?", default="conformance/dql",
                           help="the suite folder (default conformance/dql); manifest.json is optional")
    run_tests.add_argument("--runtime", "--backend", choices=list(runtimes.RUNTIMES), default="onnxruntime",
                           help="the runtime to run it on (default onnxruntime); see `dql-pass expand --list-targets`")
    run_tests.set_defaults(run=_run_tests)
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every write on the way out is undone."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as done:  # a usage error (one line, exit 2) or --help (exit 0)
        return done.code
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        return args.run(args)
    except (dql_pass.InputError, MissingDependency) as error:
        print(f"dql-pass: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        # The temporary files are gone by now: every write undoes itself on the way out.
        print("dql-pass: interrupted", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(interrupt, _Terminated) else signal.SIGINT)


def run() -> None:
    """The process entry point: the ``dql-pass`` script and ``python -m dql_pass``."""
    # A short-lived process that builds large graphs: the cyclic GC would only rescan them, and
    # freeing them object by object at exit takes as long as writing them; the OS frees at once.
    gc.disable()
    if hasattr(signal, "SIGPIPE"):
        # Die quietly when the reader goes away (`| head`), as command-line tools do.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, _terminate)
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
