"""The ``dql-pass`` command line: a thin shell over the public API.

- :mod:`~dql_pass.cli.parser` and :mod:`~dql_pass.cli.arguments`: the parser, one function per command's
  arguments, built from leaf modules only, so that ``--help`` and a usage error cost no graph library;
- one module per command (:mod:`~dql_pass.cli.expand`, ``fuse``, ``lower``, ``verify``, ``gen_tests``,
  ``run_tests``, ``advise``): it calls the public API and prints the report that comes back, formatted by the
  report itself (``format()``, and ``to_dict()`` for ``--json``);
- :mod:`~dql_pass.cli.written`: what expand and lower do after writing (``--target``'s check, ``--verify``);
- :mod:`~dql_pass.cli.output`: the command's own lines and its ``--json`` report;
- :mod:`~dql_pass.cli.process`: one command run in-process (:func:`main`), and the process around it (:func:`run`).

Exit codes: 0 on success, 1 when verify finds a mismatch or run-tests a failure, 2 on bad input (one
line on stderr, no traceback), 130 on Ctrl-C, 143 on SIGTERM and 129 on SIGHUP (see
:mod:`dql_pass.interrupts`).
"""

from __future__ import annotations

__all__ = ["main", "run"]

from dql_pass.cli.process import main, run
