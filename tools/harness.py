"""What the benchmark scripts share: timing, whole-process measurement and the BENCHMARKS.md report.

Rules:

- Every comparison runs side by side, interleaved round robin (the start rotates each round so no
  contender always runs first), and is reported as a median. Each timed sample repeats a call
  often enough to last about :data:`SAMPLE_SECONDS`, so microsecond latencies are not lost in
  timer noise.
- Every session raced is compared bit for bit with the first, so a fast wrong answer shows.
- Whole processes are timed from outside; a process measured for memory reports its own peak RSS
  and bytes read.
- BENCHMARKS.md is made of ``## `` sections, each written by one script: :func:`write_report`
  replaces a script's sections and keeps the others verbatim, atomically.
"""

from __future__ import annotations

__all__ = [
    "REPO",
    "SAMPLE_SECONDS",
    "Section",
    "Target",
    "calls_per_sample",
    "cpu_model",
    "dql_pass_command",
    "format_time",
    "git_commit",
    "gpu_models",
    "interleaved",
    "machine",
    "measure_cli",
    "memory",
    "process",
    "race",
    "ratio_target",
    "same_outputs",
    "section_main",
    "table",
    "version",
    "write_report",
]

import argparse
import dataclasses
import importlib.metadata
import logging
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

import dql_pass
from dql_pass.compare import bit_difference
from dql_pass.files import atomic_path
from dql_pass.runtimes import Session

REPO = Path(__file__).resolve().parent.parent
SAMPLE_SECONDS = 2e-3
MAX_ROUNDS = 2000
# Runs the CLI in a fresh process that reports its own peak RSS and bytes read. VmHWM, not
# getrusage: ru_maxrss survives exec, so a child of a big parent would report the parent's peak.
MEASURED_CLI_SCRIPT = (
    "import json, sys; from dql_pass.cli import main; code = main(sys.argv[1:]); "
    "status = dict(l.split(':', 1) for l in open('/proc/self/status').read().splitlines()); "
    "io = dict(l.split(':', 1) for l in open('/proc/self/io').read().splitlines()); "
    "print(json.dumps({'code': code, 'peak_kib': int(status['VmHWM'].split()[0]), 'rchar': int(io['rchar'])}))"
)


# ---------------------------------------------------------------------------------------------
# Timing


def interleaved(
    contenders: Mapping[str, Callable[[], object]], *, budget: float, min_rounds: int, inner: int = 1
) -> dict[str, list[float]]:
    """Seconds per call of each contender, sampled round robin until ``budget`` seconds and ``min_rounds``.

    Each sample times ``inner`` calls. The first contender of a round rotates, so none is always
    first (or always right after the slowest one). One untimed call each warms up first.
    """
    for call in contenders.values():
        call()
    names = list(contenders)
    samples: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    rounds = 0
    while rounds < min_rounds or (time.perf_counter() - start < budget and rounds < MAX_ROUNDS):
        shift = rounds % len(names)
        for name in names[shift:] + names[:shift]:
            call = contenders[name]
            began = time.perf_counter()
            for _ in range(inner):
                call()
            samples[name].append((time.perf_counter() - began) / inner)
        rounds += 1
    return samples


def calls_per_sample(call: Callable[[], object]) -> int:
    """How many calls make a sample of about SAMPLE_SECONDS."""
    call()
    began = time.perf_counter()
    call()
    once = max(time.perf_counter() - began, 1e-7)
    return max(1, round(SAMPLE_SECONDS / once))


def same_outputs(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray]) -> bool:
    """The same number of outputs, each equal in dtype, shape and every bit."""
    return len(expected) == len(actual) and all(
        bit_difference(str(i), a, e) is None for i, (e, a) in enumerate(zip(expected, actual))
    )


def race(
    sessions: Mapping[str, Session], feeds: Mapping[str, np.ndarray], budget: float, min_rounds: int
) -> tuple[dict[str, float], dict[str, bool], int]:
    """Interleaved medians of ``session.run``, whether each output matches the first session's bits, rounds."""
    outputs = {name: s.run(feeds) for name, s in sessions.items()}
    baseline = next(iter(outputs.values()))
    same = {name: same_outputs(baseline, out) for name, out in outputs.items()}
    calls = {name: (lambda s=s: s.run(feeds)) for name, s in sessions.items()}
    inner = calls_per_sample(next(iter(calls.values())))
    samples = interleaved(calls, budget=budget, min_rounds=min_rounds, inner=inner)
    return {name: statistics.median(v) for name, v in samples.items()}, same, len(next(iter(samples.values())))


def format_time(seconds: float) -> str:
    """Three significant digits in the largest unit that keeps the number at least 1."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


# ---------------------------------------------------------------------------------------------
# Whole processes


def dql_pass_command() -> list[str]:
    """The installed ``dql-pass`` script next to this interpreter, else ``python -m dql_pass``."""
    script = Path(sys.executable).with_name("dql-pass")
    return [os.fspath(script)] if script.is_file() else [sys.executable, "-m", "dql_pass"]


def process(command: Sequence[str]) -> Callable[[], None]:
    """A call that runs ``command`` to the end and raises if it fails: a contender for :func:`interleaved`."""

    def call() -> None:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)

    return call


def measure_cli(args: Sequence[str]) -> tuple[float, dict[str, int]]:
    """Wall seconds of a fresh ``dql-pass ARGS`` process, and its exit ``code``, ``peak_kib`` and ``rchar``."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", MEASURED_CLI_SCRIPT, *args], check=True, capture_output=True,
                          text=True)
    return time.perf_counter() - began, json.loads(done.stdout.strip().splitlines()[-1])


