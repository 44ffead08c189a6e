"""The process of a worker (:mod:`dql_pass.runtimes.worker`), started by path so that it needs numpy and
the runtime only (not dql_pass, nor the caller's ``__main__``): ``RUNTIME serve`` answers requests by the
functions of the module ``RUNTIME_worker.py`` beside this file; ``RUNTIME FUNCTION ARGUMENTS...`` calls one
function of it once, its value the exit status.

``serve`` reads one pickled ``(function, arguments, dropped)`` from stdin per request: the module's
``drop(key)`` for each key dropped (only a module with ``drop`` gets any), then ``function(*arguments)``,
answered on the original stdout with a pickled ``("ok", value)``, ``("error", message)`` for the runtime's refusal (an
exception of the modules the worker module's ``FAILURES`` names; any, where it names none), or ``("bug",
traceback)`` for any other exception. The process ends at the end of stdin, or when its parent is gone (a
request under way is not finished for nobody). The runtime's own prints go to stderr, so that they never
mix with the answers.
"""

import importlib.util
import os
import pickle
import sys
import threading
import time
import traceback

PARENT = "DQL_PASS_WORKER_PARENT"  # the environment variable that holds the caller's process id
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    del sys.path[0]  # this folder: its torch.py, tract.py and mnn.py would stand for the real ones


def _module(runtime: str):
    spec = importlib.util.spec_from_file_location(f"{runtime}_worker", os.path.join(_HERE, f"{runtime}_worker.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _end_with(parent: int) -> None:
    while os.getppid() == parent:  # an orphan is adopted by another process
        time.sleep(0.5)
    os._exit(1)


def serve(module) -> int:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    failures = getattr(module, "FAILURES", ())
    parent = int(os.environ.get(PARENT, os.getppid()))  # the caller's, in case it ended before this started
    threading.Thread(target=_end_with, args=(parent,), daemon=True).start()
    while True:
        try:
            function, arguments, dropped = pickle.load(sys.stdin.buffer)
        except EOFError:
            return 0
        try:
            for key in dropped:
                module.drop(key)
            message = ("ok", getattr(module, function)(*arguments))
        except Exception as error:
            ours = failures and not type(error).__module__.startswith(failures)
            message = ("bug", traceback.format_exc()) if ours else ("error", f"{type(error).__name__}: {error}")
        pickle.dump(message, answers)
        answers.flush()


if __name__ == "__main__":
    runtime, function, *arguments = sys.argv[1:]
    module = _module(runtime)
    sys.exit(serve(module) if function == "serve" else getattr(module, function)(*arguments))
