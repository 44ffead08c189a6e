"""The parser of ``dql-pass``: the top level, the options every command takes, and one subparser per
command (its arguments in :mod:`dql_pass.cli.arguments`). Built from leaf modules only: ``--help`` and a
usage error cost no graph library."""

from __future__ import annotations

__all__ = ["build"]

import argparse
from collections.abc import Sequence
from typing import NoReturn

from dql_pass.cli import arguments


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line like every other bad input (``-h`` shows the usage). A command's
    parser knows the top-level one (``top``) and what it parsed before the command (``parsed``): argparse gives a
    command's actions a namespace of their own, and --list-targets exits before the two are merged."""

    top: Parser | None = None
    parsed: argparse.Namespace | None = None
    commands: dict[str, Parser] = {}  # the top-level parser's: each command's, by name (build sets its own)

    def parse_known_args(self, args=None, namespace=None):
        self.parsed = argparse.Namespace() if namespace is None else namespace
        return super().parse_known_args(args, self.parsed)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:  # said by the command's parser, which names the command's --help, not the top-level one's
            command = self.commands.get(getattr(parsed, "command", None), self)
            command.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog.split()[0]}: error: {message} (see `{self.prog} --help`)\n")


class _Version(argparse.Action):
    """--version, read from the installed metadata only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> NoReturn:
        import dql_pass

        print(f"dql-pass {dql_pass.__version__}")
        parser.exit(0)


def _common(top: bool) -> argparse.ArgumentParser:
    """-v, -q and --json, taken before the command or after it; a command's copy leaves the top's value alone."""
    common = argparse.ArgumentParser(add_help=False)
    unset = {} if top else {"default": argparse.SUPPRESS}
    loudness = common.add_mutually_exclusive_group()
    loudness.add_argument("-v", "--verbose", action="store_true", help="log what each step does", **unset)
    loudness.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors; the exit code tells",
                          **unset)
    common.add_argument("--json", metavar="FILE", help="also write the command's report as JSON to FILE", **unset)
    return common


# The commands in the order --help lists them, each with the module that runs it (imported when it runs).
_COMMANDS = [
    ("expand", arguments.expand, True, "rewrite every DynamicQuantizeLinear into primitive ops"),
    ("lower", arguments.lower, True, "rewrite the quantization ops of a quantize_dynamic model into float "
     "primitives, bit-exact, with the proof per node"),
    ("advise", arguments.advise, False, "say, per runtime, what a model needs there that the runtime lacks and the "
     "dql-pass command that gives it"),
    ("fuse", arguments.fuse, False, "turn decomposed DynamicQuantizeLinear back into single nodes"),
    ("verify", arguments.verify, True, "check a rewritten model against the original, bit for bit"),
    ("gen-tests", arguments.gen_tests, False, "write a conformance suite in ONNX's backend-test layout"),
    ("run-tests", arguments.run_tests, True, "run a conformance suite and compare every output bit for bit"),
]


def build() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dql-pass", parents=[_common(top=True)],
        description="Expand ONNX DynamicQuantizeLinear into primitive ops, bit-exact with ONNX Runtime.",
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    parser.commands = {}
    common = _common(top=False)
    timeout = arguments.runtime_timeout(Parser(add_help=False))
    for name, add_arguments, timed, summary in _COMMANDS:
        command = commands.add_parser(name, parents=[common, timeout] if timed else [common], help=summary)
        command.top = parser
        parser.commands[name] = command
        add_arguments(command)
        command.set_defaults(handler=f"dql_pass.cli.{name.replace('-', '_')}")
    return parser
