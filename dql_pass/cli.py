"""The ``dql-pass`` command line: a thin shell over the public API.

Exit codes: 0 on success, 2 on bad input (one line on stderr, no traceback).
"""

from __future__ import annotations

__all__ = ["main"]

import argparse
import logging
import sys
import time
from collections.abc import Sequence

import dql_pass


def _expand(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    model = dql_pass.load_model(args.input)
    rewrite = dql_pass.ExpandDynamicQuantizeLinearPass(
        variant=args.variant, mode=args.mode, zero_range=args.zero_range
    )
    result = rewrite(model)
    dql_pass.save_model(result.model, args.output, source=args.input)
    elapsed = time.perf_counter() - start
    if not result.sites:
        print(f"{args.input}: no DynamicQuantizeLinear; wrote it unchanged to {args.output} ({elapsed:.2f} s)")
        return 0
    total = sum(result.sites.values())
    print(
        f"expanded {total} DynamicQuantizeLinear (variant {args.variant}, mode {args.mode}, "
        f"zero range {args.zero_range}) into {args.output} in {elapsed:.2f} s"
    )
    for label, count in result.sites.items():
        print(f"  {count:6d}  {label}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dql-pass", description="Expand ONNX DynamicQuantizeLinear into primitive ops, bit-exact with ONNX Runtime."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log what each pass does")
    commands = parser.add_subparsers(dest="command", required=True)

    expand = commands.add_parser("expand", help="rewrite every DynamicQuantizeLinear into primitive ops")
    expand.add_argument("input", help="the ONNX model to read; it is never modified")
    expand.add_argument("-o", "--output", required=True, help="where to write the expanded model")
    expand.add_argument("--variant", choices=dql_pass.VARIANTS, default="quantizelinear",
                        help="quantizelinear (default, uses QuantizeLinear) or arithmetic (no quantization ops)")
    expand.add_argument("--mode", choices=dql_pass.MODES, default="inline",
                        help="inline the ops (default) or call one model-local function")
    expand.add_argument("--zero-range", choices=dql_pass.ZERO_RANGE_POLICIES, default="onnxruntime",
                        help="the scale of an all-zero or empty input: 1.0 (onnxruntime) or 1/255 (onnx-reference)")
    expand.set_defaults(run=_expand)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    try:
        return args.run(args)
    except dql_pass.InputError as error:
        print(f"dql-pass: error: {error}", file=sys.stderr)
        return 2