def cli_process(tree: Path, *args: str, codes: Sequence[int] = (0,)) -> tuple[float, float, str, float]:
    """Wall seconds, peak RSS (MiB), last line and CPU seconds (user and system, every thread) of one
    ``python -m dql_pass ARGS`` run with ``tree``'s dql_pass; on a loaded machine the CPU seconds vary
    less than the wall. SystemExit with the output's tail on an exit code not in ``codes``."""
    environment = {**os.environ, "PYTHONPATH": os.fspath(tree)}
    with tempfile.TemporaryFile("w+") as out:
        began = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "dql_pass", *args], cwd=tree, env=environment,
                                 stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(child.pid, 0)  # reaped here, so its own peak RSS is known
        seconds = time.perf_counter() - began
        out.seek(0)
        text = out.read()
    code = os.waitstatus_to_exitcode(status)
    if code not in codes:
        raise SystemExit(f"{args[0]} exited {code}:\n{text[-4000:]}")
    return seconds, usage.ru_maxrss / 1024, (text.strip().splitlines() or [""])[-1], usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------
# The machine


def git_commit() -> str:
    """The commit of the dql_pass actually imported (which may not be this checkout)."""
    package = Path(dql_pass.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", os.fspath(package), "rev-parse", "--short", "HEAD"],
                                check=True, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", os.fspath(package), "status", "--porcelain", "--", "."],
                               check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" (dql_pass/ has uncommitted changes)" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_models(fields: str = "name") -> list[str]:
    """One line per NVIDIA GPU that ``nvidia-smi`` lists, its ``fields`` (``--query-gpu``) comma-separated;
    none where it is absent or fails."""
    try:
        listed = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in listed.splitlines() if line.strip()]


def machine() -> str:
    """The CPU model and the GPUs of this machine, in a few words."""
    gpus = gpu_models()
    return cpu_model() + (f" with {', '.join(gpus)}" if gpus else "")


def memory() -> str:
    """Total memory of the machine, in GiB."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# ---------------------------------------------------------------------------------------------
# The report


@dataclasses.dataclass
class Target:
    """A goal, what was measured, and whether the goal is met (None when not measured in this run)."""

    goal: str
    measured: str
    met: bool | None

    @property
    def verdict(self) -> str:
        return {True: "met", False: "**not met**", None: "not measured"}[self.met]


@dataclasses.dataclass
class Section:
    """One part of BENCHMARKS.md: prose, tables (header + rows), targets and notes."""

    title: str
    intro: str
    tables: list[tuple[str, list[str], list[list[str]]]] = dataclasses.field(default_factory=list)
    targets: list[Target] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)


def ratio_target(goal: str, ratio: float | None, limit: float) -> Target:
    """Met when ``ratio`` is at most ``limit``; not measured when ``ratio`` is None."""
    if ratio is None:
        return Target(goal, "-", None)
    return Target(goal, f"{ratio:.3f}x", ratio <= limit)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def write_report(out: Path, text: str) -> None:
    """Write ``text``'s sections into ``out`` atomically, keeping verbatim the sections other tools wrote.

    A section runs from a ``## `` heading to the next; the head before the first heading counts as
    one when ``text`` has a head. ``text`` replaces the sections of ``out`` with its headings (and
    the head, if it has one) as one block, where the first of them was, else at the end; the other
    sections stay where they were. ``tools.bench`` writes the head and its sections this way, and
    ``tools.bench_fuse`` its ``## Fusion`` section.
    """
    head, *sections = re.split(r"(?m)^(?=## )", text)
    old_head, *old_sections = re.split(r"(?m)^(?=## )", out.read_text() if out.exists() else "# Benchmarks\n")
    own = {section.splitlines()[0] for section in sections}
    kept, at = ([], 0) if head.strip() else ([old_head], None)
    for section in old_sections:
        if section.splitlines()[0] not in own:
            kept.append(section)
        elif at is None:
            at = len(kept)
    at = len(kept) if at is None else at
    parts = [*kept[:at], head, *sections, *kept[at:]]
    with atomic_path(out, "report") as temporary:
        Path(temporary).write_text("\n\n".join(part.rstrip("\n") for part in parts if part.strip()) + "\n")


def section_main(
    description: str, logger: logging.Logger, configs: Mapping[str, object], section: Callable[[object, str], str],
    argv=None,
) -> int:
    """The command line of a tool that measures and writes its own section of BENCHMARKS.md:
    ``--quick`` for a smoke run, ``--out`` for the report; ``section(config, mode)`` gives the text."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "BENCHMARKS.md", help="the report to update")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logger.setLevel(logging.INFO)
    mode = "quick" if args.quick else "full"
    text = section(configs[mode], mode)
    write_report(args.out, text)
    print(text)
    return 0
