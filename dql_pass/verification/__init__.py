"""Check a rewritten model against the original, bit for bit, on ONNX Runtime.

:func:`verify` compares REWRITTEN with ORIGINAL at two levels and returns a :class:`VerifyReport`:

- site level (:mod:`dql_pass.verification.extract`, :mod:`dql_pass.verification.site_level`): every
  DynamicQuantizeLinear of ORIGINAL (main graph, If/Loop/Scan bodies at any depth, model-local
  functions) is checked on its own, by what its live readers read in REWRITTEN, extracted and run
  on the catalogue (:func:`dql_pass.inputs.cases`) and two large cases against the reference;
  a site that cannot be extracted is "not reachable" and the verdict INCOMPLETE, never PASS;
- kept nodes (:mod:`dql_pass.verification.kept`): every node REWRITTEN keeps reads
  ORIGINAL's constants bit for bit and carries its attributes, or the verdict is FAIL, whatever the
  inputs below reach;
- graph inputs (:mod:`dql_pass.verification.interface`): REWRITTEN takes every input a caller may
  feed ORIGINAL, of the same type, and reads those ORIGINAL reads, or the verdict is FAIL;
- model level (:mod:`dql_pass.verification.model_level`): both models run on ORT on input sets synthesized by
  :mod:`dql_pass.verification.synthesis`; the values the main-graph sites' readers read must equal the
  reference on the site's input in ORIGINAL, and the graph outputs must be the same list with the
  same bits. A model level that cannot run (an input verify cannot synthesize) or that compares no
  element (empty inputs) is reported as not checked: INCOMPLETE, never PASS.

Testing finds what the inputs reach: a change that only shows behind a data-dependent trigger (one
token id out of thousands, a value no set comes near) can pass.

Failures to read the models or the parameters (``samples``, ``dims``, ``inputs``, more than
:data:`MAX_INPUT_BYTES` of inputs) raise :class:`~dql_pass.errors.InputError`; so does an
ORIGINAL that ORT cannot run, and a ModelProto whose external data is not loaded (its weights would
be looked for in the current folder; pass a path). A REWRITTEN that ORT cannot run is a mismatch.
"""

from __future__ import annotations

__all__ = ["MAX_INPUT_BYTES", "OutputResult", "SiteResult", "VerifyReport", "verify"]

import functools
import logging
import os
import time
from collections.abc import Mapping

import numpy as np
import onnx
import onnx_ir as ir

from dql_pass import runtimes
from dql_pass.errors import InputError
from dql_pass.files import as_ir_model, external_tensors
from dql_pass.graph.walk import live
from dql_pass.op import check_choice
from dql_pass.verification.extract import Scopes, original_sites, uncalled
from dql_pass.verification.interface import input_differences
from dql_pass.verification.kept import kept_differences
from dql_pass.verification.synthesis import (
    MAX_INPUT_BYTES, Unsynthesizable, chosen_dims, input_sets,
)
from dql_pass.verification.lowered import check_lowered
from dql_pass.verification.model_level import check_model, not_checked
from dql_pass.verification.narrowed import narrowed_nodes
from dql_pass.verification.progress import Callback, reporting
from dql_pass.verification.report import OutputResult, SiteResult, VerifyReport, counted
from dql_pass.verification.site_level import check_sites

logger = logging.getLogger(__name__)


def _as_ir(model: onnx.ModelProto | ir.Model | str | os.PathLike, role: str) -> tuple[ir.Model, str]:
    """The model and how the report names it: its file, or its graph's name."""
    loaded = as_ir_model(model)
    if isinstance(model, onnx.ModelProto) and external_tensors(loaded):
        # Its tensors would be read relative to the current folder, whatever files are there.
        raise InputError(f"{role} is a ModelProto with external data that is not loaded; pass its path instead")
    if isinstance(model, (ir.Model, onnx.ModelProto)):
        return loaded, loaded.graph.name or f"<{type(model).__name__}>"
    return loaded, os.fspath(model)


