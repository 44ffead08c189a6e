"""The site level of verify: each DynamicQuantizeLinear of ORIGINAL checked on its own.

Rules: every site model extracted from REWRITTEN (:mod:`dql_pass.verification.extract`) runs once
per distinct computation (identical models share one session) on the catalogue's comparable cases
and two large cases, against the reference under the chosen zero-range policy; a site lower kept in
float32 (a block) against the reference's y - y_zero_point in float32 and y_scale. It runs on ORT,
which runs the ops as ONNX defines them (what ORT refuses is a mismatch), and on the runtime
REWRITTEN is deployed on when that is another one (what that runtime refuses of a piece of the
model is not checked there, with its reason).
"""

from __future__ import annotations

__all__ = ["SiteTally", "check_sites"]

import dataclasses
import types
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from dql_pass import runtimes
from dql_pass.compare import WORST, SiteDifference, compare_site
from dql_pass.decomposition import form_of
from dql_pass.errors import one_line
from dql_pass.files import external_tensors
from dql_pass.graph.slice import NotReachable
from dql_pass.inputs import Case, cases, large_cases
from dql_pass.op import CENTRED_OUTPUT_TYPES, CENTRED_OUTPUTS, DOMAINS, OUTPUT_TYPES, OUTPUTS
from dql_pass.reference import centred, dynamic_quantize_linear
from dql_pass.verification.extract import LostOutput, Scopes, Site, extract
from dql_pass.verification.progress import advance
from dql_pass.verification.report import SiteResult, Tally

_ORT = runtimes.get("onnxruntime")


class SiteTally(Tally):
    """The tally of one DQL site, with the values its readers read in REWRITTEN.

    One per site: two sites may have the same names and path (say, in two unnamed If nodes), so a
    site is never looked up by its value.
    """

    def __init__(self, site: Site):
        super().__init__(SiteResult(site.name, site.graph))
        self.site = site
        # The values that the site's readers read in REWRITTEN, as triples (see Scopes.read).
        self.read: list[tuple[ir.Value, ...]] = []
        self.block = False  # REWRITTEN keeps it in float32: read holds pairs (y - y_zero_point, y_scale)
        self.unread: tuple[int, ...] = ()  # the outputs nothing reads in ORIGINAL and REWRITTEN dropped, by position

    @property
    def form(self) -> str | None:
        """What REWRITTEN computes the site with (its row's): another runtime's differences are those it states
        for that form; None (ops of no form of ours): none is excused."""
        return self.result.form

    @property
    def outputs(self) -> tuple[tuple[str, ...], tuple[ir.DataType, ...]]:
        """The names and types of what is checked of the site."""
        names, types = (CENTRED_OUTPUTS, CENTRED_OUTPUT_TYPES) if self.block else (OUTPUTS, OUTPUT_TYPES)
        return self._kept(names), self._kept(types)

    def expected(self, outputs: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, ...]:
        """What the site is held to, from the reference's ``outputs``."""
        return self._kept(centred(outputs) if self.block else outputs)

    def _kept(self, values: tuple) -> tuple:
        return tuple(value for k, value in enumerate(values) if k not in self.unread)


