"""``dql-pass gen-tests``: generate_suite and what it wrote."""

from __future__ import annotations

import argparse
import shlex

from dql_pass.cli.output import note, say


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def run(args: argparse.Namespace) -> tuple[int, dict]:
    import dql_pass
    from dql_pass.suites.defaults import DEFAULT_OPSETS

    variants = None if args.variants is None else _items(args.variants)
    suite = dql_pass.generate_suite(
        args.outdir, opsets=args.opsets or DEFAULT_OPSETS, variants=variants, zero_range=args.zero_range,
        include_unspecified=args.include_unspecified, include_large=not args.no_large, force=args.force,
        ops=_items(args.ops), size=args.size, family_opsets=args.opsets,
    )
    say(args, suite.format())
    if not args.quiet:
        note(f"next: {shlex.join(['dql-pass', 'run-tests', args.outdir])} --runtime NAME runs it on a runtime "
             "(dql-pass run-tests --help lists them); docs/suites.md has the layout, to run it elsewhere")
    return 0, suite.to_dict()
