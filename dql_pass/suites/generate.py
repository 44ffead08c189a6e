"""Write a conformance suite: one test folder per (input, form, opset), put in place in one step.

- The inputs come from :func:`dql_pass.inputs.cases`; the forms are the one-node DynamicQuantizeLinear
  model (``native``) and the models :class:`~dql_pass.expansion.ExpandDynamicQuantizeLinearPass`
  makes of it, one per variant; expected outputs come from :mod:`dql_pass.reference` under the
  chosen zero-range policy; the layout is :mod:`dql_pass.suites.layout`'s.
- The input of about a million elements (5 MB per folder) is written at the newest chosen opset
  only, in every chosen form, to keep the suite small.
- A folder whose model uses an op that the backend the suite is meant for cannot run (onnxruntime
  under the ``onnxruntime`` policy, ``onnx.reference`` under ``onnx-reference``; the knowledge is
  :mod:`dql_pass.runtimes`') is not written but listed under ``left_out`` in the manifest, with the
  reason; what the other backend cannot run is one of its known differences.
- OUTDIR's missing parent folders are made, as ``mkdir -p`` makes them, and removed again if the
  run fails.
- The suite is written in a stage folder beside OUTDIR, then swapped with OUTDIR in one step
  (Linux's ``renameat2`` exchange), so OUTDIR is the whole old suite or the whole new one whatever
  happens. Where the system cannot swap in one step, it takes two renames with SIGINT and SIGTERM
  held back and the first undone if the second fails; only a kill -9 between the two leaves no
  suite at OUTDIR. Stage folders are locked while in use; a successful run removes those that
  earlier runs left. All of it is :mod:`dql_pass.files.safe`'s (``staged``, ``put_folder``, ``tidy_up``).
- An existing OUTDIR is replaced only when it is empty or a suite written here that holds nothing
  else (with ``force``, also when it holds files added since); a folder that holds no suite, never.
"""

from __future__ import annotations

__all__ = ["DEFAULT_OPSETS", "GeneratedSuite", "generate_suite"]

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnx import numpy_helper

from dql_pass import inputs, reference, runtimes
from dql_pass.errors import InputError
from dql_pass.expansion import ExpandDynamicQuantizeLinearPass
from dql_pass.files import (
    FolderLock, check_not_system, default_file_mode, put_folder, signals_deferred, stale_data, staged, tidy_up,
)
from dql_pass.op import INPUT, MAX_OPSET, MIN_OPSET, NAME, OUTPUTS, check_choice, one_node_model, version
from dql_pass.suites import family
from dql_pass.suites.defaults import DEFAULT_OPSETS
from dql_pass.suites.layout import (
    DATA, DATA_SET, FORMAT, FORMS, INPUT_FILE, MANIFEST, MODEL, OUTPUT_FILES, LeftOut, SuiteEntry,
    folder_name, written_paths,
)

logger = logging.getLogger(__name__)

# The backend each zero-range policy's expected outputs are meant for: the folders it cannot run are left out.
_POLICY_RUNTIME = {"onnxruntime": "onnxruntime", "onnx-reference": "reference"}


@dataclasses.dataclass(frozen=True)
class GeneratedSuite:
    """What :func:`generate_suite` wrote: the folder, its entries, the inputs used, bytes and seconds.

    ``left_out`` lists the folders not written because the suite's backend cannot run them.
    """

    path: Path
    entries: list[SuiteEntry]
    inputs: int
    size_bytes: int
    seconds: float
    left_out: list[LeftOut] = dataclasses.field(default_factory=list)

    def format(self) -> str:
        size = f"{self.size_bytes / 1e6:.1f} MB" if self.size_bytes >= 1e6 else f"{self.size_bytes / 1e3:.0f} kB"
        return (f"wrote {len(self.entries)} test folders from {self.inputs} inputs to {self.path}: {size} "
                f"in {self.seconds:.1f} s")

    def to_dict(self) -> dict:
        return {"path": str(self.path), "folders": len(self.entries), "inputs": self.inputs,
                "size_bytes": self.size_bytes, "seconds": self.seconds}


