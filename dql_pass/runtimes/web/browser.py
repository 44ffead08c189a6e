"""Headless Chromium driven over the DevTools protocol on a pipe, and a server on 127.0.0.1.

``--remote-debugging-pipe`` gives the protocol on the child's file descriptors 3 (commands in)
and 4 (replies and events out), each message a JSON text ended by a NUL byte: no port, no
websocket, no Node. The pages load their scripts and the model from a server on 127.0.0.1 that
serves a fixed set of files (and 127.0.0.1 is a secure context, which WebGPU needs); every other
host resolves to nothing, so the browser cannot reach the network.
"""

from __future__ import annotations

__all__ = ["Browser", "BrowserFailure", "BrowserTimeout", "Server"]

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_log = logging.getLogger(__name__)

# Everything Chromium would fetch or start on its own is off; WebGPU runs on SwiftShader where
# no GPU is present (--enable-unsafe-webgpu is needed and enough).
_FLAGS = (
    "--headless", "--no-sandbox", "--enable-unsafe-webgpu", "--disable-quic", "--no-first-run",
    "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-extensions", "--disable-default-apps", "--disable-breakpad",
    "--disable-dev-shm-usage", "--mute-audio", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    # Host names resolve to nothing, and any other address goes to a proxy that is not there
    # (loopback bypasses proxies): the browser reaches 127.0.0.1 and nothing else.
    "--proxy-server=http://127.0.0.1:9",
    "--remote-debugging-pipe",
)
_TYPES = {".html": "text/html", ".mjs": "text/javascript", ".js": "text/javascript", ".wasm": "application/wasm"}


# Measured (Chromium 156): past it, the path of the socket Chromium makes in its profile passes the 108 bytes a
# Unix socket's name may take, and the browser closes its protocol pipe at once.
_LONGEST_PROFILE = 62


class BrowserFailure(Exception):
    """The browser died, timed out, or a page raised; the page's own message is the text."""


class BrowserTimeout(BrowserFailure):
    """No answer within the time given: the browser was stopped."""


