"""``dql-pass expand``: expand_file, its result, then the target's check and --verify."""

from __future__ import annotations

import argparse

from dql_pass.cli.output import note, say
from dql_pass.cli.written import after_writing, check_before_writing


def run(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass

    check_before_writing(args)
    result = dql_pass.expand_file(args.input, args.output, variant=args.variant, mode=args.mode,
                                  zero_range=args.zero_range, target=args.target, share_data=args.share_data)
    say(args, result.format())
    if not args.quiet:
        note(result.target_note())
    return after_writing(args, result.to_dict())
