"""The arguments of each command, one function a command, with their help."""

from __future__ import annotations

__all__ = ["advise", "expand", "fuse", "gen_tests", "lower", "run_tests", "runtime_timeout", "verify"]

import argparse
from collections.abc import Sequence
from typing import NoReturn

from dql_pass import variants
from dql_pass.cli.values import opsets, runtime_name, seconds, whole_number

_TARGET = "; see `dql-pass expand --list-targets` for the runtimes"
_LIST_TARGETS = ("print one line per target (its variant, lower's weights, whether it is installed, what it "
                 "lacks, where it still differs) and the runtimes without an adapter, and exit; with -v, each reason "
                 "too (what else follows it is not read)")
_ZERO_RANGE = "the scale of an all-zero or empty input: 1.0 (onnxruntime, default) or 1/255 (onnx-reference)"
_SHARE = ("an output in the input's folder refers to the input's external data files instead of copying "
          "what it keeps into its own (fast for large models; the output then needs those files). "
          "Default: the output and the data file written for it stand alone")
_DIM = ("size of symbolic dimension NAME (repeatable; default: its size in an --input array, else 2 for "
        "a batch-like one (named batch, or the first axis of an input of rank 2 or more; a batch given "
        "for one is every one's), else 16; 3 and 17 in the second input set, batch 1 in the third; others "
        "where ORIGINAL does not run at those)")
_VERIFY = "run `dql-pass verify INPUT OUTPUT` on the result; exit 1 if it finds a mismatch"


