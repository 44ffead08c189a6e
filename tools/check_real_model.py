"""Check dql_pass end to end on one quantized model that nobody prepared for it.

Run from the repository root::

    python -m tools.check_real_model MODEL.onnx [--dim NAME=SIZE ...] [--input NAME=FILE.npy ...] [--keep DIR]

For each variant and mode of :func:`dql_pass.expand` it:

1. expands MODEL, times it, counts the nodes per site (all nodes after, function bodies once,
   minus the nodes before, plus the sites, over the sites), loads the written file with
   :func:`dql_pass.load_model` (onnx's full checker) and runs :func:`dql_pass.verify` on it (its
   summary line is printed);
2. runs MODEL and the expansion on ORT (CPU, one thread), independently of verify, on seeded random
   inputs and on all-zero float inputs: the final outputs at ORT's default optimisation level, and
   at the basic level the final outputs plus every main-graph DQL output made a graph output; each
   compared bit for bit;
3. fuses the expansion back with :func:`dql_pass.fuse` and checks that the DQL count, the
   DQL output names per graph and every output above equal MODEL's. Once per model it does the same
   for ONNX's own expansion (``onnx.inliner`` with the schema's function body).

Exit code 0 when every cell of the table is ok or PASS, 1 otherwise, 2 when MODEL or an option is
unusable (one line, no traceback).

Rules: MODEL is checked and loaded once, and read once more with its weights for ORT; each
expansion reads it from the file again, as ``dql-pass expand`` does. The input is never written;
expanded models go to a temp dir (or ``--keep DIR``). Inputs are synthesized here, not by verify,
so the two checks do not share a mistake: a symbolic or negative dimension takes its ``--dim``
size, else 1 for names with "batch", else 8; masks are ones, token types zeros, other integers
uniform in [0, 16).
"""

from __future__ import annotations

__all__ = ["main"]

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

import dql_pass
from dql_pass import runtimes
from tools.models import inline_onnx_function

_DQL_TYPES = (onnx.TensorProto.UINT8, onnx.TensorProto.FLOAT, onnx.TensorProto.UINT8)


def _node_count(model: onnx.ModelProto) -> int:
    """Nodes of every graph, subgraph and function."""
    def count(nodes) -> int:
        return sum(1 + sum(count(g.node) for a in n.attribute for g in (*a.graphs, *([a.g] if a.HasField("g") else ())))
                   for n in nodes)
    return count(model.graph.node) + sum(count(f.node) for f in model.functions)


def _dql_outputs(model: ir.Model) -> dict[str, list[tuple[str, ...]]]:
    """The output names of every DQL, per graph path."""
    return {label: sorted(tuple(v.name for v in n.outputs) for n in nodes)
            for label, nodes in dql_pass.find_sites(model).items()}


def _inputs(model: onnx.ModelProto, dims: Mapping[str, int], given: Mapping[str, np.ndarray], seed: int,
            zeros: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if value.name in given:
            feeds[value.name] = given[value.name]
            continue
        tensor = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
                      else dims.get(d.dim_param, 1 if "batch" in d.dim_param.lower() else 8) for d in tensor.shape.dim)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        name = value.name.lower()
        if "mask" in name or dtype == np.bool_:
            data = np.ones(shape)
        elif np.issubdtype(dtype, np.floating):
            data = np.zeros(shape) if zeros else rng.standard_normal(shape)
        elif "type" in name or "segment" in name:
            data = np.zeros(shape)
        else:
            data = rng.integers(0, 16, shape)
        feeds[value.name] = data.astype(dtype)
    return feeds


def _run(proto: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], expose: list[tuple[str, ...]],
         basic: bool) -> list[dict]:
    """Run the model on ORT CPU with one thread; ``expose`` makes those main-graph DQL outputs graph outputs."""
    model = onnx.ModelProto()
    model.CopyFrom(proto)  # the caller's model keeps its outputs
    model.graph.output.extend(onnx.helper.make_tensor_value_info(name, dtype, None)
                              for names in expose for name, dtype in zip(names, _DQL_TYPES))
    # basic keeps every kernel as written: no DQL+MatMulInteger fusion in the original.
    session = runtimes.get("onnxruntime").load(model, threads=1, optimize="basic" if basic else "all")
    return [dict(zip(session.output_names, session.run(f))) for f in feeds]


def _differences(expected: list[dict], actual: list[dict]) -> list[str]:
    """Names of the outputs whose bits differ in any input set ('name@set')."""
    return [f"{name}@{i}" for i, (e, a) in enumerate(zip(expected, actual)) for name in e
            if name not in a or e[name].dtype != a[name].dtype or e[name].shape != a[name].shape
            or e[name].tobytes() != a[name].tobytes()]


def _attempt(check: Callable[[], str]) -> str:
    """The check's verdict, or ERROR and the first line of what it raised: one broken file must not stop the table."""
    try:
        return check()
    except Exception as error:  # noqa: BLE001 - the table reports it
        return f"ERROR {type(error).__name__}: {(str(error).splitlines() or [''])[0]}"[:60]