def _check_options(opsets: Collection[int], variants: Collection[str], zero_range: str) -> None:
    if not opsets:
        raise InputError("choose at least one opset")
    outside = sorted(o for o in opsets if not MIN_OPSET <= o <= MAX_OPSET)
    if outside:
        raise InputError(f"opset {outside[0]} is outside {MIN_OPSET}..{MAX_OPSET}, the opsets that have {NAME}")
    if not variants:
        raise InputError("choose at least one variant")
    unknown = sorted(set(variants) - set(FORMS))
    if unknown:
        raise InputError(f"unknown variant {unknown[0]!r}; choose from {', '.join(FORMS)}")
    check_choice("zero-range policy", zero_range)


# --- writing the folders -----------------------------------------------------------------------


def _write_case(folder: Path, model: onnx.ModelProto, x: np.ndarray, expected: Sequence[np.ndarray]) -> None:
    onnx.checker.check_model(model, full_check=True)
    (folder / DATA_SET).mkdir(parents=True)
    (folder / MODEL).write_bytes(model.SerializeToString())
    (folder / DATA).write_text(json.dumps({"atol": 0, "rtol": 0}) + "\n")
    (folder / INPUT_FILE).write_bytes(numpy_helper.from_array(x, INPUT).SerializeToString())
    for file, name, value in zip(OUTPUT_FILES, OUTPUTS, expected, strict=True):
        (folder / file).write_bytes(numpy_helper.from_array(np.asarray(value), name).SerializeToString())


def _ops(nodes: Iterable[onnx.NodeProto]) -> set[tuple[str, str]]:
    """The ``(domain, op_type)`` of ``nodes`` and of every node in their subgraphs."""
    found: set[tuple[str, str]] = set()
    for node in nodes:
        found.add(("" if node.domain == "ai.onnx" else node.domain, node.op_type))
        for attr in node.attribute:
            for graph in [*([attr.g] if attr.HasField("g") else []), *attr.graphs]:
                found |= _ops(graph.node)
    return found


def _lacks(model: onnx.ModelProto, runtime: str, opset: int) -> str | None:
    """Why ``runtime`` cannot run ``model``, or None when :mod:`dql_pass.runtimes` knows of no reason."""
    ops = _ops([*model.graph.node, *(node for function in model.functions for node in function.node)])
    lacks = runtimes.lacking(runtime, ops, opset)
    return "; ".join(lack.describe() for lack in lacks) or None


def _write_cases(
    stage: Path, cases: Sequence[inputs.Case], opsets: Sequence[int], forms: Sequence[str], zero_range: str,
) -> tuple[list[SuiteEntry], list[LeftOut]]:
    """Write one test folder per (input, form, opset) in ``stage``: the entries written, and those left out."""
    runtime = _POLICY_RUNTIME[zero_range]
    entries: list[SuiteEntry] = []
    left_out: list[LeftOut] = []
    for case in cases:
        expected = reference.dynamic_quantize_linear(case.x, zero_range)
        # The large input costs 5 MB per folder: one opset is enough to exercise vectorized kernels.
        case_opsets = opsets[-1:] if case.category == "large" else opsets
        for opset in case_opsets:
            native_name = folder_name(case.name, "native", opset)
            native = one_node_model(case.x.shape, opset, name=native_name, description=case.description)
            for form in forms:
                folder = folder_name(case.name, form, opset)
                if form == "native":
                    model, description = native, case.description
                else:
                    # runtime=None: the check below decides on the model's own ops, for every backend.
                    expanded = ExpandDynamicQuantizeLinearPass(variant=form, zero_range=zero_range, runtime=None)(
                        ir.serde.deserialize_model(native)
                    )
                    model = ir.serde.serialize_model(expanded.model)
                    model.graph.name = folder
                    description = f"{case.description}; through dql_pass's {form} expansion"
                # A folder the suite's own backend cannot load would only fail: list it instead.
                reason = _lacks(model, runtime, opset)
                if reason is not None:
                    left_out.append(LeftOut(folder, case.name, opset, form, reason))
                    continue
                known = {r.name: "; ".join(d) for r in runtimes.RUNTIMES.values()
                         if (d := r.differences(case.x, form, zero_range))}
                for other in runtimes.RUNTIMES:
                    other_reason = None if other == runtime else _lacks(model, other, opset)
                    if other_reason is not None:
                        known[other] = other_reason
                _write_case(stage / folder, model, case.x, expected)
                entries.append(SuiteEntry(
                    name=case.name, folder=folder, category=case.category, opset=opset, variant=form,
                    policy=zero_range, description=description, shape=tuple(case.x.shape),
                    policy_dependent=case.policy_dependent, comparable=case.comparable, known_differences=known,
                ))
        logger.info("wrote %s at opsets %s", case.name, case_opsets)
    if not entries:
        raise InputError(f"{runtime} can run none of the chosen folders: {left_out[0].reason}; "
                         "choose other opsets or variants")
    if left_out:
        logger.warning(
            "left out %d test folders that %s cannot run (%s); %s lists them", len(left_out), runtime,
            "; ".join(sorted({item.reason for item in left_out})), MANIFEST,
        )
    return entries, left_out