class _SiteRunner:
    """Runs extracted site models over the catalogue, once per distinct computation: on ORT, which
    runs the ops as ONNX defines them, and on ``runtime`` too when it is another one."""

    def __init__(self, catalogue: Sequence[Case], zero_range: str, runtime: runtimes.Runtime):
        self.catalogue = catalogue
        self.zero_range = zero_range
        self.runtime = runtime
        self.expected = [dynamic_quantize_linear(c.x, zero_range) for c in catalogue]
        self._results: dict[bytes, tuple[list[tuple[SiteDifference | None, str | None]], str | None]] = {}

    def run(
        self, model: ir.Model, tally: SiteTally
    ) -> tuple[list[tuple[SiteDifference | None, str | None]], str | None]:
        """Per case, the difference found (None: same bits) and the runtime's known reason for it, if
        any; and why the site was not checked on the runtime, if it was not. ``tally``'s site says
        what is checked (its outputs, or a block's), which the model's output names tell apart."""
        proto = ir.serde.serialize_model(model)  # once: for the cache key and for the session
        key = proto.SerializeToString(deterministic=True)
        if key not in self._results:
            # Constants kept on disk go through the runtime's own loading, which reads them.
            loaded = model if external_tensors(model) else proto
            results, unchecked = [(diff, None) for diff in self._run(loaded, _ORT, tally)[0]], None
            if self.runtime is not _ORT:
                diffs, unchecked = self._run(loaded, self.runtime, tally)
                for i, diff in enumerate(diffs):
                    if results[i][0] is None and diff is not None:
                        known = tally.form and self.runtime.differences(self.catalogue[i].x, tally.form,
                                                                        self.zero_range, diff.outputs)
                        results[i] = (diff, known[0] if known else None)
            self._results[key] = results, unchecked
        return self._results[key]

    def _run(
        self, model: ir.Model | onnx.ModelProto, runtime: runtimes.Runtime, tally: SiteTally
    ) -> tuple[list[SiteDifference | None], str | None]:
        """The difference of every case on ``runtime``, and why some were not checked there.

        What ORT, which runs the ops as ONNX defines them, refuses is the rewrite's fault: a
        mismatch. What another runtime refuses of a site model (a piece of a model it may run
        whole, on inputs the model may never see) is not checked there, with the reason.
        """
        try:
            session = runtime.load(model, threads=1, optimize="basic")
        except runtimes.RuntimeFailure as error:
            reason = f"{runtime.name} {runtimes.refused(error, 'load the site model')}: {one_line(error)}"
            if runtime is not _ORT:
                return [None] * len(self.catalogue), reason
            return [SiteDifference(WORST, reason)] * len(self.catalogue), None
        diffs, unchecked = [], None
        names = tally.outputs[0]
        for case, expected in zip(self.catalogue, self.expected):
            try:
                diff = compare_site(session.run({"x": case.x}, names), tally.expected(expected), names)
            except runtimes.RuntimeFailure as error:
                if runtime is not _ORT:
                    refusal = f"{runtime.name} {runtimes.refused(error, f'run case {case.name}')}: {one_line(error)}"
                    unchecked = unchecked or refusal
                    diff = None
                else:
                    diff = SiteDifference(WORST, f"failed: {one_line(error)}")
            if diff is not None:
                diff = dataclasses.replace(diff, detail=f"on {runtime.name}: {diff.detail}")
            diffs.append(diff)
        return diffs, unchecked


def _form(model: ir.Model) -> str | None:
    """The form of the site that ``model`` (extracted) computes, read off its ops."""
    nodes = [*ir.traversal.RecursiveGraphIterator(model.graph),
             *(node for function in model.functions.values() for node in function)]
    return form_of(node.op_type for node in nodes if node.domain in DOMAINS)


def check_sites(
    model: ir.Model, sites: Sequence[Site], seed: int, zero_range: str, runtime: runtimes.Runtime = _ORT,
    scopes: Scopes | None = None, unreachable: Mapping[str, str] = types.MappingProxyType({}),
) -> list[SiteTally]:
    """Each site of ORIGINAL, as REWRITTEN (``model``, whose ``scopes`` these are when given)
    computes what its readers read, on the catalogue; a site in a graph that ``unreachable`` names
    (graph path: why) is not reachable."""
    catalogue = [c for c in cases(seed=seed) if c.comparable]
    catalogue += large_cases()
    runner = _SiteRunner(catalogue, zero_range, runtime)
    classes = [case.classes(zero_range) for case in catalogue]
    scopes = scopes or Scopes(model)
    tallies = [SiteTally(site) for site in sites]
    for done, tally in enumerate(tallies):
        advance("sites", done, len(tallies))
        if tally.site.graph in unreachable:
            tally.result.not_reachable = unreachable[tally.site.graph]
            continue
        try:
            tally.block, tally.unread = scopes.block(tally.site), scopes.unread(tally.site)
            graph, tally.read = scopes.read(tally.site)
            # A computation that cannot be extracted may still be checked in the models: read stays.
            extracted = [extract(model, graph, tally.site, values, tally.block, tally.unread) for values in tally.read]
        except LostOutput as lost:
            if tally.site.live:
                tally.add("-", ["lost output"], SiteDifference(WORST, str(lost)), run=False)
            else:  # removed as dead code: what no output depends on changes no output
                tally.result.dropped = f"no graph output of ORIGINAL depends on it, and {lost}"
            continue
        except NotReachable as reason:
            tally.result.not_reachable = str(reason)
            continue
        if tally.unread:
            names = " and ".join(repr(tally.site.outputs[k]) for k in tally.unread)
            tally.result.unread = (f"{names} read by nothing in ORIGINAL and dropped by REWRITTEN: not checked, what "
                                   "is read is")
        if tally.block:
            tally.result.block = ("lower kept it in float32: y - y_zero_point (float32) and y_scale checked against "
                                  "the reference, the lowered ops that read it checked from y - y_zero_point")
        forms = {_form(site_model) for site_model in extracted}
        tally.result.form = forms.pop() if len(forms) == 1 else None
        for site_model in extracted:
            results, unchecked = runner.run(site_model, tally)
            tally.result.not_checked = tally.result.not_checked or unchecked
            for case, case_classes, (diff, known) in zip(catalogue, classes, results):
                tally.add(case.name, case_classes, diff, known=known)
    return tallies
