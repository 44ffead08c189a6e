"""The interface every runtime adapter implements, and the records it declares.

A :class:`Runtime` says whether it is installed and which extra installs it, loads a model into a
:class:`Session` that runs feeds and gives outputs as ONNX types, and declares as data what it
cannot run (:class:`Lack`, and :attr:`Runtime.unloadable` for a variant that does not run at all)
and where its outputs are known to differ from the contract (:class:`KnownDifference`), each
with the measured reason, which expansion variant is exact on it (:attr:`Runtime.variant`), and
which integer products it does not compute exactly in float32 (:class:`InexactProduct`), which
``lower`` then leaves alone, and which ops of the quantization family it computes otherwise than
ONNX (:class:`ComputedOtherwise`), which verify lowers in the ORIGINAL it holds REWRITTEN to there.
What adapters share to get there (model conversion, dtype conforming, compiling per shape or rank)
is :mod:`dql_pass.runtimes.sessions`.

An adapter imports its runtime only when a model is loaded on it, so the expand path reads the
limits without loading any runtime. A version of a runtime newer than the one a limit was measured on is
assumed to have it too, until it is measured: refusing a model that would load costs a flag,
writing one that does not load costs the user a deployment.
"""

from __future__ import annotations

__all__ = [
    "TIMEOUT_OPTION", "ComputedOtherwise", "InexactProduct", "KnownDifference", "Lack", "Runtime", "RuntimeFailure",
    "RuntimeTimeout", "Session", "dequantizes_otherwise", "failures_of", "quantizes_otherwise", "refused",
]

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from dql_pass.errors import InputError
from dql_pass.inputs import check_class, input_classes
from dql_pass.op import CENTRED_FROM, OUTPUTS

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnx_ir as ir


class RuntimeFailure(Exception):
    """A runtime refused to load or run a model; its own error is the cause.

    Callers tell the model's fault (this) from a bug of ours (anything else, which propagates).
    """


TIMEOUT_OPTION = "--runtime-timeout SECONDS"  # what lengthens a runtime's time limit, as a timeout names it


class RuntimeTimeout(RuntimeFailure):
    """A runtime gave no answer within its time limit: slow, which says nothing of whether it can run
    the model. Callers report what it kept unchecked, never that the runtime cannot run it."""


def refused(error: RuntimeFailure, what: str) -> str:
    """``cannot WHAT`` for a refusal, ``did not WHAT in time`` for a timeout: slow is not unable."""
    return f"did not {what} in time" if isinstance(error, RuntimeTimeout) else f"cannot {what}"


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
class _MeasuredOp:
    """An op that a runtime was measured (on version ``measured``) to compute as it should not, and why."""

    runtime: str
    op_type: str
    measured: str
    reason: str


class InexactProduct(_MeasuredOp):
    """An integer product (MatMulInteger, ConvInteger) whose float32 lowering the runtime was measured
    not to compute exactly, though every sum is an integer below 2^24: ``lower`` leaves it alone."""

    def describe(self) -> str:
        return f"its float32 lowering is not exact on {self.runtime} ({self.measured}): {self.reason}"


class ComputedOtherwise(_MeasuredOp):
    """An op of the quantization family that the runtime was measured to compute otherwise than ONNX defines it:
    verify holds REWRITTEN there to ORIGINAL with that op lowered (lower's exact float32 form), not as the
    runtime's own kernel computes it."""

    def describe(self) -> str:
        return f"{self.runtime} computes {self.op_type} otherwise than ONNX ({self.measured}): {self.reason}"


# The measurements behind the records below; tests/test_runtimes.py checks on each runtime that it computes the op
# otherwise exactly where it says so.
def dequantizes_otherwise(runtime: str, measured: str, differ: int, how: str = "") -> ComputedOtherwise:
    """``runtime``'s DequantizeLinear, not (x - zero_point) * scale: ``differ`` of 256 uint8 values otherwise."""
    return ComputedOtherwise(runtime, "DequantizeLinear", measured,
                             f"measured: not (x - zero_point) * scale in float32{how}: {differ} of the 256 uint8 "
                             "values differ with the scale and zero point of all-MiniLM-L6-v2's quantized word "
                             "embeddings")


def quantizes_otherwise(runtime: str, measured: str, differ: int) -> ComputedOtherwise:
    """``runtime``'s QuantizeLinear, not ONNX's rounding: ``differ`` of 1,024 values otherwise."""
    return ComputedOtherwise(runtime, "QuantizeLinear", measured,
                             f"measured: not saturate(round_half_even(x / scale) + zero_point) in float32: {differ} "
                             "of 1,024 values differ (scale 0.0123, zero point 128; x the 600 ties k + 0.5 times the "
                             "scale and 424 normal draws)")


@dataclasses.dataclass(frozen=True)
class KnownDifference:
    """Where a runtime's outputs differ from the contract: a form, a class of inputs, a policy, and
    the outputs it changes, the only ones it excuses."""

    forms: tuple[str, ...]  # "native" (the DQL node) or expansion variants
    # One of :data:`dql_pass.inputs.CLASSES`, checked here: a misspelt class would never match.
    # None: any input, for a form the runtime gets wrong on inputs of no class in particular.
    inputs: str | None
    reason: str
    policy: str | None = None  # the zero-range policy under which it shows; None: any
    # Of dql_pass.op.OUTPUTS, those the reason says come out otherwise; checked here.
    outputs: tuple[str, ...] = dataclasses.field(kw_only=True)

    def __post_init__(self) -> None:
        if self.inputs is not None:
            check_class(self.inputs)
        if not self.outputs or not set(self.outputs) <= set(OUTPUTS):
            raise ValueError(f"a known difference names outputs of {OUTPUTS}, not {self.outputs}")


