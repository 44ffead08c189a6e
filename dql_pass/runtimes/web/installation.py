"""Where the web runtimes' pieces are installed, and what of them is missing: the pinned
onnxruntime-web version, the cache folder that ``python -m dql_pass.runtimes.web setup`` unpacks it
into (``$DQL_PASS_WEB_CACHE``, default ``~/.cache/dql_pass/web``), and Chromium."""

from __future__ import annotations

__all__ = ["BUNDLES", "CACHE_VARIABLE", "ORT_WEB", "SETUP", "cache", "dist", "missing", "unpacked"]

import os
from pathlib import Path

from dql_pass.runtimes.web.browser import chromium

ORT_WEB = "1.30.0"  # the onnxruntime-web version measured; setup installs exactly this one
CACHE_VARIABLE = "DQL_PASS_WEB_CACHE"
SETUP = "python -m dql_pass.runtimes.web setup"
# Each runtime's dist file: what `import 'onnxruntime-web/<build>'` resolves to.
BUNDLES = {
    "webgpu": "ort.webgpu.bundle.min.mjs",  # the new WebGPU EP, which transformers.js 4 imports
    "wasm": "ort.wasm.bundle.min.mjs",  # the build of `import 'onnxruntime-web/wasm'`
}


def cache() -> Path:
    """The folder the setup command installs onnxruntime-web into."""
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "dql_pass" / "web")


def dist() -> Path:
    """onnxruntime-web's dist folder in the cache."""
    return cache() / f"onnxruntime-web-{ORT_WEB}" / "dist"


def unpacked() -> bool:
    """Whether the setup unpacked onnxruntime-web into the cache."""
    return all((dist() / bundle).is_file() for bundle in BUNDLES.values())


def missing() -> str | None:
    """What the web runtimes need and is not there, as one line saying what to run; None: all there."""
    if chromium() is None:
        return f"run `{SETUP}` (Chromium is not installed)"
    if not unpacked():
        return f"run `{SETUP}` (onnxruntime-web {ORT_WEB} is not in {cache()})"
    return None
