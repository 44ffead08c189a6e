"""``dql-pass fuse``: fuse_file and its result."""

from __future__ import annotations

import argparse

from dql_pass.cli.output import say


def run(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass

    result = dql_pass.fuse_file(args.input, args.output, share_data=args.share_data)
    say(args, result.format())
    return 0, result.to_dict()
