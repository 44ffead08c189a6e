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

``threads`` is ignored: the page runs one wasm thread (threads need a cross-origin isolated page).
The ops the WebGPU provider has no kernel for run on its wasm CPU provider: :attr:`WebGpu.no_kernel`
lists the ones measured, and :meth:`WebRuntime.placement` tells where each node of a model runs.
:meth:`WebRuntime.cost` tells that and the GPU work of one inference (:class:`GpuCalls`), counted
at the page's WebGPU API: what a GPU pays per run, whatever SwiftShader's times say.
"""

from __future__ import annotations

__all__ = ["CACHE_VARIABLE", "COPIES", "ORT_WEB", "SETUP", "Cost", "GpuCalls", "Wasm", "WebGpu", "WebRuntime", "cache",
           "dist", "missing", "unpacked"]

import base64
import contextlib
import dataclasses
import itertools
import json
import os
import re
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner

from dql_pass.errors import InputError
from dql_pass.op import OUTPUTS
from dql_pass.runtimes.base import TIMEOUT_OPTION, KnownDifference, Runtime, RuntimeFailure, RuntimeTimeout, Session
from dql_pass.runtimes.sessions import as_file, fed_inputs, output_types
from dql_pass.runtimes.web.browser import Browser, BrowserFailure, BrowserTimeout, Server, chromium

ORT_WEB = "1.30.0"  # the onnxruntime-web version measured; setup installs exactly this one
CACHE_VARIABLE = "DQL_PASS_WEB_CACHE"
SETUP = "python -m dql_pass.runtimes.web setup"
_PAGE = Path(__file__).with_name("page.mjs")
_OPTIMIZE = {"all": "all", "basic": "basic", "none": "disabled"}
_TYPES = {  # onnxruntime-web's tensor type names
    np.dtype(np.float32): "float32", np.dtype(np.float64): "float64", np.dtype(np.float16): "float16",
    np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8", np.dtype(np.int16): "int16",
    np.dtype(np.uint16): "uint16", np.dtype(np.int32): "int32", np.dtype(np.uint32): "uint32",
    np.dtype(np.int64): "int64", np.dtype(np.uint64): "uint64", np.dtype(np.bool_): "bool",
}
_DTYPES = {name: dtype for dtype, name in _TYPES.items()}


COPIES = ("MemcpyFromHost", "MemcpyToHost")  # the nodes onnxruntime adds to move tensors between providers


@dataclasses.dataclass(frozen=True)
class GpuCalls:
    """WebGPU API calls the page made, counted as onnxruntime-web made them."""

    dispatches: int  # compute dispatches (dispatchWorkgroups and dispatchWorkgroupsIndirect): kernel launches
    submits: int  # queue submits (GPUQueue.submit)
    readbacks: int  # GPU-to-CPU readbacks (GPUBuffer.mapAsync for reading)


@dataclasses.dataclass(frozen=True)
class Cost:
    """What a model costs on a web runtime: the GPU calls of session creation and of one warm
    inference, and where its nodes run. On wasm every count is 0: no WebGPU call is made."""

    creation: GpuCalls  # while the session was created (weights uploaded, constants computed)
    inference: GpuCalls  # one inference after a first one: what every run pays
    placement: dict[str, list[str]]  # as WebRuntime.placement gives it

    @property
    def nodes(self) -> dict[str, int]:
        """Each execution provider's name to the number of the model's nodes it runs (copies apart)."""
        return {provider: sum(node.split(" ")[0] not in COPIES for node in nodes)
                for provider, nodes in self.placement.items()}

    @property
    def copies(self) -> int:
        """The Memcpy nodes onnxruntime added between the providers."""
        return sum(node.split(" ")[0] in COPIES for nodes in self.placement.values() for node in nodes)

    def as_dict(self) -> dict:
        """Plain data (for a JSON report)."""
        return {"creation": dataclasses.asdict(self.creation), "inference": dataclasses.asdict(self.inference),
                "nodes": self.nodes, "copies": self.copies}


def cache() -> Path:
    """The folder the setup command installs onnxruntime-web into."""
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "dql_pass" / "web")


def dist() -> Path:
    """onnxruntime-web's dist folder in the cache."""
    return cache() / f"onnxruntime-web-{ORT_WEB}" / "dist"


def unpacked() -> bool:
    """Whether the setup unpacked onnxruntime-web into the cache."""
    return all((dist() / runtime.bundle).is_file() for runtime in (WebGpu, Wasm))


def missing() -> str | None:
    """What the web runtimes need and is not there, as one line saying what to run; None: all there."""
    if chromium() is None:
        return f"run `{SETUP}` (Chromium is not installed)"
    if not unpacked():
        return f"run `{SETUP}` (onnxruntime-web {ORT_WEB} is not in {cache()})"
    return None


