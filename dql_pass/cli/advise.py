"""``dql-pass advise``: advise and its advice."""

from __future__ import annotations

import argparse

from dql_pass.cli.output import say


def run(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass

    advice = dql_pass.advise(args.model, args.runtime or None, load=args.load)
    say(args, advice.format())
    return 0, advice.to_dict()