class Server:
    """An HTTP server on 127.0.0.1 (an ephemeral port) that serves only the files it is given, under
    a secret first part of the path: any user of the machine reaches the port, and the model copies
    it serves may hold private weights (mode 0600 on disk)."""

    def __init__(self) -> None:
        self._files: dict[str, Path] = {}
        self._secret = "/" + secrets.token_urlsafe(24)
        files = self._files

        import http.server  # here, not at the top: listing the runtimes should not load a web server

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the base class's name)
                path = files.get(self.path.split("?")[0])
                if path is None:
                    self.send_error(404)
                    return
                with path.open("rb") as file:
                    self.send_response(200)
                    self.send_header("Content-Type", _TYPES.get(path.suffix, "application/octet-stream"))
                    self.send_header("Content-Length", str(os.fstat(file.fileno()).st_size))
                    self.send_header("Cache-Control", "no-store")
                    self.end_headers()
                    try:
                        shutil.copyfileobj(file, self.wfile)
                    except (BrokenPipeError, ConnectionResetError):  # the browser stopped (a timeout, a crash)
                        _log.debug("server: %s: the browser went away", self.path)

            def log_message(self, format: str, *args: Any) -> None:
                _log.debug("server: " + format, *args)

        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # Its default prints a traceback to stderr: a browser stopped mid-request is not ours to report.
                _log.debug("server: a request from %s failed", client_address, exc_info=True)

        self._server = Quiet(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="dql_pass web server", daemon=True).start()
        self.origin = f"http://127.0.0.1:{self._server.server_address[1]}"

    def serve(self, url_path: str, path: Path) -> str:
        """Serve ``path`` at ``url_path`` (below the secret part); its full URL."""
        self._files[self._secret + url_path] = Path(path)
        return self.origin + self._secret + url_path

    def forget(self, url_path: str) -> None:
        """Serve nothing at ``url_path`` any more."""
        self._files.pop(self._secret + url_path, None)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Browser:
    """One headless Chromium process with a fresh profile, and one page in it.

    :meth:`call` sends a protocol command and waits for its reply; a reply that does not come
    within ``timeout`` seconds kills the process (a hung page does not answer a close either).
    """

    def __init__(self, executable: str, url: str) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="dql_pass.chromium.", ignore_cleanup_errors=True)
        if len(os.fsencode(self._profile.name)) > _LONGEST_PROFILE:
            self._profile.cleanup()
            longest = _LONGEST_PROFILE - len("/dql_pass.chromium.12345678")
            raise BrowserFailure(
                f"the temporary folder {tempfile.gettempdir()} is too long a path for Chromium, which makes a socket "
                f"in its profile there: set TMPDIR to a folder of at most {longest} bytes (/tmp, say)")
        to_browser, commands = os.pipe()
        replies, from_browser = os.pipe()
        # Above 4, so that moving one end to 3 cannot overwrite the other; close-on-exec, so that
        # only the copies at 3 and 4 reach Chromium.
        child_in = fcntl.fcntl(to_browser, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(from_browser, fcntl.F_DUPFD_CLOEXEC, 10)
        for fd in (to_browser, from_browser):
            os.close(fd)
        # Chromium writes its crash-report settings and dconf's cache under $HOME whatever the
        # profile: inside the profile, they go with it.
        environ = {**os.environ, "HOME": self._profile.name, "TMPDIR": self._profile.name,
                   "XDG_CONFIG_HOME": self._profile.name, "XDG_CACHE_HOME": self._profile.name}
        quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
        try:
            # posix_spawn, not subprocess: moving the pipes to 3 and 4 would need a preexec_fn,
            # which is not safe in a process with threads. A session of its own: close() stops
            # the whole group (GPU and renderer processes too).
            self.pid = os.posix_spawn(
                executable, [executable, *_FLAGS, f"--user-data-dir={self._profile.name}", "about:blank"], environ,
                file_actions=[*quiet, (os.POSIX_SPAWN_DUP2, child_in, 3), (os.POSIX_SPAWN_DUP2, child_out, 4)],
                setsid=True,
            )
        except BaseException:  # no Chromium started: nothing of it may stay behind
            os.close(commands)
            os.close(replies)
            self._profile.cleanup()
            raise
        finally:
            os.close(child_in)
            os.close(child_out)
        self._exited = False
        self._commands = os.fdopen(commands, "wb", buffering=0)
        self._replies = os.fdopen(replies, "rb", buffering=0)
        self._next_id = 0
        self._waiting: dict[int, tuple[threading.Event, list]] = {}
        self._lock = threading.Lock()
        self.console: list[str] = []
        self._reader = threading.Thread(target=self._read, name="dql_pass chromium pipe", daemon=True)
        self._reader.start()
        self._session = None
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                      top=True)["sessionId"]
            self.call("Runtime.enable")
            self.call("Page.navigate", {"url": url})
            self.evaluate("new Promise(r => document.readyState === 'complete' ? r() : addEventListener('load', r))")
        except BaseException:
            self.close()
            raise

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = self._replies.read(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for text in messages:
                self._dispatch(json.loads(text))
        with self._lock:  # the browser is gone: nothing waiting gets a reply
            for event, slot in self._waiting.values():
                slot.append({"error": {"message": "the browser closed the protocol pipe"}})
                event.set()

    def _dispatch(self, message: Mapping[str, Any]) -> None:
        if "id" in message:
            with self._lock:
                waiting = self._waiting.pop(message["id"], None)
            if waiting is not None:
                waiting[1].append(message)
                waiting[0].set()
        elif message.get("method") == "Runtime.consoleAPICalled":
            self.console.append(" ".join(str(a.get("value", a.get("description", "")))
                                         for a in message["params"]["args"]))

    def call(
        self, method: str, params: Mapping[str, Any] | None = None, *, timeout: float = 60, top: bool = False
    ) -> dict:
        """The result of a protocol command to the page (or to the browser, with ``top``)."""
        event, slot = threading.Event(), []
        with self._lock:
            self._next_id += 1
            message: dict[str, Any] = {"id": self._next_id, "method": method, "params": dict(params or {})}
            if self._session is not None and not top:
                message["sessionId"] = self._session
            self._waiting[self._next_id] = (event, slot)
        try:
            self._commands.write(json.dumps(message).encode() + b"\0")
        except OSError as error:
            raise BrowserFailure(f"the browser is gone ({error})") from None
        if not event.wait(timeout):
            self.close()
            raise BrowserTimeout(f"no answer from the browser within {timeout:g} s to {method}; it was stopped")
        reply = slot[0]
        if "error" in reply:
            raise BrowserFailure(f"{method}: {reply['error'].get('message')}")
        return reply["result"]

    def evaluate(self, expression: str, *, timeout: float = 60) -> Any:
        """The JSON value of ``expression`` in the page, awaited; the page's exception as BrowserFailure."""
        result = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True},
                           timeout=timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            raise BrowserFailure(text.split("\n    at ")[0])
        return result["result"].get("value")

    def alive(self) -> bool:
        if not self._exited:
            try:
                self._exited = os.waitpid(self.pid, os.WNOHANG)[0] == self.pid
            except ChildProcessError:  # reaped already
                self._exited = True
        return not self._exited

    def close(self) -> None:
        """Stop the process (its whole group: GPU and renderer processes too) and remove its profile."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self._exited = True
        self._reader.join(5)
        for stream in (self._commands, self._replies):
            with contextlib.suppress(OSError):
                stream.close()
        self._profile.cleanup()


def chromium() -> str | None:
    """Debian's Chromium, or one on PATH."""
    return shutil.which("chromium") or shutil.which("chromium-browser")