class _Page:
    """A browser and the server its page loads from: what a session runs in, one session at a time.
    Within :meth:`WebRuntime.recycling`, the page of a session that closed with nothing failed
    serves the next session, onnxruntime-web and the WebGPU device already started in it."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose  # the log level onnxruntime-web was started with
        self.server = Server()
        self.server.serve("/", _PAGE.with_name("blank.html"))
        self.server.serve("/page.mjs", _PAGE)
        for file in dist().iterdir():
            self.server.serve(f"/ort/{file.name}", file)
        self.browser: Browser | None = None

    def alive(self) -> bool:
        return self.browser is not None and self.browser.alive()

    def start(self) -> None:
        """A fresh browser on the page."""
        self.stop()
        try:
            self.browser = Browser(_executable(), self.server.origin + "/")
        except BrowserFailure as error:
            raise RuntimeFailure(f"Chromium did not start: {error}") from None

    def stop(self) -> None:
        if self.browser is not None:
            self.browser.close()
            self.browser = None

    def close(self) -> None:
        self.stop()
        self.server.close()


_SERVED = itertools.count()  # a folder of its own on the page's server for each session's model


class _WebSession(Session):
    """A model in a page of its own browser; after a failed or hung run, the next run starts a new
    browser and loads the model again."""

    def __init__(
        self, runtime: WebRuntime, path: Path, proto: onnx.ModelProto, optimize: str, verbose: bool,
        copy: contextlib.ExitStack,
    ) -> None:
        super().__init__([v.name for v in fed_inputs(proto)], [v.name for v in proto.graph.output])
        self.path = path  # the private copy the browser reads
        self._runtime = runtime
        self._output_types = dict(zip(self.output_names, output_types(proto)))
        # What the placement log means by "all nodes": the graph's, functions inlined, Constant
        # nodes left out (onnxruntime makes them initializers). Only placement (verbose) reads it.
        inlined = onnx.inliner.inline_local_functions(proto).graph.node if verbose else []
        self.graph_nodes = [f"{n.op_type} ({n.name})" for n in inlined if n.op_type != "Constant"]
        self._page = runtime._page(verbose)
        folder = f"/m{next(_SERVED)}/"
        data = path.with_name(path.name + ".data")
        self._served = [folder + "model.onnx", *([folder + data.name] if data.exists() else [])]
        self._options = {
            "bundle": f"/ort/{runtime.bundle}", "provider": runtime.provider,
            "model": self._page.server.serve(self._served[0], path),
            "externalData": ([{"path": data.name, "data": self._page.server.serve(self._served[1], data)}]
                             if data.exists() else None),
            "optimize": _OPTIMIZE[optimize], "verbose": verbose,
        }
        self.adapter: str | None = None  # the WebGPU adapter, "vendor architecture"
        self.log: list[str] = []  # what the page logged while the model loaded
        self.creation: GpuCalls | None = None  # the WebGPU calls made while the session was created
        self.creation_seconds: float | None = None  # how long the page took to create it
        self.last_run: GpuCalls | None = None  # the WebGPU calls of the last run that succeeded
        self.last_run_seconds: float | None = None  # how long the page took to run it
        self._finalizer = weakref.finalize(self, _WebSession._shut, runtime, self._page, self._served, copy)
        try:
            self._start()
        except BaseException:
            self._finalizer()
            raise

    @staticmethod
    def _shut(runtime: WebRuntime, page: _Page, served: list[str], copy: contextlib.ExitStack) -> None:
        for url_path in served:
            page.server.forget(url_path)
        runtime._recycle(page)
        copy.close()

    @property
    def browser_pid(self) -> int | None:
        """The process id of the browser the model is loaded in; None between a failure and the next run."""
        return self._page.browser.pid if self._page.alive() else None

    def _start(self) -> None:
        """The model loaded in the page, in a fresh browser unless the page's is running;
        RuntimeFailure when it does not load."""
        if not self._page.alive():
            self._page.start()
        browser = self._page.browser
        browser.console[:] = []
        try:
            loaded = self._call(f"(await import('/page.mjs')).load({json.dumps(self._options)})",
                                self._runtime.load_timeout)
        finally:
            self.log, browser.console[:] = list(browser.console), []
        self.adapter = loaded["adapter"]
        self.creation, self.creation_seconds = GpuCalls(**loaded["gpu"]), loaded["seconds"]

    def _call(self, expression: str, timeout: float):
        timeout = self._runtime.timeout or timeout
        try:
            return self._page.browser.evaluate(f"(async () => {expression})()", timeout=timeout)
        except BrowserTimeout:
            self._page.stop()
            raise RuntimeTimeout(f"a timeout: {self._runtime.name} gave no answer within {timeout:g} s; "
                                 f"{TIMEOUT_OPTION} gives it longer") from None
        except BrowserFailure as error:
            self._page.stop()  # the next run starts afresh: a failed run can hang the one after it
            raise RuntimeFailure(str(error)) from None
        except BaseException:
            self._page.stop()  # interrupted: the page may still be loading or running, so no session gets it
            raise

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        if not self._finalizer.alive:
            raise RuntimeFailure("the session is closed")
        sent = {}
        for name in self.input_names:
            if name not in feeds:
                raise RuntimeFailure(f"no feed for the input {name}")
            array = np.asarray(feeds[name])  # tobytes() below is in C order; ascontiguousarray would make 0-d 1-d
            if array.dtype not in _TYPES:
                raise RuntimeFailure(f"onnxruntime-web has no tensor type for {array.dtype}")
            sent[name] = {"type": _TYPES[array.dtype], "dims": list(array.shape),
                          "data": base64.b64encode(array.tobytes()).decode()}
        wanted = list(self.output_names if outputs is None else outputs)
        if not self._page.alive():
            self._start()
        answer = self._call(f"(await import('/page.mjs')).run({json.dumps(sent)}, {json.dumps(wanted)})",
                            self._runtime.run_timeout)
        got, self.last_run, self.last_run_seconds = answer["outputs"], GpuCalls(**answer["gpu"]), answer["seconds"]
        results = []
        for name in wanted:
            dtype = _DTYPES[got[name]["type"]]
            if dtype != self._output_types[name]:
                raise RuntimeFailure(f"onnxruntime-web gave {dtype} for {name}, "
                                     f"where the model declares {self._output_types[name]}")
            results.append(np.frombuffer(base64.b64decode(got[name]["data"]), dtype).reshape(got[name]["dims"]).copy())
        return results

    def close(self) -> None:
        """Stop the browser and the server now (or hand them on, when recycling), not when the
        session is collected."""
        self._finalizer()


def _executable() -> str:
    path = chromium()
    if path is None:
        raise InputError(f"the web runtimes need Chromium: {missing()}")
    return path


class WebRuntime(Runtime):
    """onnxruntime-web in Chromium with one execution provider."""

    module = "dql_pass.runtimes.web"
    distribution = "onnxruntime-web"
    provider: str
    bundle: str  # the dist file that `import 'onnxruntime-web/<build>'` resolves to
    load_timeout: float = 120
    run_timeout: float = 60
    weights = "integer"  # a browser downloads the model: int8 weights, a quarter of float32's size
    blocks = True  # every node is a kernel launch (WebGPU) or a kernel call (wasm)
    where = "headless Chromium"  # what a check on it runs, for the command line to say
    _idle: dict[bool, _Page] | None = None  # within recycling(): a page ready for the next session, per log level

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

    def _page(self, verbose: bool) -> _Page:
        """A page for a new session: the idle one of its log level when recycling, else a new one."""
        return (self._idle.pop(verbose, None) if self._idle is not None else None) or _Page(verbose)

    def _recycle(self, page: _Page) -> None:
        """A closed session's page: kept for the next session when recycling and its browser runs, else closed."""
        if self._idle is not None and page.alive() and page.verbose not in self._idle:
            self._idle[page.verbose] = page
        else:
            page.close()

    def _load(self, model, *, threads: int, optimize: str, placement: bool = False) -> _WebSession:
        copy = contextlib.ExitStack()  # the session's to close: the copy lives as long as it
        try:
            # Always a copy: the browser reads the model from the folder it is served from.
            path = copy.enter_context(as_file(model, private=True))
            proto = onnx.load(path, load_external_data=False)
            return _WebSession(self, path, proto, optimize, placement, copy)
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
            return _placement(session.log, session.graph_nodes)
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
            return Cost(session.creation, session.last_run, _placement(session.log, session.graph_nodes))
        finally:
            session.close()