# --- replacing OUTDIR ----------------------------------------------------------------------------


def _foreign(outdir: Path, written: set[str]) -> list[str]:
    """What ``outdir`` holds that gen-tests did not write: other names, and symlinks or special files in place
    of its own."""
    found = []

    def unlisted(error: OSError) -> None:  # a folder that cannot be listed may hold anything
        found.append(Path(error.filename).relative_to(outdir).as_posix())

    for folder, subfolders, files in os.walk(outdir, onerror=unlisted):  # symlinked folders are listed, not entered
        for name in sorted(subfolders) + sorted(files):
            path = Path(folder, name)
            relative = path.relative_to(outdir).as_posix()
            kind = os.lstat(path).st_mode
            if relative not in written or not (stat.S_ISDIR(kind) if name in subfolders else stat.S_ISREG(kind)):
                found.append(relative)
        subfolders[:] = [name for name in subfolders if Path(folder, name).relative_to(outdir).as_posix() in written]
    return sorted(found)


def _check_replaceable(outdir: Path, force: bool) -> None:
    """Raise unless ``outdir`` is absent, an empty folder or a suite written here that holds nothing else
    (or ``force``)."""
    if outdir.is_symlink() or outdir.exists() and not outdir.is_dir():
        raise InputError(f"{outdir}: exists and is not a folder; choose another output folder")
    if not outdir.exists() or not any(outdir.iterdir()):
        return
    written = written_paths(outdir)
    if written is None:
        raise InputError(f"{outdir}: a non-empty folder that holds no dql_pass suite; choose another output folder")
    foreign = [] if force else _foreign(outdir, written)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise InputError(
            f"{outdir}: the suite there holds {len(foreign)} file(s) that gen-tests did not write ({shown}); "
            "move them away, or force the replacement"
        )


def _install(stage: Path, outdir: Path, force: bool) -> None:
    """Move the staged suite to ``outdir``, replacing an empty folder or an older suite, then tidy up.

    Under the lock of ``outdir``'s folder: no other gen-tests replaces ``outdir`` meanwhile, and no
    sweep takes the old suite before it is gone.
    """
    folder = outdir.parent.resolve()
    with FolderLock(folder):
        _check_replaceable(outdir, force)  # again: the folder may have changed while the suite was written
        stale = stale_data(folder, outdir.name, set())
        with signals_deferred():  # once in place, the new suite stands: the old one's removal goes with it
            put_folder(stage, outdir)
            shutil.rmtree(stage, ignore_errors=True)  # the old suite, if there was one
            tidy_up(folder, outdir.name, set(), stale)


