"""The interface every runtime adapter implements, and the records it declares.

A :class:`Runtime` says whether it is installed and which extra installs it, loads a model into a
:class:`Session` that runs feeds and gives outputs as ONNX types, and declares as data what it
cannot run (:class:`Lack`, and :attr:`Runtime.unloadable` for a variant that does not run at all)
and where its outputs are known to differ from the contract (:class:`KnownDifference`), each
with the measured reason, which expansion variant is exact on it (:attr:`Runtime.variant`), and
which integer products it does not compute exactly in float32 (:class:`InexactProduct`), which
``lower`` then leaves alone. What adapters share to get there (model conversion, dtype
conforming, compiling per shape or rank) is :mod:`dql_pass.runtimes.sessions`.

An adapter imports its runtime only when a model is loaded on it, so the expand path reads the
limits without loading any runtime. A version of a runtime newer than the one a limit was measured on is
assumed to have it too, until it is measured: refusing a model that would load costs a flag,
writing one that does not load costs the user a deployment.
"""

from __future__ import annotations

__all__ = ["InexactProduct", "KnownDifference", "Lack", "Runtime", "RuntimeFailure", "Session", "failures_of"]

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from dql_pass.errors import InputError
from dql_pass.inputs import check_class, input_classes


class RuntimeFailure(Exception):
    """A runtime refused to load or run a model; its own error is the cause.

    Callers tell the model's fault (this) from a bug of ours (anything else, which propagates).
    """


@contextlib.contextmanager
def failures_of(origin: str | None = None) -> Iterator[None]:
    """Raise what the runtime raises (from module ``origin``; any exception when None) as RuntimeFailure."""
    try:
        yield
    except RuntimeFailure:
        raise  # an adapter's own refusal, already in one line
    except Exception as error:
        if origin is not None and not type(error).__module__.startswith(origin):
            raise
        raise RuntimeFailure(f"{type(error).__name__}: {error}") from error


@dataclasses.dataclass(frozen=True)
class Lack:
    """An op that a runtime cannot run from ``since_version`` of its schema on."""

    runtime: str
    op_type: str
    since_version: int
    measured: str
    reason: str
    domain: str = ""
    # The inputs (by position) that, when all are constants (initializers), make the op run after all.
    unless_constant: tuple[int, ...] = ()

    def describe(self) -> str:
        return f"{self.op_type}-{self.since_version} does not run on {self.runtime} ({self.measured}): {self.reason}"


@dataclasses.dataclass(frozen=True)
class InexactProduct:
    """An integer product (MatMulInteger, ConvInteger) whose float32 lowering the runtime was measured
    not to compute exactly, though every sum is an integer below 2^24: ``lower`` leaves it alone."""

    runtime: str
    op_type: str
    measured: str
    reason: str

    def describe(self) -> str:
        return f"its float32 lowering is not exact on {self.runtime} ({self.measured}): {self.reason}"


@dataclasses.dataclass(frozen=True)
class KnownDifference:
    """Where a runtime's outputs differ from the contract: a form, a class of inputs, a policy."""

    forms: tuple[str, ...]  # "native" (the DQL node) or expansion variants
    # One of :data:`dql_pass.inputs.CLASSES`, checked here: a misspelt class would never match.
    # None: any input, for a form the runtime gets wrong on inputs of no class in particular.
    inputs: str | None
    reason: str
    policy: str | None = None  # the zero-range policy under which it shows; None: any

    def __post_init__(self) -> None:
        if self.inputs is not None:
            check_class(self.inputs)


class Session:
    """A model loaded on a runtime. Subclasses compile per input shape where the runtime needs it."""

    def __init__(self, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        self.input_names = list(inputs)
        self.output_names = list(outputs)

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        """The named outputs (default: all) for ``feeds``, as arrays of their ONNX types;
        :class:`RuntimeFailure` when the runtime refuses."""
        raise NotImplementedError


class Runtime:
    """One way of running ONNX models; subclasses fill in the class attributes and :meth:`_load`."""

    name: str
    module: str  # what import finds when the runtime is installed
    distribution: str  # the PyPI distribution whose version is reported
    extra: str | None = None  # the dql_pass extra that installs it; None: installed with dql_pass
    variant: str = "quantizelinear"  # the expansion variant that is exact on it (`expand --target`)
    # How `lower --target` stores constant int8/uint8 weights by default (dql_pass.variants.WEIGHTS):
    # float32 where nobody downloads the file; "integer" where the file's size matters.
    weights: str = "float"
    lacks: tuple[Lack, ...] = ()
    known_differences: tuple[KnownDifference, ...] = ()
    inexact_products: tuple[InexactProduct, ...] = ()
    unloadable: dict[str, str] = {}  # expansion variants that do not load or run at all: the measured reason

    def installed(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except ImportError:  # a parent package that is missing
            return False

    def version(self) -> str | None:
        """The installed version of the runtime; None when it is not installed."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    def load(
        self, model: ir.Model | onnx.ModelProto | str | os.PathLike, *, threads: int = 0, optimize: str = "all"
    ) -> Session:
        """Load ``model`` (in memory, or a path whose external data sits beside it).

        ``optimize``: ``"all"`` as the runtime does by default, ``"basic"`` folds constants but
        fuses nothing, ``"none"`` runs every node as written, where the runtime allows the choice.
        """
        self.check_installed()
        return self._load(model, threads=threads, optimize=optimize)

    def install_hint(self) -> str:
        """What installs the runtime: the extra, by default."""
        return f"pip install 'dql_pass[{self.extra}]'" if self.extra else "reinstall dql_pass"

    def check_installed(self) -> None:
        """:class:`InputError` saying what to install, unless the runtime is installed."""
        if not self.installed():
            raise InputError(f"the runtime {self.name} is not installed; {self.install_hint()}")

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        raise NotImplementedError

    def differences(self, x: np.ndarray, form: str, policy: str) -> list[str]:
        """The reasons this runtime is known to give other outputs for ``x`` in ``form`` under ``policy``."""
        classes = input_classes(x, policy)
        found = [
            d.reason for d in self.known_differences
            if form in d.forms and d.inputs in (None, *classes) and d.policy in (None, policy)
        ]
        return [self.unloadable[form], *found] if form in self.unloadable else found
