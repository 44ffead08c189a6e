"""The command line of runtimes that need more than pip, one per adapter:
``python -m dql_pass.runtimes.NAME setup`` installs what is missing, ``check`` says what is (exit 2)
or that all is there. A missing piece or a failed step is one line and exit code 2.
"""

from __future__ import annotations

__all__ = ["main"]

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from dql_pass.errors import MissingDependency


def main(
    package: str, description: str, setup: Callable[[], None], missing: Callable[[], str | None],
    ready: Callable[[], str], argv: Sequence[str] | None = None,
) -> int:
    """Run ``setup`` or the check of ``missing`` for the adapter ``package``; ``ready`` says what is there."""
    parser = argparse.ArgumentParser(prog=f"python -m {package}", description=description)
    parser.add_argument("command", choices=["setup", "check"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        if args.command == "setup":
            setup()
        elif (problem := missing()) is not None:
            raise MissingDependency(problem)
    except MissingDependency as error:
        print(f"{package}: error: {error}", file=sys.stderr)
        return 2
    print(ready())
    return 0
