"""The process entry point: ``python -m dql_pass`` and the ``dql-pass`` script.

The signals that stop a command are handled from here on (:mod:`dql_pass.interrupts`), before
the command line loads: Ctrl-C, SIGTERM or SIGHUP while it loads ends the process as later, with
one line and no traceback. Before this module runs, the interpreter's own start has Python's
defaults, as every Python program has.
"""

import os


def run() -> None:
    """Run the command line; a signal while it loads ends the process as one later does."""
    try:
        from dql_pass import interrupts  # imports nothing heavy
    except KeyboardInterrupt:
        os.write(2, b"dql-pass: interrupted\n")
        os._exit(130)
    try:
        interrupts.install()
        from dql_pass import cli

        cli.run()  # ends the process; a signal before its own handling starts, or after it ends, lands here
    except KeyboardInterrupt as interrupt:
        os._exit(interrupts.report(interrupt))


if __name__ == "__main__":
    run()