def verify(
    original: onnx.ModelProto | ir.Model | str | os.PathLike,
    rewritten: onnx.ModelProto | ir.Model | str | os.PathLike,
    *,
    samples: int = 3,
    seed: int = 0,
    inputs: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, int] | None = None,
    zero_range: str = "onnxruntime",
    runtime: str = "onnxruntime",
    progress: Callback | None = None,
) -> VerifyReport:
    """Check ``rewritten`` against ``original`` at site and model level (see the module docstring).

    Models are paths (checked and loaded with :func:`dql_pass.load_model`), ModelProtos or
    ``ir.Model`` objects, which are read and left as they were. ``samples`` random input sets
    (besides the constructed ones), ``seed`` for them and the catalogue, ``inputs`` arrays by input
    name used in every set, ``dims`` sizes by symbolic dimension name.

    ``runtime`` (a name of :data:`dql_pass.runtimes.RUNTIMES`) runs REWRITTEN: its sites run there
    as well as on ORT, and its model level runs there. Differences that the runtime states for the
    inputs concerned (:attr:`Runtime.known_differences` of the form each site has, read off its ops;
    none for ops of no form of dql_pass's) are counted apart as
    known differences, not as mismatches; the report names them. A site model that the runtime
    cannot load (a piece of a model it may run whole) is checked on ORT only and reported as not
    checked there, with the runtime's reason: INCOMPLETE, not PASS.

    ``progress``, if given, is called as ``progress(stage, done, total)`` as the checks go
    (:mod:`dql_pass.verification.progress`).
    """
    with reporting(progress):
        return _verify(original, rewritten, samples, seed, inputs, dims, zero_range, runtime)


def _checked_options(zero_range: str, runtime: str, samples: int, dims: Mapping[str, int] | None) -> runtimes.Runtime:
    """The runtime, once the options are known good; :class:`InputError` where one is not."""
    check_choice("zero-range policy", zero_range)
    runner = runtimes.get(runtime)
    runner.check_installed()
    if samples < 0:
        raise InputError(f"samples must be 0 or more, not {samples}")
    if any(size < 0 for size in (dims or {}).values()):
        raise InputError("dims: sizes must be 0 or more")
    return runner


def _narrowed(original: ir.Model, rewritten: ir.Model, runtime: runtimes.Runtime) -> str | None:
    """Why the runtime's verdict does not hold for REWRITTEN, where it computes in float16 or bfloat16
    and the runtime widens that to float32."""
    nodes = narrowed_nodes(original, rewritten) if runtime.widens_float16 else []
    if not nodes:
        return None
    return (f"REWRITTEN computes in float16 or bfloat16 at {counted(len(nodes), 'node')} ORIGINAL does "
            f"not ({', '.join(map(repr, nodes[:3]))}{', ...' * (len(nodes) > 3)}), which {runtime.name} runs in "
            f"float32: `--runtime reference` checks {'them' if len(nodes) != 1 else 'it'}")


def _verify(
    original: onnx.ModelProto | ir.Model | str | os.PathLike,
    rewritten: onnx.ModelProto | ir.Model | str | os.PathLike,
    samples: int,
    seed: int,
    inputs: Mapping[str, np.ndarray] | None,
    dims: Mapping[str, int] | None,
    zero_range: str,
    runtime: str,
) -> VerifyReport:
    runner = _checked_options(zero_range, runtime, samples, dims)
    start = time.perf_counter()
    original_model, original_label = _as_ir(original, "ORIGINAL")
    rewritten_model, rewritten_label = _as_ir(rewritten, "REWRITTEN")
    inputs, dims = inputs or {}, dims or {}
    try:
        sets, unsynthesizable = input_sets(original_model, samples, seed, inputs, dims), None
    except Unsynthesizable as reason:
        sets, unsynthesizable = None, str(reason)
    scopes = Scopes(rewritten_model)  # its graphs and what is live, walked once for every check below
    original_live = live(original_model)  # and ORIGINAL's
    with runner.recycling():  # a browser runtime starts its browser once, not once per model
        tallies = check_sites(rewritten_model, original_sites(original_model, original_live), seed, zero_range, runner,
                              scopes, uncalled(original_model, rewritten_model, scopes, original_live[0]))
        if sets is None:
            check = not_checked(tallies, unsynthesizable)
        else:
            fallback = functools.partial(input_sets, original_model, samples, seed, inputs, dims)
            check = check_model(original_model, rewritten_model, tallies, sets, fallback, zero_range, runner)
        lowered = check_lowered(original_model, rewritten_model, seed, runner, scopes)
    kept = kept_differences(original_model, rewritten_model, runtimes.get("onnxruntime"), scopes)
    report = VerifyReport(
        original=original_label, rewritten=rewritten_label, zero_range=zero_range,
        sites=[t.result for t in tallies] + lowered, outputs=check.outputs, input_sets=list(check.sets),
        model_error=check.error, seconds=time.perf_counter() - start, notes=check.notes,
        model_not_checked=check.not_checked, narrowed=_narrowed(original_model, rewritten_model, runner),
        runtime=runtime, kept_differences=kept,
        input_differences=input_differences(original_model, rewritten_model, original_live[0], scopes.live_nodes),
        dims=chosen_dims(original_model, next(iter(check.sets.values()), {})), cannot_run=check.cannot_run,
        from_ort=check.from_ort,
    )
    logger.info("%s", report.summary)
    return report
