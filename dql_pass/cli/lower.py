"""``dql-pass lower``: lower_file, its result (each node's proof under -v), then the target's check and --verify."""

from __future__ import annotations

import argparse

from dql_pass.cli.output import say
from dql_pass.cli.written import after_writing, check_before_writing


def run(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass

    check_before_writing(args)
    result = dql_pass.lower_file(args.input, args.output, target=args.target, weights=args.weights,
                                 blocks=args.blocks, share_data=args.share_data)
    say(args, result.format(verbose=args.verbose))
    return after_writing(args, result.to_dict())
