"""onnxruntime-web in headless Chromium: the ``webgpu`` runtime (the ``/webgpu`` build's WebGPU
execution provider, on SwiftShader where no GPU is present) and the ``wasm`` runtime (its wasm CPU
provider), as the browser runs them.

Nothing is installed at run time: ``python -m dql_pass.runtimes.web setup`` installs Debian's
Chromium (and Node's npm, if missing) and unpacks onnxruntime-web at the pinned version into the
cache folder (``$DQL_PASS_WEB_CACHE``, default ``~/.cache/dql_pass/web``). A session is one page
of its own browser process, which loads a private copy of the model once; a run that fails or
hangs (a failed run on the WebGPU provider can hang the next one) restarts the browser, and the
next run loads the model again in a fresh page. Within :meth:`WebRuntime.recycling` a session
that closes with nothing failed hands its page to the next one loaded. Tensors travel as base64 of their raw bytes, so
no value is converted on the way (NaN payloads, -0 and subnormals arrive as they left).

This module holds the adapters and what each runtime lacks; the session and the page's protocol are
:mod:`~dql_pass.runtimes.web.session`, what a model costs and where its nodes run
:mod:`~dql_pass.runtimes.web.cost`, where the pieces are installed :mod:`~dql_pass.runtimes.web.installation`,
the browser :mod:`~dql_pass.runtimes.web.browser`; the cost's and the installation's names are exported here too.

``threads`` is ignored: the page runs one wasm thread (threads need a cross-origin isolated page).
The ops the WebGPU provider has no kernel for run on its wasm CPU provider: :attr:`WebGpu.no_kernel`
lists the ones measured, and :meth:`WebRuntime.placement` tells where each node of a model runs.
:meth:`WebRuntime.cost` tells that and the GPU work of one inference (:class:`GpuCalls`), counted
at the page's WebGPU API: what a GPU pays per run, whatever SwiftShader's times say.
"""

from __future__ import annotations

__all__ = ["CACHE_VARIABLE", "COPIES", "ORT_WEB", "SETUP", "Cost", "GpuCalls", "Wasm", "WebGpu", "WebRuntime", "cache",
           "dist", "missing", "unpacked"]

import contextlib
from collections.abc import Iterator, Mapping

import numpy as np

from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import KnownDifference, Runtime
from dql_pass.runtimes.sessions import as_file
from dql_pass.runtimes.web.cost import COPIES, Cost, GpuCalls, read_placement
from dql_pass.runtimes.web.installation import BUNDLES, CACHE_VARIABLE, ORT_WEB, SETUP, cache, dist, missing, unpacked
from dql_pass.runtimes.web.session import Page, WebSession


class WebRuntime(Runtime):
    """onnxruntime-web in Chromium with one execution provider."""

    module = "dql_pass.runtimes.web"
    distribution = "onnxruntime-web"
    provider: str
    bundle: str  # the dist file that `import 'onnxruntime-web/<build>'` resolves to
    # A limit is there to stop a hung load or run, so a real one must fit in it: one run of a
    # transformer at a batch of 20 on SwiftShader, a CPU stand-in for a GPU, takes over a minute on
    # a loaded machine (docs/BENCHMARKS.md). ``timeout`` (--runtime-timeout) overrides both.
    load_timeout: float = 120
    run_timeout: float = 300
    weights = "integer"  # a browser downloads the model: int8 weights, a quarter of float32's size
    blocks = True  # every node is a kernel launch (WebGPU) or a kernel call (wasm)
    where = "headless Chromium"  # what a check on it runs, for the command line to say
    _idle: dict[bool, Page] | None = None  # within recycling(): a page ready for the next session, per log level

    def installed(self) -> bool:
        return missing() is None

    def version(self) -> str | None:
        return ORT_WEB if unpacked() else None

    def install_hint(self) -> str:
        return missing() or f"run `{SETUP}`"

    @contextlib.contextmanager
    def recycling(self) -> Iterator[None]:
        """Within it, a session that closes with nothing failed hands its browser to the next
        session loaded (Chromium, onnxruntime-web and the WebGPU device started once, not once per
        model: seconds a load); a page still holds one session at a time, and a failure still stops
        its browser. Every browser is stopped on leaving."""
        if self._idle is not None:  # already on: the outer one stops them
            yield
            return
        self._idle = {}
        try:
            yield
        finally:
            idle, self._idle = self._idle, None
            for page in idle.values():
                page.close()

    def _page(self, verbose: bool) -> Page:
        """A page for a new session: the idle one of its log level when recycling, else a new one."""
        return (self._idle.pop(verbose, None) if self._idle is not None else None) or Page(verbose)

    def _recycle(self, page: Page) -> None:
        """A closed session's page: kept for the next session when recycling and its browser runs, else closed."""
        if self._idle is not None and page.alive() and page.verbose not in self._idle:
            self._idle[page.verbose] = page
        else:
            page.close()

    def _load(self, model, *, threads: int, optimize: str, placement: bool = False) -> WebSession:
        import onnx  # here: listing the runtimes needs no graph library

        copy = contextlib.ExitStack()  # the session's to close: the copy lives as long as it
        try:
            # Always a copy: the browser reads the model from the folder it is served from.
            path = copy.enter_context(as_file(model))
            proto = onnx.load(path, load_external_data=False)
            return WebSession(self, path, proto, optimize, placement, copy)
        except BaseException:
            copy.close()
            raise

    def placement(self, model, *, optimize: str = "all") -> dict[str, list[str]]:
        """Where the nodes of ``model`` run, after the runtime's own optimizations: each execution
        provider's name to the nodes it was given, ``"OpType (name)"``, as onnxruntime's verbose
        placement log lists them (Memcpy nodes it added included), or ``"?"`` for a node the log
        does not name (every node on one provider, their number changed by the optimizer)."""
        self.check_installed()
        session = self._load(model, threads=0, optimize=optimize, placement=True)
        try:
            return read_placement(session.log, session.graph_nodes)
        finally:
            session.close()

    def cost(self, model, feeds: Mapping[str, np.ndarray], *, optimize: str = "all") -> Cost:
        """What ``model`` costs here on ``feeds``: the WebGPU calls of its session's creation and
        of its second run on ``feeds`` (the first may set up what later runs reuse), and where its
        nodes run; RuntimeFailure when it does not load or run."""
        self.check_installed()
        session = self._load(model, threads=0, optimize=optimize, placement=True)
        try:
            session.run(feeds)
            session.run(feeds)
            return Cost(session.creation, session.last_run, read_placement(session.log, session.graph_nodes))
        finally:
            session.close()


