"""Time the whole ``dql-pass verify`` process: on a quantized transformer, and on chains of sites.

Run from the repository root::

    python -m tools.bench_verify [--layers 6] [--hidden 384] [--runs 3]
    python -m tools.bench_verify --chain 1250,2500,5000 [--runs 3] [--tree PATH]

What it does:

- Transformer (issue 17: verify with no --dim within 4x the time of ``dql-pass expand`` on the same
  model, ``--runtime`` too): builds a float BERT-like encoder with ``tools.models.minilm_model``
  (int64 ``input_ids`` and ``attention_mask`` whose dimensions are named ``--names``, by default
  ``b,s``: names that do not say batch), quantizes it with ``tools.models.quantize`` in a temp dir
  (four sites per layer, 24 for 6 layers), and times ``dql-pass expand`` (variant and mode
  selectable, or ``--target`` the runtime) and ``dql-pass verify ORIGINAL REWRITTEN [--runtime]``
  interleaved, ``--runs`` times each; each run must exit 0.
- Chains (``--chain``): ``tools.models.chain_model`` with each number of sites (a DQL whose y is
  dequantized and fed to the next), expanded, then the verify processes of all sizes run side by
  side, interleaved round robin ``--runs`` times; the median wall time and peak RSS of each size,
  and the ratio of the largest size's time to the smallest's, against the target that verify's
  cost is linear in the sites (at most 4x for 4x the sites, the fixed start-up included).
  ``--tree`` runs the verify processes from another checkout of the repository (say, the last
  commit in a worktree), so the same figures can be taken before and after a change.

Nothing is left on disk.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
from pathlib import Path

import onnx

import dql_pass
from tools import harness, models

VOCAB, HEAD_SIZE, FFN_FACTOR = 1000, 64, 4
TARGET_RATIO = 4.0  # verify over expand, whole processes, on the same model
CHAIN_RATIO = 4.0  # the largest chain's time over the smallest's, for 4x the sites


def _verify_process(original: Path, rewritten: Path, tree: Path, *options: str) -> tuple[float, float, str]:
    """Wall seconds and peak RSS (MiB) of one ``python -m dql_pass verify`` run from ``tree``, and its last line."""
    return _process(tree, "verify", os.fspath(original), os.fspath(rewritten), *options)


def _process(tree: Path, *args: str) -> tuple[float, float, str]:
    """Wall seconds and peak RSS (MiB) of one ``python -m dql_pass ARGS`` run from ``tree``, and its last line."""
    return harness.cli_process(tree, *args, "-q")[:3]


def bench_chains(sizes: list[int], runs: int, tree: Path) -> int:
    with tempfile.TemporaryDirectory(prefix="bench_verify.") as tmp:
        pairs = {}
        for sites in sizes:
            model = models.chain_model(sites)
            original, rewritten = Path(tmp, f"chain{sites}.onnx"), Path(tmp, f"chain{sites}_expanded.onnx")
            onnx.save(model, original)
            onnx.save(dql_pass.expand(model)[0], rewritten)
            pairs[sites] = original, rewritten
        times: dict[int, list[float]] = {sites: [] for sites in sizes}
        peaks: dict[int, list[float]] = {sites: [] for sites in sizes}
        for run in range(runs):
            shift = run % len(sizes)  # no size always runs first
            for sites in sizes[shift:] + sizes[:shift]:
                seconds, peak, last = _verify_process(*pairs[sites], tree)
                times[sites].append(seconds)
                peaks[sites].append(peak)
                print(f"  run {run + 1}, {sites} sites: {seconds:.2f} s, peak RSS {peak:.0f} MiB  ({last[:60]})")
    print(f"dql-pass verify on chains, from {tree}, medians over {runs} runs:")
    for sites in sizes:
        print(f"  {sites:6d} sites: {statistics.median(times[sites]):7.2f} s  "
              f"peak RSS {statistics.median(peaks[sites]):6.0f} MiB")
    ratio = statistics.median(times[sizes[-1]]) / statistics.median(times[sizes[0]])
    target = CHAIN_RATIO * sizes[-1] / sizes[0] / 4
    verdict = "met" if ratio <= target else "NOT met"
    print(f"  {sizes[-1]} over {sizes[0]} sites: x{ratio:.2f} (target <= x{target:.1f}: {verdict})")
    return 0 if ratio <= target else 1


def bench_transformer(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench_verify.") as tmp:
        folder = Path(tmp)
        shape = dataclasses.replace(models.MINILM, layers=args.layers, hidden=args.hidden,
                                    heads=args.hidden // HEAD_SIZE, intermediate=FFN_FACTOR * args.hidden, seq=None)
        model = models.minilm_model(shape, vocab=VOCAB)
        names = dict(zip(("batch", "sequence"), args.names.split(",")))
        for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
            for dim in value.type.tensor_type.shape.dim:
                if dim.HasField("dim_param") and dim.dim_param in names:
                    dim.dim_param = names[dim.dim_param]
        original = models.quantize(model, folder, "encoder_dynamic.onnx")
        sites = models.dql_count(onnx.load(original))
        rewritten = folder / "encoder_expanded.onnx"
        rewrite = ["--target", args.runtime] if args.runtime else ["--variant", args.variant]
        expand = ["expand", os.fspath(original), "-o", os.fspath(rewritten), *rewrite, "--mode", args.mode]
        verify = ["--runtime", args.runtime] if args.runtime else []
        size = original.stat().st_size / 2**20
        print(f"model: {args.layers} layers, hidden {args.hidden}, {sites} DQL sites, {size:.1f} MiB, dimensions "
              f"{args.names}; rewrite: {' '.join(rewrite[1:])}/{args.mode}; verify on {args.runtime or 'onnxruntime'}")
        expands, verifies = [], []
        for run in range(args.runs):  # interleaved, so that both see the same load
            seconds, _, _ = _process(args.tree, *expand)
            expands.append(seconds)
            seconds, _, last = _verify_process(original, rewritten, args.tree, *verify)
            verifies.append(seconds)
            print(f"  run {run + 1}: expand {expands[-1]:.2f} s, verify {seconds:.2f} s  ({last[:100]})")
        ratio = statistics.median(verifies) / statistics.median(expands)
        verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
        print(f"whole processes, medians over {args.runs} runs: expand {statistics.median(expands):.2f} s, verify "
              f"{statistics.median(verifies):.2f} s: x{ratio:.2f} (target <= x{TARGET_RATIO:.0f}: {verdict})")
    return 0 if ratio <= TARGET_RATIO else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", default="quantizelinear")
    parser.add_argument("--mode", default="inline")
    parser.add_argument("--names", default="b,s", help="what the batch and sequence dimensions are called")
    parser.add_argument("--runtime", help="expand for this target and verify on it")
    parser.add_argument("--chain", help="comma-separated site counts, smallest first: time chains instead")
    parser.add_argument("--tree", type=Path, default=Path.cwd(), help="the checkout whose dql_pass runs verify")
    args = parser.parse_args()
    if args.chain:
        return bench_chains(sorted(int(size) for size in args.chain.split(",")), args.runs, args.tree.resolve())
    return bench_transformer(args)


if __name__ == "__main__":
    sys.exit(main())
