"""One command run: :func:`main` in-process (an exit code back, never SystemExit; its lines and its log
through stdout and stderr as they are at call time; the log level and a runtime's --runtime-timeout set for
the command only), and :func:`run`, the process around it (:mod:`dql_pass.__main__` loads it).

The command's libraries are imported with the stopping signals held back, and every command imports
what it runs, so that ``--help`` and a usage error cost no graph library.
"""

from __future__ import annotations

__all__ = ["main", "run"]

import argparse
import contextlib
import errno
import gc
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence

from dql_pass import interrupts
from dql_pass.cli import parser as cli_parser
from dql_pass.cli import values
from dql_pass.cli.output import write_json
from dql_pass.errors import InputError, MissingDependency


def _heavy_modules(args: argparse.Namespace) -> list[str]:
    """The libraries the command will load: the graph libraries always, ORT (through its adapter,
    which turns its telemetry off) where it runs models, onnxscript's rewriter to fuse."""
    modules = ["dql_pass.api"]
    runs = args.command in ("verify", "gen-tests", "run-tests")
    if runs or getattr(args, "verify", False) or getattr(args, "target", None):
        modules.append("onnxruntime")
    if args.command == "fuse":
        modules.append("dql_pass.fusion")
    return modules


def _import_held(*modules: str) -> None:
    """Import ``modules`` with Ctrl-C, SIGTERM and SIGHUP held back until they are in: an interrupt inside a
    library's import leaves it half made (onnxruntime turns it into an ImportError with a
    traceback); held, it arrives a moment later, where it unwinds cleanly."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, set(interrupts.SIGNALS))
    try:
        for module in modules:
            if module == "onnxruntime":
                from dql_pass.runtimes.ort import import_onnxruntime

                import_onnxruntime()
            else:
                importlib.import_module(module)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextlib.contextmanager
def _runtime_timeout(args: argparse.Namespace) -> Iterator[None]:
    """--runtime-timeout: the limit of the runtime the command runs besides ORT, for this command only."""
    if getattr(args, "runtime_timeout", None) is None:
        yield
        return
    from dql_pass import runtimes

    chosen = [runtimes.get(name) for name in {getattr(args, "target", None), getattr(args, "runtime", None)} - {None}]
    before = [runtime.timeout for runtime in chosen]
    try:
        for runtime in chosen:
            runtime.timeout = args.runtime_timeout
        yield
    finally:
        for runtime, timeout in zip(chosen, before):
            runtime.timeout = timeout


@contextlib.contextmanager
def _logging(args: argparse.Namespace) -> Iterator[None]:
    """The command's log lines on stderr as it is now (-v: each step, -q: errors only), for this command only."""
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO if args.verbose else logging.ERROR if args.quiet else logging.WARNING)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


_FILE_LABELS = {"input": "the input model", "output": "the output model", "original": "ORIGINAL",
                "rewritten": "REWRITTEN", "model": "the model"}


def _files_of(args: argparse.Namespace) -> dict[str, str]:
    """The files a command reads or writes, by what they are: its --json report never replaces one."""
    files = {label: getattr(args, key) for key, label in _FILE_LABELS.items()
             if isinstance(getattr(args, key, None), str)}
    if args.command == "verify":
        files.update((f"the input array {name}", path) for name, path in values.pairs(args.input, "--input").items())
    return files


def _run(args: argparse.Namespace) -> int:
    """Run the command ``args`` name; its exit code, and its --json report written."""
    report_path = None
    if args.json:
        from dql_pass.files.report_path import check_report_path

        folders = {"the suite folder": args.outdir} if args.command in ("gen-tests", "run-tests") else {}
        report_path = check_report_path(args.json, _files_of(args), folders)
    _import_held(*_heavy_modules(args))
    with _runtime_timeout(args):
        code, report = importlib.import_module(args.handler).run(args)
    if report_path is not None:
        write_json(report_path, {"command": args.command, "exit_code": code, **report})
    return code


# A path no check could name a file with (a part past 255 bytes, links in a loop): the system's word for it.
_UNNAMEABLE = (errno.ENAMETOOLONG, errno.ELOOP)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code."""
    try:
        parser = cli_parser.build()
        try:
            args = parser.parse_args(argv)
        except SystemExit as done:  # a usage error (one line, exit 2), --help or --version (exit 0)
            return done.code
        if args.command is None:  # a bare dql-pass: the commands, as --help lists them
            parser.print_help(sys.stderr)
            return 2
        with _logging(args):
            return _run(args)
    except (InputError, MissingDependency) as error:
        print(f"dql-pass: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:  # the temporary files are gone by now: every write undoes itself
        return interrupts.report(interrupt)
    except Exception as error:
        interrupt = interrupts.cause(error)
        if interrupt is not None:
            return interrupts.report(interrupt)
        if not isinstance(error, OSError) or error.errno not in _UNNAMEABLE or error.filename is None:
            raise  # any other: a bug of ours, or of a runtime, with its traceback
        print(f"dql-pass: error: {error.filename}: {error.strerror}", file=sys.stderr)
        return 2


def _open_closed_streams() -> None:
    """A standard descriptor the parent closed is taken by the null device: else the next file the command opens
    would get it, and a library or runtime writing to stdout or stderr would write into that file (the output).
    Python's stream for it is None, whose first write would end the command with exit 1 and nothing said: it
    writes to the null device too, and the other stream still reports."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:  # closed: the lowest free descriptor, the ones below being open by now
            os.open(os.devnull, os.O_RDWR)
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "r" if fd == 0 else "w"))


def run() -> None:
    """Run the command of ``sys.argv`` and end the process (:mod:`dql_pass.__main__` loads it)."""
    # A short-lived process that builds large graphs: the cyclic GC would only rescan them, and
    # freeing them object by object at exit takes as long as writing them; the OS frees at once.
    try:
        gc.disable()
        interrupts.install()
        _open_closed_streams()
        code = main()
        sys.stdout.flush()
        sys.stderr.flush()
    except KeyboardInterrupt as interrupt:  # before main, or while flushing
        code = interrupts.report(interrupt)
    except BrokenPipeError:
        # The reader went away (`| head`): end quietly, as SIGPIPE would have ended it. SIGPIPE itself stays
        # ignored (Python's default): at its default, a browser page or a worker that closes its end of a socket
        # or pipe would kill the command, silently, mid-write (what their adapters report as their failure).
        code = 128 + getattr(signal, "SIGPIPE", 13)
    sessions = sys.modules.get("dql_pass.runtimes.sessions")  # loaded where a runtime ran: never loaded here
    if sessions is not None:
        # os._exit runs no finalizer: the sessions' model copies go first, all of them, whatever signal
        # comes meanwhile (a second Ctrl-C): the exit code is decided, only debris is left to lose.
        for stopping in interrupts.SIGNALS:  # ignored, not blocked: a library's threads would take them
            signal.signal(stopping, signal.SIG_IGN)
        sessions.release_held()
    os._exit(code)