def generate_suite(
    outdir: str | os.PathLike,
    *,
    opsets: Sequence[int] = DEFAULT_OPSETS,
    variants: Sequence[str] | None = None,
    zero_range: str = "onnxruntime",
    include_unspecified: bool = False,
    include_large: bool = True,
    names: Collection[str] | None = None,
    force: bool = False,
    ops: Collection[str] = (NAME,),
    size: str = "small",
    family_opsets: Collection[int] | None = None,
    forms: Sequence[str] | None = None,
) -> GeneratedSuite:
    """Write a conformance suite to ``outdir`` (see :mod:`dql_pass.suites` for the layout).

    ``variants`` picks among ``native`` and the expansion variants (default: all; ``forms`` is its old name,
    taken alone: both is a TypeError);
    ``include_unspecified`` adds the NaN inputs (not comparable); ``include_large`` adds the input of about a
    million elements at the newest opset; ``names`` keeps only the catalogue cases of those names. The folder
    that holds ``outdir`` is made if missing. An existing suite in ``outdir`` that holds files gen-tests did not
    write is replaced only with ``force``; a folder that holds no suite, never.

    ``ops`` picks among DynamicQuantizeLinear and the family's ops (:data:`dql_pass.suites.family.REGISTRY`),
    written at each opset where they changed (those in ``family_opsets`` when given), at ``size``
    (``small`` for CI, ``full``); ``opsets``, ``variants`` and the rest are DynamicQuantizeLinear's.
    """
    start = time.perf_counter()
    ops = family.check_ops(ops)
    opsets = sorted(set(opsets))
    if forms is not None:
        if variants is not None:
            raise TypeError("generate_suite() takes variants or its old name forms, not both")
        variants = forms
    if variants is not None and NAME not in ops:
        raise InputError(f"variants are {NAME}'s forms, and the ops chosen ({', '.join(ops)}) leave it out; "
                         f"add {NAME} to the ops, or give no variants")
    variants = FORMS if variants is None else variants
    if NAME in ops:
        _check_options(opsets, variants, zero_range)
    variants = [v for v in FORMS if v in variants]
    cases = inputs.cases(include_large=include_large, include_nan=include_unspecified) if NAME in ops else []
    if names is not None:
        names = set(names)
        unknown = sorted(names - {c.name for c in cases})
        if unknown:
            raise InputError(f"no catalogue case is named {unknown[0]!r}")
        cases = [c for c in cases if c.name in names]

    outdir = Path(os.path.abspath(outdir))  # "suite/" and "." get a name; symlinks are not followed
    if not outdir.name:
        raise InputError(f"{outdir}: cannot write a suite there; choose a folder")
    check_not_system(outdir, "suite folder")
    if os.path.lexists(outdir.parent) and not outdir.parent.is_dir():  # a file, or a link to none (a loop)
        raise InputError(f"{outdir}: {outdir.parent} is not a folder")
    _check_replaceable(outdir, force)
    created = _missing_folders(outdir.parent)
    try:
        for folder in created:
            folder.mkdir()
        with staged(outdir.parent.resolve(), outdir.name, mode=default_file_mode(folder=True)) as stage:
            entries, left_out = _write_cases(stage, cases, opsets, variants, zero_range) if NAME in ops else ([], [])
            entries += family.write_cases(stage, [op for op in ops if op != NAME], family_opsets, size)
            manifest = {
                "format": FORMAT,
                "generator": f"dql_pass {version()}",
                "onnx": onnx.__version__,
                "policy": zero_range,
                "opsets": opsets,
                "variants": variants,
                "ops": ops,
                "cases": [dataclasses.asdict(e) for e in entries],
                "left_out": [dataclasses.asdict(item) for item in left_out],
            }
            (stage / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
            size = sum(f.stat().st_size for f in stage.rglob("*") if f.is_file())
            _install(stage, outdir, force)
    except BaseException as error:
        for folder in reversed(created):  # the folders this run made, so that a failure leaves none
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(error, OSError):
            raise InputError(f"{outdir}: cannot write the suite: {error.strerror or error}") from None
        raise
    return GeneratedSuite(outdir, entries, len(cases), size, time.perf_counter() - start, left_out)


def _missing_folders(folder: Path) -> list[Path]:
    """The folders of ``folder``'s path that do not exist yet, outermost first (``mkdir -p``'s)."""
    missing = []
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]
