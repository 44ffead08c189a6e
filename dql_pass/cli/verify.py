"""``dql-pass verify``: the input arrays read with bounds, verify, and its report naming the files."""

from __future__ import annotations

import argparse
import dataclasses

from dql_pass.cli import values
from dql_pass.cli.progress import show, verify_with_progress


def run(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass
    from dql_pass.files.arrays import load_arrays
    from dql_pass.verification import MAX_INPUT_BYTES

    dims = values.dims(args)
    inputs = load_arrays(values.pairs(args.input, "--input"), MAX_INPUT_BYTES)
    original, rewritten = dql_pass.load_model(args.original), dql_pass.load_model(args.rewritten)
    report = verify_with_progress(
        args, original, rewritten, samples=args.samples, seed=args.seed, inputs=inputs, dims=dims,
        zero_range=args.zero_range, runtime=args.runtime,
    )
    # verify names in-memory models after their graphs; the report names the files.
    return show(args, dataclasses.replace(report, original=args.original, rewritten=args.rewritten))
