"""A session of the web runtimes: a model loaded in a page of its own headless Chromium, and the
page's protocol (page.mjs): the model served to the page from a private copy, tensors sent and
received as base64 of their raw bytes, so that no value is converted on the way (NaN payloads, -0
and subnormals arrive as they left). A run that fails or hangs stops the browser, and the next run
starts a fresh one and loads the model again."""

from __future__ import annotations

__all__ = ["Page", "WebSession"]

import base64
import contextlib
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dql_pass.errors import InputError
from dql_pass.runtimes.base import TIMEOUT_OPTION, RuntimeFailure, RuntimeTimeout, Session
from dql_pass.runtimes.sessions import fed_inputs, hold, output_types
from dql_pass.runtimes.web.browser import Browser, BrowserFailure, BrowserTimeout, Server, chromium
from dql_pass.runtimes.web.cost import GpuCalls
from dql_pass.runtimes.web.installation import dist, missing

if TYPE_CHECKING:
    import onnx

    from dql_pass.runtimes.web import WebRuntime

_PAGE = Path(__file__).with_name("page.mjs")
_OPTIMIZE = {"all": "all", "basic": "basic", "none": "disabled"}
_TYPES = {  # onnxruntime-web's tensor type names
    np.dtype(np.float32): "float32", np.dtype(np.float64): "float64", np.dtype(np.float16): "float16",
    np.dtype(np.int8): "int8", np.dtype(np.uint8): "uint8", np.dtype(np.int16): "int16",
    np.dtype(np.uint16): "uint16", np.dtype(np.int32): "int32", np.dtype(np.uint32): "uint32",
    np.dtype(np.int64): "int64", np.dtype(np.uint64): "uint64", np.dtype(np.bool_): "bool",
}
_DTYPES = {name: dtype for dtype, name in _TYPES.items()}


class Page:
    """A browser and the server its page loads from: what a session runs in, one session at a time.
    Within :meth:`WebRuntime.recycling`, the page of a session that closed with nothing failed
    serves the next session, onnxruntime-web and the WebGPU device already started in it."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose  # the log level onnxruntime-web was started with
        self.server = Server()
        self.url = self.server.serve("/", _PAGE.with_name("blank.html"))  # the page's own URLs are relative to it
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
            self.browser = Browser(_executable(), self.url)
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


class WebSession(Session):
    """A model in a page of its own browser; after a failed or hung run, the next run starts a new
    browser and loads the model again."""

    def __init__(
        self, runtime: WebRuntime, path: Path, proto: onnx.ModelProto, optimize: str, verbose: bool,
        copy: contextlib.ExitStack,
    ) -> None:
        import onnx.inliner  # here: listing the runtimes needs no graph library

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
            "bundle": f"./ort/{runtime.bundle}", "provider": runtime.provider,
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
        self._finalizer = hold(self, WebSession._shut, runtime, self._page, self._served, copy)
        try:
            self._start()
        except BaseException:
            self._finalizer()
            raise

    @staticmethod
    def _shut(runtime: WebRuntime, page: Page, served: list[str], copy: contextlib.ExitStack) -> None:
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
            loaded = self._call(f"(await import('./page.mjs')).load({json.dumps(self._options)})",
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
        for name, array in zip(self.input_names, self.fed(feeds)):
            array = np.asarray(array)  # tobytes() below is in C order; ascontiguousarray would make 0-d 1-d
            if array.dtype not in _TYPES:
                raise RuntimeFailure(f"onnxruntime-web has no tensor type for {array.dtype}")
            sent[name] = {"type": _TYPES[array.dtype], "dims": list(array.shape),
                          "data": base64.b64encode(array.tobytes()).decode()}
        wanted = list(self.output_names if outputs is None else outputs)
        if not self._page.alive():
            self._start()
        answer = self._call(f"(await import('./page.mjs')).run({json.dumps(sent)}, {json.dumps(wanted)})",
                            self._runtime.run_timeout)
        got, self.last_run, self.last_run_seconds = answer["outputs"], GpuCalls(**answer["gpu"]), answer["seconds"]
        results = []
        for name in wanted:
            dtype = _DTYPES[got[name]["type"]]
            if self._output_types[name] not in (None, dtype):
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
