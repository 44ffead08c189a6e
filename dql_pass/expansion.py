"""Expand every DynamicQuantizeLinear node into primitive ONNX ops.

Rules the pass applies:

- Every ai.onnx ``DynamicQuantizeLinear`` (domain ``""`` or ``"ai.onnx"``) is rewritten: in the main
  graph, in If/Loop/Scan bodies at any depth, and in every model-local function.
- The decomposition comes from :mod:`dql_pass.decomposition`, built once per (variant, opset, policy)
  at the model's ai.onnx opset, and stamped at every site; no pattern matching is involved.
- ``inline`` mode puts the function's nodes where the DQL was. Its constants are shared by all
  sites: initializers of the main graph, or Constant nodes at the top of a model-local function.
- ``function`` mode replaces each DQL by a call to one model-local function per variant and policy,
  in the ``dql_pass`` domain, at the model's opset; a different function that already holds the
  name pushes ours to a free one.
- A model-local function that holds a DQL is moved to the model's ai.onnx opset, where the stamped
  ops are valid; ONNX's checker already requires its ops to mean the same at both opsets.
- The IR version rises to what the output needs: 4 for shared initializers, 8 for local functions.
- The three outputs keep their names, so consumers, graph outputs and value_info keep working.
  Every new name is unique across the whole model, subgraphs and their parents included.
- A DQL whose input is known not to be float32, or that carries an attribute (it takes none),
  raises :class:`~dql_pass.errors.InputError`.
- A variant that ``runtime`` (ORT by default) cannot load at the model's opset, such as
  QuantizeLinear-28 on ORT 1.32, raises :class:`~dql_pass.errors.InputError` naming a variant that
  loads; another variant is never chosen silently. The limits are data in :mod:`dql_pass.runtimes`.
- Without DQL the model is left untouched; the pass is idempotent.
"""

from __future__ import annotations

__all__ = ["ExpandDynamicQuantizeLinearPass", "ExpandReport", "ExpandResult", "check_sites"]

import collections
import contextlib
import dataclasses
import functools
import gc
import logging
from collections.abc import Callable, Iterator

import onnx_ir as ir

from dql_pass import decomposition, runtimes
from dql_pass.errors import InputError
from dql_pass.files.written import Written, shared_lines, written_dict
from dql_pass.graph.names import SharedConstants, UniqueNames, free_name
from dql_pass.graph.walk import Root, check_ir_model, graph_scopes, sites_by_graph
from dql_pass.op import MAX_OPSET, MIN_OPSET, VARIANTS, ai_onnx_opset, check_choice

logger = logging.getLogger(__name__)

# Initializers that are not graph inputs need IR 4; model-local functions need IR 8.
_MIN_IR_VERSION = {"inline": 4, "function": 8}


@dataclasses.dataclass
class ExpandReport:
    """What :class:`ExpandDynamicQuantizeLinearPass` did: the sites it expanded per graph path, and how."""

    variant: str
    mode: str
    zero_range: str
    target: str | None = None
    sites: dict[str, int] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        if not self.sites:
            return "no DynamicQuantizeLinear"
        return (f"expanded {sum(self.sites.values())} DynamicQuantizeLinear (variant {self.variant}"
                f"{f' for {self.target}' if self.target else ''}, mode {self.mode}, zero range {self.zero_range})")

    def format(self) -> str:
        """The summary line, and the count of each graph under it."""
        return "\n".join([self.summary(), *(f"  {count:6d}  {label}" for label, count in self.sites.items())])

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ExpandResult(ir.passes.PassResult):
    """A PassResult that also carries the :class:`ExpandReport`, and from :func:`dql_pass.expand_file`
    what it read and wrote."""

    report: ExpandReport | None = None
    written: Written | None = None

    def __repr__(self) -> str:  # not the model, which can be gigabytes of text
        return f"ExpandResult(modified={self.modified}, sites={self.report.sites if self.report else {}})"

    def format(self) -> str:
        """What expand did, in a line, with the count of each graph under it."""
        done, written = self.report, self.written
        if written is None:
            return done.format()
        if not done.sites:
            lines = [written.unchanged(done.summary())]
        else:
            lines = [written.done(done.summary()), *done.format().splitlines()[1:]]
        return "\n".join(lines + shared_lines(written))

    def target_note(self) -> str | None:
        """Without a target: which runtimes the variant is exact on, and how to ask for another."""
        if not self.report.sites or self.report.target is not None:
            return None
        variant = self.report.variant
        exact = [name for name, runtime in runtimes.RUNTIMES.items() if runtime.variant == variant]
        source = self.written.source if self.written else "MODEL"
        return (f"variant {variant} is the exact target of {', '.join(exact) or 'no runtime'}; "
                f"for another runtime give --target (see --list-targets, or `dql-pass advise {source}`)")

    def to_dict(self) -> dict:
        return written_dict(self.written, self.report.to_dict())


