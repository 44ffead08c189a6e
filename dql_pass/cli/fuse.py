"""``dql-pass fuse``: fuse_file and its result."""

from __future__ import annotations

import argparse
import shlex

from dql_pass.cli.output import note, say


def run(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass

    result = dql_pass.fuse_file(args.input, args.output, share_data=args.share_data)
    say(args, result.format())
    if not args.quiet:
        note(f"next: {shlex.join(['dql-pass', 'verify', args.input, args.output])} checks it bit for bit")
    return 0, result.to_dict()