class _ListTargets(argparse.Action):
    """Lists the targets and exits before the input and -o are asked for; it takes the rest of the line, so that
    a -v after it counts as one before it does, and one before the command too."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=argparse.REMAINDER, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        from dql_pass.runtimes.listing import format_targets

        before = getattr(getattr(parser, "top", None), "parsed", None)  # a -v before the command
        verbose = (getattr(before, "verbose", False) or getattr(namespace, "verbose", False)
                   or any(value in ("-v", "--verbose") for value in values))
        print(format_targets(verbose))
        parser.exit(0)


def runtime_timeout(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--runtime-timeout", type=seconds, metavar="SECONDS",
                        help="seconds the runtime may take to load or run a model once, where its adapter limits them "
                             "(webgpu and wasm: 120 to load, 300 to run; mnn: 600 to convert, 600 to run; tract and "
                             "openvino: 600 to load or run; litert: 600 to convert); past it, what it kept unchecked "
                             "is reported as such")
    return parser


def _rewrite(parser: argparse.ArgumentParser, what: str) -> None:
    """The input and the output of a command that rewrites a model."""
    parser.add_argument("input", help="the ONNX model to read; it is never modified")
    parser.add_argument("-o", "--output", required=True, help=f"where to write the {what} model")


def _verify_after(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verify", action="store_true", help=_VERIFY)
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="with --verify or --target: " + _DIM)
    parser.add_argument("--share-data", action="store_true", help=_SHARE)


def expand(parser: argparse.ArgumentParser) -> None:
    _rewrite(parser, "expanded")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--variant", choices=variants.NAMES,
                        help="; ".join(f"{v.name}: {v.summary}" for v in variants.REGISTRY)
                        + " (default quantizelinear)")
    chosen.add_argument("--target", metavar="RUNTIME", type=runtime_name,
                        help="the runtime the model is for: the variant that is exact there" + _TARGET)
    parser.add_argument("--list-targets", action=_ListTargets, help=_LIST_TARGETS)
    parser.add_argument("--mode", choices=variants.MODES, default="inline",
                        help="inline the ops (default) or call one model-local function")
    parser.add_argument("--zero-range", choices=variants.ZERO_RANGE_POLICIES, default="onnxruntime", help=_ZERO_RANGE)
    _verify_after(parser)


def lower(parser: argparse.ArgumentParser) -> None:
    _rewrite(parser, "lowered")
    parser.add_argument("--target", metavar="RUNTIME", type=runtime_name,
                        help="the runtime to lower for: its exact DynamicQuantizeLinear variant, and the ops it "
                             "still lacks in the report (default: no target, variant arithmetic)" + _TARGET)
    parser.add_argument("--list-targets", action=_ListTargets, help=_LIST_TARGETS)
    parser.add_argument("--weights", choices=variants.WEIGHTS,
                        help="integer: keep constant int8/uint8 weights as they are, cast and shifted in the graph, "
                             "which runtimes fold at load; float: store them cast and shifted as float32, four times "
                             "larger (default: the target's, see --list-targets; float without a target)")
    parser.add_argument("--blocks", action=argparse.BooleanOptionalAction,
                        help="where only lowered MatMulInteger/ConvInteger read a DynamicQuantizeLinear's y and zero "
                             "point, keep y - zero point in float32: no uint8 tensor, no Cast out and back, and no "
                             "Cast pair after the product (default: the target's, on for webgpu and wasm; off "
                             "without a target)")
    _verify_after(parser)
    parser.set_defaults(zero_range="onnxruntime")


def advise(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the ONNX model to deploy")
    parser.add_argument("--runtime", action="append", default=[], metavar="RUNTIME", type=runtime_name,
                        help="answer for this runtime only (repeatable; default: every runtime dql_pass knows, with "
                             "an adapter or not: see --list-targets)")
    parser.add_argument("--load", action=argparse.BooleanOptionalAction, default=None,
                        help="also load and run the model on each installed runtime with an adapter, since a load "
                             "tells of what no stated lack names (default: only on the runtimes named with --runtime)")
    parser.add_argument("--list-targets", action=_ListTargets, help=_LIST_TARGETS)


def fuse(parser: argparse.ArgumentParser) -> None:
    _rewrite(parser, "fused")
    parser.add_argument("--share-data", action="store_true", help=_SHARE)


def verify(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("original", help="the model with DynamicQuantizeLinear")
    parser.add_argument("rewritten", help="the rewritten model, by dql-pass or any other tool")
    parser.add_argument("--samples", type=whole_number, default=3, help="random input sets for the model level "
                        "(default 3: at batch 2, 3 and 1), besides all-zero, all-negative, all-positive and "
                        "heavy-tailed sets when there is a float input")
    parser.add_argument("--seed", type=whole_number, default=0,
                        help="seed of the random catalogue cases and model inputs")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="use this array for model input NAME in every input set (repeatable)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help=_DIM)
    parser.add_argument("--zero-range", choices=variants.ZERO_RANGE_POLICIES, default="onnxruntime",
                        help="the policy the reference follows on all-zero and empty inputs (default onnxruntime)")
    parser.add_argument("--runtime", metavar="RUNTIME", type=runtime_name, default="onnxruntime",
                        help="run REWRITTEN on this runtime (its sites also on ORT); the expected values stay the "
                        "NumPy reference (default onnxruntime)" + _TARGET)


def gen_tests(parser: argparse.ArgumentParser) -> None:
    # The suites' defaults, as leaves: the suite package loads only when a suite is written or run.
    from dql_pass.suites.defaults import DEFAULT_OPSETS, DEFAULT_OUTDIR, FORMS

    parser.add_argument("outdir", nargs="?", default=DEFAULT_OUTDIR,
                        help="the suite folder (default %(default)s, created with its parents); onnx's loader reads it "
                             "with data_dir=its parent, kind=its name")
    parser.add_argument("--opsets", type=opsets, default=None,
                        help="ai.onnx opsets, comma-separated (default: %s for DynamicQuantizeLinear; every opset "
                             "at which each other op changed)" % ",".join(map(str, DEFAULT_OPSETS)))
    parser.add_argument("--ops", default="DynamicQuantizeLinear",
                        help="the ops to write suites for, comma-separated, from DynamicQuantizeLinear, "
                             "MatMulInteger, ConvInteger, QuantizeLinear, DequantizeLinear (default %(default)s)")
    parser.add_argument("--size", choices=("small", "full"), default="small",
                        help="the family's sweeps: small for CI, full for larger sweeps and tensors "
                             "(default %(default)s)")
    parser.add_argument("--variants", default=None,
                        help="native (the DQL node) and the expansion variants to write, comma-separated "
                             "(default %s)" % ",".join(FORMS))
    parser.add_argument("--zero-range", choices=variants.ZERO_RANGE_POLICIES, default="onnxruntime",
                        help="the policy of the expected outputs and of the expansion (default onnxruntime)")
    parser.add_argument("--include-unspecified", action="store_true",
                        help="also write NaN inputs; their outputs are unspecified, so they are not compared")
    parser.add_argument("--no-large", action="store_true",
                        help="leave out the input of about a million elements (5 MB per folder)")
    parser.add_argument("--force", action="store_true",
                        help="replace the suite in OUTDIR even when it holds files that gen-tests did not write")


def run_tests(parser: argparse.ArgumentParser) -> None:
    from dql_pass.suites.defaults import DEFAULT_OUTDIR

    parser.add_argument("outdir", nargs="?", default=DEFAULT_OUTDIR,
                        help="the suite folder (default %(default)s); manifest.json is optional")
    parser.add_argument("--runtime", "--backend", metavar="RUNTIME", type=runtime_name, default="onnxruntime",
                        help="the runtime to run it on, a comma-separated list of them, or all; with more than one, "
                             "the counts per op x runtime (default onnxruntime)" + _TARGET)
    parser.add_argument("--report-dir", metavar="DIR",
                        help="write a divergence report per failing runtime x op under DIR (a new or empty folder)")
    parser.add_argument("--raw", action="store_true",
                        help="ignore the manifest's known differences: every difference is a FAIL (for a runtime's "
                             "author)")