class _Template:
    """The function body, split into its constants and the nodes stamped at each site."""

    def __init__(self, function: ir.Function):
        self.input = function.inputs[0]
        self.outputs = list(function.outputs)
        self.opset_imports = dict(function.opset_imports)
        self.constants: dict[ir.Value, ir.TensorProtocol] = {}
        self.nodes: list[ir.Node] = []
        for node in function:
            if node.op_type == "Constant" and node.domain == "":
                self.constants[node.outputs[0]] = node.attributes["value"].as_tensor()
            else:
                self.nodes.append(node)
        seen: collections.Counter[str] = collections.Counter()
        self.node_roles = []
        for node in self.nodes:
            self.node_roles.append(f"{node.op_type}_{seen[node.op_type]}" if seen[node.op_type] else node.op_type)
            seen[node.op_type] += 1

    def shared(self, store: SharedConstants) -> dict[ir.Value, ir.Value]:
        """The template's constants, each mapped to the value ``store`` shares for it."""
        return {value: store.get(value.name, tensor) for value, tensor in self.constants.items()}

    def stamp(self, mapping: dict[ir.Value, ir.Value], prefix: str) -> list[ir.Node]:
        """New nodes computing the body; ``mapping`` holds the input and constants, and gains the rest."""
        stamped = []
        for node, role in zip(self.nodes, self.node_roles):
            outputs = [ir.Value(name=prefix + value.name) for value in node.outputs]
            stamped.append(
                ir.Node(
                    node.domain,
                    node.op_type,
                    [mapping[value] for value in node.inputs],
                    attributes=node.attributes.values(),
                    outputs=outputs,
                    name=prefix + role,
                )
            )
            mapping.update(zip(node.outputs, outputs))
        return stamped


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    # Stamping creates many small linked objects; the cyclic GC would rescan the whole model over
    # and over (3x the pass time at 10,000 sites) while nothing here becomes garbage.
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class ExpandDynamicQuantizeLinearPass(ir.passes.InPlacePass):
    """Replace every ai.onnx DynamicQuantizeLinear by primitive ops (see the module docstring)."""

    def __init__(
        self,
        variant: str | None = None,
        mode: str = "inline",
        zero_range: str = "onnxruntime",
        runtime: str | None = "onnxruntime",
        *,
        target: str | None = None,
    ):
        """``variant`` defaults to quantizelinear, or with ``target`` to the variant exact on that
        runtime, which is then also the ``runtime`` the expansion must load on (None: not checked)."""
        super().__init__()
        if target is not None:
            exact = runtimes.get(target).variant
            if variant is not None and variant != exact:
                raise InputError(f"variant {variant} is not the one target {target} gets ({exact}); give one of them")
            variant, runtime = exact, target
        self.target = target
        self.runtime = runtime if runtime is None else check_choice("runtime", runtime, runtimes.RUNTIMES)
        self.variant = check_choice("variant", variant or "quantizelinear")
        self.mode = check_choice("mode", mode)
        self.zero_range = check_choice("zero-range policy", zero_range)

    def call(self, model: ir.Model) -> ExpandResult:
        check_ir_model(model, "expand")
        with _gc_paused():
            return self._expand(model)

    def _expand(self, model: ir.Model) -> ExpandResult:
        scopes = graph_scopes(model)
        sites = sites_by_graph(scopes)
        if not sites:
            logger.info("no DynamicQuantizeLinear in the model")
            return ExpandResult(model, modified=False, report=self._report({}))
        check_sites(sites)
        opset = _ai_onnx_opset(model.graph, "the model")
        self._check_runs(opset)
        proto = decomposition.function_proto(self.variant, opset, self.zero_range)
        template = _Template(ir.serde.deserialize_function(proto))
        names = UniqueNames.of_model(model)
        rewrites: dict[int, Callable[[ir.Node], None]] = {}
        for label, nodes in sites.items():
            for node in nodes:
                root = scopes[node.graph][1]
                if id(root) not in rewrites:
                    rewrites[id(root)] = self._rewrite(model, root, label, template, names)
                rewrites[id(root)](node)
            logger.info("expanded %d DynamicQuantizeLinear in %s", len(nodes), label)
        model.ir_version = max(model.ir_version, _MIN_IR_VERSION[self.mode])
        counts = {label: len(nodes) for label, nodes in sites.items()}
        return ExpandResult(model, modified=True, report=self._report(counts))

    def _report(self, sites: dict[str, int]) -> ExpandReport:
        return ExpandReport(self.variant, self.mode, self.zero_range, self.target, sites)

    def _check_runs(self, opset: int) -> None:
        """Refuse to write what ``runtime`` cannot load: the original DQL ran there, so must this."""
        if self.runtime is None:
            return
        lacks = _lacks(self.runtime, self.variant, opset)
        if not lacks:
            return
        others = [v for v in VARIANTS if v != self.variant and not _lacks(self.runtime, v, opset)]
        instead = f"; the variant {' or '.join(others)} runs there" if others else ""
        raise InputError(f"variant {self.variant} at ai.onnx opset {opset}: {lacks[0].describe()}{instead}")

    def _rewrite(
        self, model: ir.Model, root: Root, label: str, template: _Template, names: UniqueNames
    ) -> Callable[[ir.Node], None]:
        """What replaces each DQL of ``root``."""
        if isinstance(root, ir.Function):
            _align_opset(root, label, template.opset_imports[""])
        if self.mode == "inline":
            constants = template.shared(SharedConstants(root, names))
            return functools.partial(self._inline, template=template, constants=constants, names=names)
        function = self._local_function(model, template)
        if isinstance(root, ir.Function):
            root.opset_imports[decomposition.FUNCTION_DOMAIN] = 1
        return functools.partial(self._call, function=function)

    @staticmethod
    def _inline(node: ir.Node, template: _Template, constants: dict[ir.Value, ir.Value], names: UniqueNames) -> None:
        prefix = names.prefix(node.name or node.outputs[0].name or "DynamicQuantizeLinear")
        mapping = {template.input: node.inputs[0], **constants}
        stamped = template.stamp(mapping, prefix)
        outputs = [mapping[value] for value in template.outputs][: len(node.outputs)]
        ir.convenience.replace_nodes_and_values(node.graph, node, [node], stamped, node.outputs, outputs)

    @staticmethod
    def _call(node: ir.Node, function: ir.Function) -> None:
        # The call takes over the DQL's node name, or its lack of one, so that fuse can give it back.
        call = ir.Node(function.domain, function.name, node.inputs[:1], num_outputs=3, name=node.name)
        outputs = call.outputs[: len(node.outputs)]
        ir.convenience.replace_nodes_and_values(node.graph, node, [node], [call], node.outputs, outputs)

    def _local_function(self, model: ir.Model, template: _Template) -> ir.Function:
        """The model-local function for the template's opset: an identical one is reused, and a
        different function that holds the name pushes ours to another name."""
        name = decomposition.function_name(self.variant, self.zero_range)
        taken = {key_name for domain, key_name, _ in model.functions if domain == decomposition.FUNCTION_DOMAIN}
        counts: collections.Counter[str] = collections.Counter()
        while True:
            function = _build_function(template, name)
            existing = model.functions.get((decomposition.FUNCTION_DOMAIN, name, ""))
            if existing is None:
                model.functions[function.identifier()] = function
                model.opset_imports[decomposition.FUNCTION_DOMAIN] = 1
                return function
            if _same_function(existing, function):
                return existing
            name = free_name(name, taken, counts)


