"""How long the sweep takes to read a copy of a model in each form onnx loads.

A folder holds an output's data file and a copy of a model with large weights (``--megabytes`` of
raw bytes) in one form (binary, JSON, textproto, onnxtxt); the sweep reads the copy to learn whether
it refers to the data file, which it does. Each reading is a fresh process; with ``--before``, the
dql_pass of that folder is measured too, the two alternating round by round. The results replace
the ``## The sweep: copies in every form`` section of ``--out``.

    python -m tools.bench_sweep [--megabytes 17] [--rounds 5] [--before FOLDER --label TEXT]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tools import harness

SECTION = "## The sweep: copies in every form"
_FORMATS = {"binary": ".onnx", "json": ".json", "textproto": ".textproto", "onnxtxt": ".onnxtxt"}
_DATA = "out.onnx.0123456789ab.data"


def _model(megabytes: float) -> onnx.ModelProto:
    """A model with one large in-file tensor and one tensor in the external file ``_DATA``."""
    raw = np.random.default_rng(0).integers(0, 256, int(megabytes * 1e6), np.uint8)
    weights = onnx.numpy_helper.from_array(raw, "weights")
    external = onnx.TensorProto(name="external", data_type=onnx.TensorProto.UINT8, dims=[16])
    external.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", _DATA), ("offset", "0"), ("length", "16")):
        external.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("Add", ["weights", "x"], ["y"]), helper.make_node("Identity", ["external"], ["z"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [raw.size])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [raw.size]),
         helper.make_tensor_value_info("z", onnx.TensorProto.UINT8, [16])],
        initializer=[weights, external])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def measure(folder: Path, name: str) -> None:
    """Print the seconds the sweep's reading of ``folder / name`` takes, and whether it kept the data file."""
    try:
        from dql_pass.files.references import referred_to
    except ImportError:  # a dql_pass older than the module (--before)
        from dql_pass.files.safe import _referred_to as referred_to

    entries = [entry for entry in os.scandir(folder) if entry.name in (name, _DATA)]
    start = time.perf_counter()
    kept = referred_to(folder, entries, {folder / _DATA}, skip=set())
    print(time.perf_counter() - start, kept == {folder / _DATA})


def _reading(pythonpath: Path, folder: Path, name: str) -> tuple[float, bool]:
    script = ("import sys, pathlib; from tools.bench_sweep import measure; "
              "measure(pathlib.Path(sys.argv[1]), sys.argv[2])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.fspath(pythonpath), os.fspath(harness.REPO)])}
    out = subprocess.run([sys.executable, "-c", script, os.fspath(folder), name], env=env, check=True,
                         capture_output=True, text=True, cwd=pythonpath).stdout.split()  # cwd: first on sys.path
    return float(out[0]), out[1] == "True"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=17, help="raw bytes of the model's in-file tensor")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", type=Path, help="a folder holding an older dql_pass to compare with")
    parser.add_argument("--label", default="an older dql_pass", help="what --before holds, for the report")
    parser.add_argument("--out", type=Path, default=harness.REPO / "docs" / "BENCHMARKS.md",
                        help="the report to update")
    args = parser.parse_args(argv)
    checkouts = {"after": harness.REPO, **({"before": args.before.resolve()} if args.before else {})}
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_sweep.") as scratch:
        folder = Path(scratch)
        (folder / _DATA).write_bytes(bytes(16))
        model = _model(args.megabytes)
        for form, suffix in _FORMATS.items():
            copy = folder / f"copy{suffix}"
            onnx.save_model(model, copy, format=None if form == "binary" else form)
            times: dict[str, list[float]] = {who: [] for who in checkouts}
            kept: dict[str, bool] = dict.fromkeys(checkouts, True)
            for _ in range(args.rounds):
                for who, pythonpath in checkouts.items():
                    seconds, ok = _reading(pythonpath, folder, copy.name)
                    times[who].append(seconds)
                    kept[who] &= ok
            after = statistics.median(times["after"])
            for who in checkouts:
                median = statistics.median(times[who])
                rows.append([form, f"{copy.stat().st_size / 1e6:.1f} MB", who, harness.format_time(median),
                             f"{median / after:.1f}×", "yes" if kept[who] else "NO", str(args.rounds)])
            copy.unlink()
    text = "\n".join([
        SECTION, "",
        f"Written by `python -m tools.bench_sweep{' --before FOLDER --label LABEL' if args.before else ''}` "
        f"({harness.cpu_model()}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs when it ended); "
        "regenerate it with the same command. The sweep's reading of one copy of a model (the data file it must keep "
        f"is named in it) whose one in-file tensor takes {args.megabytes:g} MB of random bytes, saved by onnx in each "
        "form; one fresh process per reading, the median of the rounds. "
        + (f"*before* is the dql_pass of `--before` ({args.label}), *after* this checkout's; the rounds alternate. "
           if args.before else "")
        + "*kept*: the sweep found the reference to the data file.", "",
        *harness.table(["form", "copy", "dql_pass", "median", "against after", "kept", "rounds"], rows), "",
    ])
    harness.write_report(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
