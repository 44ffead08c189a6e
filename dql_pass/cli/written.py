"""What expand and lower do once they have written the model: with ``--target``, check it there (what
still blocks it goes to stderr, and makes the exit code 1); with ``--verify``, verify it."""

from __future__ import annotations

__all__ = ["after_writing", "check_before_writing"]

import argparse
import shlex
import sys

from dql_pass.cli import values
from dql_pass.cli.output import note
from dql_pass.cli.progress import show, verify_with_progress


def check_before_writing(args: argparse.Namespace) -> None:
    """What --target's check and --verify read of the options, checked before the pass writes: a bad
    --dim, or a runtime to verify on that is not installed, is exit 2 with the output as it was."""
    dims = values.dims(args)
    if args.verify:
        from dql_pass import runtimes

        runtimes.get(args.target or "onnxruntime").check_installed()
    if dims:  # --verify and --target's check both size the inputs with them
        from dql_pass.files import read_model
        from dql_pass.verification.synthesis import check_dims

        try:  # unchecked and without its weights: the pass's own load checks it, and says why it is refused
            graph_inputs = read_model(args.input).graph.inputs
        except Exception:  # a file onnx_ir cannot read
            return
        check_dims(graph_inputs, dims, "--dim {}")


def _verify_command(args: argparse.Namespace) -> str:
    """The verify command that checks what expand or lower wrote, with the options they would verify it with."""
    from dql_pass import runtimes

    words = ["dql-pass", "verify", args.input, args.output]
    if args.zero_range != "onnxruntime":
        words += ["--zero-range", args.zero_range]
    words += [word for pair in args.dim for word in ("--dim", pair)]
    if args.target and runtimes.get(args.target).installed():
        words += ["--runtime", args.target]
    return shlex.join(words)


def after_writing(args: argparse.Namespace, report: dict) -> tuple[int, dict]:
    """The exit code and the --json report of expand or lower, ``report`` being what the pass said."""
    blocked = False
    if args.target is not None:
        from dql_pass.deployment import check_target, checking

        line = None if args.quiet else checking(args.output, args.target)
        if line:
            print(line, file=sys.stderr, flush=True)
        found = check_target(args.command, args.input, args.output, args.target, values.dims(args))
        note(found.format(quiet=args.quiet))
        report.update(found.to_dict())
        blocked = bool(found)
    code = 0
    if args.verify:  # an expansion for a target is verified there
        verified = verify_with_progress(args, args.input, args.output, zero_range=args.zero_range,
                                        dims=values.dims(args), runtime=args.target or "onnxruntime")
        code, report["verify"] = show(args, verified)
    elif not args.quiet:
        note(f"next: {_verify_command(args)} checks it bit for bit (or run this command again with --verify)")
    return (1 if blocked else code), report