class WebGpu(WebRuntime):
    name = "webgpu"
    provider = "webgpu"
    bundle = BUNDLES["webgpu"]
    # lean: every op of it has a WebGPU kernel (its int32 Gathers and Casts included, measured
    # with placement()), it is exact with every Div several ulp off, as WGSL allows real GPUs, and
    # it costs 53 nodes a site (50 kernels, 15 over the whole tensor) where portable costs 97 (31).
    # Of the others residual was the most exact (52 of 56 catalogue inputs; quantizelinear and
    # arithmetic lose the empty inputs too, float64 does not load), but its Round and Sign run on
    # the wasm CPU and SwiftShader's exact Div hides what a GPU's would do.
    variant = "lean"
    # Ops the WebGPU provider has no kernel for (op: the input types), measured with placement():
    # they run on the wasm CPU provider, with copies both ways.
    no_kernel = {
        "DynamicQuantizeLinear": "float32", "MatMulInteger": "uint8 and int8", "ConvInteger": "uint8",
        "QuantizeLinear": "float32", "Round": "float32", "Sign": "float32", "IsNaN": "float32",
        "Clip": "uint8 (float32 has one)",
    }
    # Ops whose WebGPU kernel launches no compute dispatch (measured with cost(), 1.30.0): the output
    # is a view of the input, or the shape, which the CPU knows. Every other op placed on WebGPU
    # launches one, so a warm inference makes as many dispatches as the rest of its WebGPU nodes
    # (all-MiniLM-L6-v2 as q8, lowered: 2,651 = 2,732 nodes - 56 Reshape - 1 Flatten - 24 Shape).
    no_dispatch = {"Reshape": "a view", "Flatten": "a view", "Shape": "the shape, known on the CPU"}
    unloadable = {
        "float64": "measured (1.30.0): the /webgpu build's CPU provider has no Cast to or from double, so no provider "
                   "takes the float64 variant's Casts and the session is not created (transformer_memcpy.cc: "
                   "'!node_provider_type.empty() was false')",
    }
    known_differences = (
        KnownDifference(("quantizelinear", "arithmetic"), "empty",
                        "measured: the WebGPU provider's ReduceMin and ReduceMax refuse an empty tensor (the run "
                        "fails in reduction_ops.h); float64 and residual reduce over x and a 0, and keep it",
                        outputs=OUTPUTS),
        KnownDifference(("quantizelinear", "arithmetic", "residual", "portable", "lean"), "subnormal",
                        "measured: SwiftShader, Chromium's WebGPU adapter without a GPU, flushes subnormal float32 to "
                        "0: as operands of comparisons and min/max, and as results (a subnormal scale comes out 0, the "
                        "zero point 255 and y saturated), so the range, the scale and the zero point come out "
                        "otherwise (portable: 4 of 56 catalogue inputs and 170 of 1,000 built apart; 151 of the 174 "
                        "give the reference of x with its subnormals set to 0, the other 23, whose scale is "
                        "subnormal, the scale 0; lean: 184 of the 1,096 inputs of the catalogue, its large cases and "
                        "1,050 built apart, every one with a subnormal x or scale)", outputs=OUTPUTS),
    )


class Wasm(WebRuntime):
    name = "wasm"
    provider = "wasm"
    widens_float16 = "onnxruntime-web's wasm runs ORT's CPU provider, which computes a float16 node in float32"
    bundle = BUNDLES["wasm"]
    variant = "quantizelinear"  # every form is exact here, as on ORT's CPU provider; this one is the smallest