class Session:
    """A model loaded on a runtime. Subclasses compile per input shape where the runtime needs it."""

    def __init__(self, inputs: Sequence[str], outputs: Sequence[str]) -> None:
        self.input_names = list(inputs)
        self.output_names = list(outputs)

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> list[np.ndarray]:
        """The named outputs (default: all) for ``feeds``, as arrays of their ONNX types;
        :class:`RuntimeFailure` when the runtime refuses."""
        raise NotImplementedError

    def fed(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The arrays of ``feeds`` for the model's inputs, in their order; :class:`RuntimeFailure`
        naming those it lacks (a REWRITTEN that takes an input ORIGINAL does not, say)."""
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise RuntimeFailure(f"the model takes inputs it was not given: {', '.join(missing)}")
        return [feeds[name] for name in self.input_names]

    def chosen(self, results: Sequence[np.ndarray], outputs: Sequence[str] | None) -> list[np.ndarray]:
        """``results``, one per model output in their order, as :meth:`run` gives them: those ``outputs`` names
        (None: all)."""
        by_name = dict(zip(self.output_names, results))
        return [by_name[name] for name in (self.output_names if outputs is None else outputs)]

    def close(self) -> None:
        """Release what the session holds now, not when it is collected (a web session hands its page
        on when recycling); by default there is nothing to release."""


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
    # Whether `lower --target` keeps a DQL's quantized activation in float32 where only lowered
    # products read it (dql_pass.lowering.blocks): fewer nodes where each node is a kernel launch.
    blocks: bool = False
    lacks: tuple[Lack, ...] = ()
    known_differences: tuple[KnownDifference, ...] = ()
    inexact_products: tuple[InexactProduct, ...] = ()
    computed_otherwise: tuple[ComputedOtherwise, ...] = ()
    unloadable: dict[str, str] = {}  # expansion variants that do not load or run at all: the measured reason
    # Ops that load but run off the runtime's accelerator (op: the input types), measured; expand says so.
    no_kernel: dict[str, str] = {}
    where: str | None = None  # what a model loaded on it runs in, when that is not the Python process
    # Where the runtime computes a float16 node in float32, dropping the model's own Casts around it,
    # so that it cannot tell a rewrite narrowed to float16 from the original: the measured reason.
    widens_float16: str | None = None
    # Seconds one load or run may take, where the adapter limits them (a browser, a converter in a
    # process of its own); None: the adapter's own limits. Past it: RuntimeTimeout.
    timeout: float | None = None

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
        """Load ``model`` (in memory, or a path in any form onnx reads whose external data sits beside it).

        ``optimize``: ``"all"`` as the runtime does by default, ``"basic"`` folds constants but
        fuses nothing, ``"none"`` runs every node as written, where the runtime allows the choice.
        """
        from dql_pass.files import model_form, read_model  # onnx with it: listing the adapters needs none

        self.check_installed()
        if isinstance(model, (str, os.PathLike)) and model_form(model) != "protobuf":
            model = read_model(model)  # a runtime reads protobuf files only; an adapter gets a path in that form
        return self._load(model, threads=threads, optimize=optimize)

    def install_hint(self) -> str:
        """What installs the runtime: the extra, by default."""
        return f"pip install 'dql_pass[{self.extra}]'" if self.extra else "reinstall dql_pass"

    def check_installed(self) -> None:
        """:class:`InputError` saying what to install, unless the runtime is installed."""
        if not self.installed():
            raise InputError(f"the runtime {self.name} is not installed; {self.install_hint()}")

    def recycling(self) -> contextlib.AbstractContextManager[None]:
        """A context in which a session that closes hands what it started to the next one loaded,
        where that saves time (the web runtimes: their browser); by default nothing changes."""
        return contextlib.nullcontext()

    def _load(self, model, *, threads: int, optimize: str) -> Session:
        raise NotImplementedError

    def differences(self, x: np.ndarray, form: str, policy: str, outputs: Iterable[str] | None = None) -> list[str]:
        """The reasons this runtime is known to give other outputs for ``x`` in ``form`` under ``policy``.

        ``outputs``: those that differ; then only where the differences stated for ``x`` name every
        one of them (none otherwise), and only the reasons that name one: a form that does not run
        there (:attr:`unloadable`) excuses no output it gave.
        """
        classes = input_classes(x, policy)
        found = [
            d for d in self.known_differences
            if form in d.forms and d.inputs in (None, *classes) and d.policy in (None, policy)
        ]
        if outputs is not None:
            differing = {name for output in outputs for name in CENTRED_FROM.get(output, (output,))}
            covers = differing <= {name for d in found for name in d.outputs}
            found = [d for d in found if differing & set(d.outputs)] if covers else []
        reasons = list(dict.fromkeys(d.reason for d in found))  # one reason stated for several classes: once
        return [self.unloadable[form], *reasons] if form in self.unloadable and outputs is None else reasons