class _Checker:
    """Runs MODEL once per setting and compares rewritten models with it."""

    def __init__(self, model: ir.Model, path: Path, dims: Mapping[str, int], given: Mapping[str, np.ndarray],
                 samples: int):
        self.dql = _dql_outputs(model)
        self.main = self.dql.get("main", [])
        self.proto = onnx.load(path)  # with its weights, for ORT
        self.feeds = [_inputs(self.proto, dims, given, seed, zeros=False) for seed in range(samples)]
        self.feeds.append(_inputs(self.proto, dims, given, 0, zeros=True))
        try:
            self.default = _run(self.proto, self.feeds, [], basic=False)
            self.exposed = _run(self.proto, self.feeds, self.main, basic=True)
        except Exception as error:  # noqa: BLE001 - ORT's errors share no base class but Exception
            raise dql_pass.InputError(
                f"ORT cannot run {path} on these inputs (set --dim or --input): {error}") from None

    def compare(self, proto: onnx.ModelProto) -> str:
        """'ok' or the differing outputs, at the default level then at the basic level with DQL outputs."""
        found = [_differences(self.default, _run(proto, self.feeds, [], basic=False)),
                 _differences(self.exposed, _run(proto, self.feeds, self.main, basic=True))]
        return "ok" if not any(found) else "; ".join(f"{level}: {', '.join(d[:4])}{' ...' if len(d) > 4 else ''}"
                                                     for level, d in zip(("default", "basic"), found) if d)

    def fused(self, model: ir.Model, out: Path) -> str:
        fused, report = dql_pass.fuse(model)
        dql_pass.save_model(fused, out)
        names = _dql_outputs(dql_pass.load_model(out))  # the written file, checked
        if names != self.dql:
            return f"DQL differ: {sum(map(len, names.values()))} sites {sorted(names)} (fused {report.total})"
        return self.compare(onnx.load(out))


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not (name and sep and value):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, not {text!r}")
    return name, value


def _rows(model: Path, original: ir.Model, checker: _Checker, folder: Path, **verify_options) -> list[tuple[str, ...]]:
    """One table row per variant and mode, and one for ONNX's own expansion."""
    sites = sum(map(len, checker.dql.values()))
    before = _node_count(checker.proto)
    print(f"{model}: {sites} DQL sites ({', '.join(f'{k}: {len(v)}' for k, v in checker.dql.items())}), "
          f"{before} nodes, {len(checker.feeds)} input sets")
    rows = []
    for variant in dql_pass.VARIANTS:
        for mode in dql_pass.MODES:
            out = folder / f"{model.stem}.{variant}.{mode}.onnx"
            start = time.perf_counter()
            expanded = dql_pass.expand(model, variant=variant, mode=mode)[0]
            seconds = time.perf_counter() - start
            dql_pass.save_model(expanded, out, source=model)
            written = onnx.load(out)
            added = _node_count(written) - before + sites
            try:  # the written file, checked once for both columns
                written_ir, checked = dql_pass.load_model(out), "ok"
            except dql_pass.InputError as error:
                written_ir, checked = out, f"ERROR {error}"[:60]
            rows.append((
                variant, mode, f"{seconds:.2f}", f"{added / max(sites, 1):.1f}", checked,
                _attempt(lambda: dql_pass.verify(original, written_ir, **verify_options).summary.split(";")[0]),
                _attempt(lambda: checker.compare(written)),
                _attempt(lambda: checker.fused(expanded, folder / f"{out.stem}.fused.onnx")),
            ))
    body = ir.serde.deserialize_model(inline_onnx_function(checker.proto))
    rows.append(("onnx body", "inliner", "-", "-", "-", "-", "-",
                 _attempt(lambda: checker.fused(body, folder / f"{model.stem}.inliner.fused.onnx"))))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a model with DynamicQuantizeLinear (quantize_dynamic output)")
    parser.add_argument("--dim", action="append", default=[], type=_pair, metavar="NAME=SIZE",
                        help="size of a symbolic dimension (repeatable)")
    parser.add_argument("--input", action="append", default=[], type=_pair, metavar="NAME=FILE.npy",
                        help="an input array to use in every input set (repeatable)")
    parser.add_argument("--samples", type=int, default=2, help="random input sets besides the all-zero one")
    parser.add_argument("--keep", type=Path, help="write the rewritten models here instead of a temp dir")
    args = parser.parse_args(argv)
    if any(not size.isdigit() for _, size in args.dim):
        parser.error("--dim sizes must be whole numbers")
    dims = {name: int(size) for name, size in args.dim}
    try:
        given = {name: np.load(file, allow_pickle=False) for name, file in args.input}
        original = dql_pass.load_model(args.model)
        checker = _Checker(original, args.model, dims, given, args.samples)
        with tempfile.TemporaryDirectory() as scratch:
            folder = args.keep or Path(scratch)
            folder.mkdir(parents=True, exist_ok=True)
            rows = _rows(args.model, original, checker, folder, dims=dims, inputs=given, samples=args.samples)
    except (dql_pass.InputError, OSError, ValueError) as error:
        print(f"check_real_model: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    rows.insert(0, ("variant", "mode", "expand s", "nodes/site", "checker", "verify", "own compare", "fuse"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    passed = all(cell in ("ok", "-") or cell.startswith("PASS") for row in rows[1:] for cell in row[4:])
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
