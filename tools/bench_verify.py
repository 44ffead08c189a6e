"""Time ``dql-pass verify`` on a 24-site transformer-like model (issue 3: at most 30 s on 2 cores).

Run from the repository root::

    python tools/bench_verify.py [--layers 6] [--hidden 384] [--runs 3]

What it does:

1. Builds a float BERT-like encoder with ``minilm_model`` of tools/bench.py: int64 ``input_ids``
   and ``attention_mask`` of symbolic shape ``[batch, sequence]``, a word embedding, then per layer
   attention, LayerNormalization and an Erf GELU feed-forward, four weight MatMuls per layer.
2. Quantizes it with tools/bench.py's ``quantize`` (``quantize_dynamic``, weight MatMuls, uint8) in
   a temp dir: query, key and value share one DynamicQuantizeLinear, so each layer has four sites
   and 6 layers give 24. Then expands it with ``dql-pass expand`` (variant and mode selectable).
3. Times the whole ``python -m dql_pass verify ORIGINAL REWRITTEN`` process (interpreter start,
   imports, checker, site and model level) ``--runs`` times and prints the median; each run must
   exit 0. Nothing is left on disk.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

from bench import MINILM, minilm_model, quantize  # tools/bench.py, next to this script

VOCAB, HEAD_SIZE, FFN_FACTOR = 1000, 64, 4
TARGET_SECONDS = 30.0


def _dql_pass(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "dql_pass", *args], capture_output=True, text=True)
    return time.perf_counter() - start, done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", default="quantizelinear")
    parser.add_argument("--mode", default="inline")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_verify.") as tmp:
        folder = Path(tmp)
        shape = dataclasses.replace(MINILM, layers=args.layers, hidden=args.hidden, heads=args.hidden // HEAD_SIZE,
                                    intermediate=FFN_FACTOR * args.hidden, seq=None)
        original = quantize(minilm_model(shape, vocab=VOCAB), folder, "encoder_dynamic.onnx")
        sites = sum(n.op_type == "DynamicQuantizeLinear" for n in onnx.load(original).graph.node)
        rewritten = folder / "encoder_expanded.onnx"
        _, done = _dql_pass("expand", str(original), "-o", str(rewritten), "--variant", args.variant, "--mode", args.mode)
        if done.returncode:
            raise SystemExit(f"expand failed: {done.stderr.strip()}")
        size = original.stat().st_size / 2**20
        print(f"model: {args.layers} layers, hidden {args.hidden}, {sites} DQL sites, {size:.1f} MiB; "
              f"rewrite: {args.variant}/{args.mode}")
        times = []
        for run in range(args.runs):
            seconds, done = _dql_pass("verify", str(original), str(rewritten))
            if done.returncode:
                raise SystemExit(f"verify exited {done.returncode}:\n{done.stdout}{done.stderr}")
            times.append(seconds)
            print(f"  run {run + 1}: {seconds:.2f} s  ({done.stdout.strip().splitlines()[-1]})")
        median = statistics.median(times)
        verdict = "met" if median <= TARGET_SECONDS else "NOT met"
        print(f"dql-pass verify, whole process: median {median:.2f} s over {args.runs} runs "
              f"(target <= {TARGET_SECONDS:.0f} s: {verdict})")
    return 0 if median <= TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