def check_sites(sites: dict[str, list[ir.Node]]) -> None:
    """Refuse a DQL that ORT would not run: its input known not to be float32, or an attribute
    (it takes none). Models from the API may not have met ONNX's checker, which refuses the latter."""
    for label, nodes in sites.items():
        for node in nodes:
            dtype = node.inputs[0].dtype if node.inputs and node.inputs[0] is not None else None
            if dtype is not None and dtype != ir.DataType.FLOAT:
                raise InputError(f"DynamicQuantizeLinear {node.name!r} in {label} takes float32, "
                                 f"not {dtype.name.lower()}")
            if node.attributes:
                raise InputError(
                    f"DynamicQuantizeLinear {node.name!r} in {label} has the attribute(s) "
                    f"{', '.join(map(repr, node.attributes))}; it takes none, and ORT refuses the model"
                )


def _lacks(runtime: str, variant: str, opset: int) -> list[runtimes.Lack]:
    ops = {("", op_type) for op_type in decomposition.variant(variant, opset).op_types}
    return runtimes.lacking(runtime, ops, opset)


def _build_function(template: _Template, name: str) -> ir.Function:
    x = ir.Value(name=template.input.name, type=ir.TensorType(ir.DataType.FLOAT))
    graph = ir.Graph([x], [], nodes=[], opset_imports=dict(template.opset_imports), name=name)
    function = ir.Function(decomposition.FUNCTION_DOMAIN, name, graph=graph, attributes=[])
    mapping = {template.input: x, **template.shared(SharedConstants(function, UniqueNames({x.name})))}
    graph.extend(template.stamp(mapping, ""))
    graph.outputs.extend(mapping[value] for value in template.outputs)
    return function


def _same_function(a: ir.Function, b: ir.Function) -> bool:
    return ir.serde.serialize_function(a).SerializeToString() == ir.serde.serialize_function(b).SerializeToString()


def _align_opset(function: ir.Function, label: str, opset: int) -> None:
    """Import the model's ai.onnx opset in a function that holds a DQL.

    ONNX's checker requires every op of a model-local function to mean the same under the
    function's opset and the model's, so a valid model's function keeps its meaning at the
    model's opset, where the stamped ops are valid too.
    """
    if _ai_onnx_opset(function, label) != opset:
        function.opset_imports.pop("ai.onnx", None)
        function.opset_imports[""] = opset


def _ai_onnx_opset(root: Root, label: str) -> int:
    opset = ai_onnx_opset(root.opset_imports)
    if opset is None:
        raise InputError(f"{label} holds DynamicQuantizeLinear but imports no ai.onnx opset")
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise InputError(
            f"{label} imports ai.onnx opset {opset}; dql_pass knows {MIN_OPSET} to {MAX_OPSET}"
        )
    return opset