_PLACED = re.compile(r"\] +(All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)$")
_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]   (\S.*)$")


def _placement(log: Sequence[str], nodes: Sequence[str]) -> dict[str, list[str]]:
    """The placement that onnxruntime logged: when every node went to one provider it names none,
    and they are ``nodes``, the model's own, unless the optimizer changed their number; then each
    is ``"?"``, so that a provider's list is as long as the nodes it was given still."""
    found: dict[str, list[str]] = {}
    provider = None
    for line in log:
        if placed := _PLACED.search(line):
            kind, provider, count = placed.groups()
            found[provider] = []
            if kind == "All nodes":
                count = int(count)
                found[provider] = list(nodes) if count == len(nodes) else ["?"] * count
        elif provider is not None and (node := _NODE.search(line)):
            found[provider].append(node.group(1))
    if not found:
        raise RuntimeFailure("onnxruntime-web logged no node placement")
    return found


class WebGpu(WebRuntime):
    name = "webgpu"
    provider = "webgpu"
    bundle = "ort.webgpu.bundle.min.mjs"  # the new WebGPU EP, which transformers.js 4 imports
    # lean: every op of it has a WebGPU kernel (its int32 Gathers and Casts included, measured
    # with placement()), it is exact with every Div several ulp off, as WGSL allows real GPUs, and
    # it costs 57 nodes a site (16 over the whole tensor) where portable, as exact, costs 97 (31).
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
    bundle = "ort.wasm.bundle.min.mjs"  # the build of `import 'onnxruntime-web/wasm'`
    variant = "quantizelinear"  # every form is exact here, as on ORT's CPU provider; this one is the smallest
