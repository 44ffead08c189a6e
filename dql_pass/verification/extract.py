"""Site extraction: each DynamicQuantizeLinear of ORIGINAL, and the computation that REWRITTEN
puts in its place, as a model of its own.

Rules:

- a site is checked by what its readers read: for every node of ORIGINAL that reads one of the
  site's outputs, the value that the same node of REWRITTEN (same graph path, type and output
  names) reads at that input, and for a graph output the value at that position; an output nothing
  reads is looked up by name, so a copy of the DQL left dangling under the old names is not what
  gets checked;
- what is live in ORIGINAL (reachable backwards from its graph outputs, through subgraphs and
  function calls) must be live in REWRITTEN: a reader, or a graph holding the site, that REWRITTEN
  keeps but no longer uses does not stand in for what REWRITTEN computes ("not reachable");
- a site output whose name REWRITTEN lacks at the same path (or in the one graph that has them all,
  when a rewrite renamed a control-flow node) is a lost output, a mismatch, but for a site no graph
  output of ORIGINAL depends on and for an output nothing reads (dead code a rewrite may drop: the
  site's other outputs are checked); a reader REWRITTEN lacks makes the site not reachable;
- the computation of the values read is sliced back to the value named like the DQL's input by
  :mod:`dql_pass.graph.slice`, the one slice lowered ops go through too, taking in constants of
  outer scopes, subgraphs of the nodes on the way and the model-local functions they call; one
  that needs any other value cannot run alone: not reachable;
- a site that lower kept in float32 (a block, :mod:`dql_pass.lowering.blocks`): only lowered ops
  read its y and y_zero_point in ORIGINAL, and REWRITTEN lacks both but holds their float32
  difference under :func:`~dql_pass.lowering.blocks.centred_name` of y; that difference and
  y_scale are what is checked (against y - y_zero_point of the reference), and the lowered ops
  are checked from that difference by :mod:`dql_pass.verification.lowered`;
- a site in a model-local function is checked as that function's body in REWRITTEN, which stands for
  ORIGINAL's calls only where REWRITTEN calls it (or one function under another name) at every live
  call of ORIGINAL (a live call node making the same output names in the graph that stands for its
  own): a call that REWRITTEN inlines, or makes to another function than the others, computes what
  only the model level checks, and the function's sites are not reachable;
- the extracted model gets canonical names, so identical sites serialize to identical bytes;
"""

from __future__ import annotations

__all__ = [
    "LostOutput", "Scopes", "Site", "extract", "original_sites", "reader", "uncalled", "values_by_name",
]

import dataclasses
from collections.abc import Mapping, Sequence, Set

import onnx_ir as ir

from dql_pass.errors import InputError
from dql_pass.graph.slice import NotReachable, site_model
from dql_pass.graph.walk import Root, described, graph_scopes, live, op_key, sites_by_graph
from dql_pass.lowering import LOWERED
from dql_pass.lowering.blocks import cast_reader, centred_name
from dql_pass.op import CENTRED_OUTPUT_TYPES, CENTRED_OUTPUTS, OUTPUT_TYPES, OUTPUTS


_LOWERED = {("", op_type) for op_type in LOWERED}


@dataclasses.dataclass(frozen=True)
class _Use:
    """Where ORIGINAL reads a site output: input ``index`` of the node ``op`` (domain, type) that
    makes ``node_outputs`` in graph ``graph``; output ``index`` of the site's graph when ``op`` is
    None. ``live``: ORIGINAL's graph outputs depend on that node (or graph)."""

    graph: str
    index: int
    live: bool
    op: tuple[str, str] | None = None
    node_outputs: tuple[str, ...] = ()
    # The output of the Cast to float32 that alone reads that node's (a block may drop the pair).
    cast: str | None = None


@dataclasses.dataclass(frozen=True)
class Site:
    """A DQL of ORIGINAL: its report name, graph path, the names of its input and outputs, where
    each output is read, and whether ORIGINAL's graph outputs depend on the DQL."""

    name: str
    graph: str
    input: str
    outputs: tuple[str, ...]
    uses: tuple[tuple[_Use, ...], ...]
    live: bool


class LostOutput(Exception):
    """REWRITTEN has no value under one of the site's output names."""


def values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {v.name: v for v in graph.inputs if v.name}
    values.update(graph.initializers)
    values.update((v.name, v) for node in graph for v in node.outputs if v.name)
    return values


def _canonical(graph: ir.Graph, names: Sequence[str], types: Sequence[ir.DataType]) -> None:
    """Name everything by position, so that identical computations serialize to identical bytes, and
    the outputs ``names``."""
    values = [*graph.initializers.values()]
    values += [v for node in graph for v in node.outputs]
    for i, value in enumerate(values):
        value.name = f"\x00{i}"  # first out of the way, for initializer names may collide
    for i, value in enumerate(values):
        value.name = f"v{i}"
        value.shape = None  # the shapes of the original model do not hold for catalogue inputs
        value.doc_string = None
        value.metadata_props.clear()
    for i, node in enumerate(graph):
        node.name = f"n{i}"
        node.doc_string = None
        node.metadata_props.clear()
    graph.inputs[0].name = "x"
    graph.inputs[0].type, graph.inputs[0].shape = ir.TensorType(ir.DataType.FLOAT), None
    for value, name, dtype in zip(graph.outputs, names, types, strict=True):
        value.name = name
        if value.type is None:
            value.type = ir.TensorType(dtype)


def _uses(
    value: ir.Value, label: str, scopes: Mapping[ir.Graph, tuple[str, Root]], live: tuple[set[ir.Node], set[ir.Graph]]
) -> tuple[_Use, ...]:
    """Where ORIGINAL reads ``value``, an output of a site in the graph at ``label``."""
    nodes, graphs = live
    found = [_Use(label, i, value.graph in graphs) for i, output in enumerate(value.graph.outputs) if output is value] \
        if value.is_graph_output() else []
    found += [
        _Use(scopes[use.node.graph][0], use.idx, use.node in nodes, op_key(use.node),
             tuple(v.name for v in use.node.outputs),
             cast_reader(use.node.outputs[0]) if len(use.node.outputs) == 1 else None)
        for use in value.uses()
    ]
    return tuple(found)


def original_sites(model: ir.Model, alive: tuple[set[ir.Node], set[ir.Graph]] | None = None) -> list[Site]:
    """Every DQL of ``model``, the ORIGINAL, with where its outputs are read; ``alive``: its :func:`live`, when
    already found."""
    scopes = graph_scopes(model)
    alive = alive or live(model)
    sites = []
    for label, nodes in sites_by_graph(scopes).items():
        for node in nodes:
            if not node.inputs or node.inputs[0] is None or len(node.outputs) != 3:
                raise InputError(f"DynamicQuantizeLinear {node.name!r} in {label} lacks its input or an output")
            outputs = tuple(v.name for v in node.outputs)
            uses = tuple(_uses(v, label, scopes, alive) for v in node.outputs)
            sites.append(Site(node.name or outputs[0], label, node.inputs[0].name, outputs, uses, node in alive[0]))
    return sites


def reader(values: Mapping[str, ir.Value], op: tuple[str, str], outputs: Sequence[str]) -> ir.Node | None:
    """The node of REWRITTEN (whose graph's ``values`` these are) that stands for ORIGINAL's reader
    ``op`` (domain, type) making ``outputs``: the producer of the first named one, of the same
    domain, type and output names; None when there is none."""
    names = [name for name in outputs if name]
    node = values[names[0]].producer() if names and names[0] in values else None
    same = node is not None and op_key(node) == op and tuple(v.name for v in node.outputs) == tuple(outputs)
    return node if same else None


class Scopes:
    """The graphs of REWRITTEN by path, with their values by name and what is live."""

    def __init__(self, model: ir.Model):
        scopes = graph_scopes(model)
        self.values = {graph: values_by_name(graph) for graph in scopes}
        # graph_scopes gives every graph its own path, so no graph is lost here.
        self.by_path = {label: graph for graph, (label, _) in scopes.items()}
        self.labels = {graph: label for label, graph in self.by_path.items()}
        self.live_nodes, self.live_graphs = live(model)

    def counterpart(self, path: str, names: Sequence[str], live: bool) -> ir.Graph | None:
        """The graph at ``path`` if it holds values called ``names``, else the one graph that does;
        ``live``: among the live graphs only.

        A rewrite may rename or reorder control-flow nodes, and so change paths.
        """
        candidates = self.live_graphs if live else self.values
        graph = self.by_path.get(path)
        if graph in candidates and all(name in self.values[graph] for name in names):
            return graph
        holders = [g for g in candidates if all(name in self.values[g] for name in names)]
        return holders[0] if len(holders) == 1 else None

    def _dead(self, path: str, names: Sequence[str]) -> None:
        """Raise :class:`NotReachable` when only graphs that are not live hold ``names``."""
        dead = self.counterpart(path, names, live=False)
        if dead is not None:
            raise NotReachable(f"only {self.labels[dead]} holds {', '.join(map(repr, names))} in REWRITTEN, and "
                               "nothing REWRITTEN outputs depends on it: what is computed in its place is unknown")

    def block(self, site: Site) -> bool:
        """Whether REWRITTEN keeps the site as a block (see the module docstring)."""
        y, scale, zero_point = site.outputs
        if not site.uses[0] or not all(use.op in _LOWERED for k in (0, 2) for use in site.uses[k]):
            return False
        graph = self.counterpart(site.graph, [centred_name(y), scale], site.live)
        return graph is not None and y not in self.values[graph] and zero_point not in self.values[graph]

    def outputs(self, site: Site) -> tuple[str, ...]:
        """The names of what is checked of the site in REWRITTEN: its outputs, or a block's two."""
        return (centred_name(site.outputs[0]), site.outputs[1]) if self.block(site) else site.outputs

    def unread(self, site: Site) -> tuple[int, ...]:
        """The positions of the site's outputs that nothing reads in ORIGINAL (no node, no graph
        output) and that REWRITTEN dropped: what no value of ORIGINAL depends on is not lost."""
        if self.block(site):
            return ()
        unread = [k for k, uses in enumerate(site.uses) if not uses]
        if len(unread) == len(site.outputs):
            return ()  # a site nothing reads: checked by its names, or dropped as dead code
        read = [name for k, name in enumerate(site.outputs) if k not in unread]
        graph = self.counterpart(site.graph, read, site.live) or self.by_path.get(site.graph)
        values = self.values.get(graph, {})
        return tuple(k for k in unread if site.outputs[k] not in values)

    def holder(self, site: Site, unread: Sequence[int] = ()) -> ir.Graph:
        """The graph that holds the site's outputs (but those at the ``unread`` positions); when no graph
        or several do, the one at the site's path is kept and reports them lost."""
        outputs = [name for k, name in enumerate(self.outputs(site)) if k not in unread]
        graph = self.counterpart(site.graph, outputs, site.live)
        if graph is None and site.live:
            self._dead(site.graph, outputs)
        if graph is None:
            graph = self.by_path.get(site.graph)
        if graph is None:
            raise LostOutput(f"REWRITTEN has no graph {site.graph!r}, and no one other graph holds its outputs")
        values = self.values[graph]
        lost = [name for name in outputs if name not in values]
        if lost:
            raise LostOutput(f"REWRITTEN has no value named {', '.join(map(repr, lost))} in {site.graph}")
        return graph

    def read(self, site: Site) -> tuple[ir.Graph, list[tuple[ir.Value, ...]]]:
        """The graph holding the site in REWRITTEN and the values that the readers of the site's
        outputs read there, as triples to check: the first readers' values, then each other value
        read, in place of the first.

        An output that nothing reads in ORIGINAL is the value of its name, and left out where
        REWRITTEN dropped it (:meth:`unread`); of a block, the pair its lowered readers read:
        y - y_zero_point and y_scale.
        """
        unread = self.unread(site)
        graph = self.holder(site, unread)
        if self.block(site):
            centred = self.values[graph][centred_name(site.outputs[0])]
            found = [[centred], list(dict.fromkeys(self._read(graph, use, site.outputs[1]) for use in site.uses[1]))
                     or [self.values[graph][site.outputs[1]]]]
        else:
            found = [
                list(dict.fromkeys(self._read(graph, use, name) for use in uses)) or [self.values[graph][name]]
                for k, (name, uses) in enumerate(zip(site.outputs, site.uses, strict=True)) if k not in unread
            ]
        first = tuple(values[0] for values in found)
        others = [(*first[:k], value, *first[k + 1:]) for k, values in enumerate(found) for value in values[1:]]
        return graph, [first] + others

    def _dropped(self, use: _Use) -> bool:
        """Whether REWRITTEN makes the output of ``use``'s reader's Cast to float32 by another op:
        a block dropped the Cast pair after that lowered reader."""
        graph = self.counterpart(use.graph, [use.cast], use.live)
        producer = None if graph is None else self.values[graph][use.cast].producer()
        return producer is not None and producer.op_type != "Cast"

    def _read(self, holder: ir.Graph, use: _Use, name: str) -> ir.Value:
        """The value that REWRITTEN reads where ORIGINAL reads the site output ``name`` (``use``).

        A reader that a rewrite lowered (a MatMulInteger that became float ops, say, or whose output
        went with the Cast to float32 that alone read it, a block's Cast pair: that Cast's output
        name is then made by another op) is checked as a site of its own by
        :mod:`dql_pass.verification.lowered`, from the values named like its inputs: what it reads
        is the value of this name.
        """
        if use.op is None:
            if use.index >= len(holder.outputs):
                raise LostOutput(f"REWRITTEN's graph {use.graph} has no output {use.index}")
            return holder.outputs[use.index]
        names = [name for name in use.node_outputs if name]
        graph = self.counterpart(use.graph, names, use.live) if names else None
        wanted = f"{use.op[1]} node making {', '.join(map(repr, names))} in {use.graph}"
        if graph is None and use.live and names:
            self._dead(use.graph, names)
        if graph is None and use.op in _LOWERED and use.cast is not None and self._dropped(use):
            return self.values[holder][name]
        node = reader(self.values[graph], use.op, use.node_outputs) if graph is not None else None
        if node is None and graph is not None and use.op in _LOWERED:
            producer = self.values[graph][names[0]].producer()
            if producer is None or op_key(producer) != use.op:
                return self.values[holder][name]
        if node is None:
            raise NotReachable(f"REWRITTEN has no {wanted}, which reads it in ORIGINAL: what reads it is unknown")
        if use.live and node not in self.live_nodes:
            raise NotReachable(f"REWRITTEN keeps the {wanted}, but nothing REWRITTEN outputs depends on it: "
                               "what is read in its place is unknown")
        if use.index >= len(node.inputs) or node.inputs[use.index] is None:
            raise LostOutput(f"the {wanted} reads nothing at input {use.index} in REWRITTEN")
        return node.inputs[use.index]


def uncalled(original: ir.Model, rewritten: ir.Model, scopes: Scopes, alive: Set[ir.Node]) -> dict[str, str]:
    """The graphs of ORIGINAL's model-local functions, by path (their subgraphs too), whose calls REWRITTEN
    (whose ``scopes`` these are) does not make as calls of one function, each with why their sites are not
    reachable; ``alive``: ORIGINAL's live nodes. A call is known by its output names in its graph (the one
    at its path, or the one graph that holds them, where a rewrite renamed a control-flow node); one
    function renamed counts: the graph that holds the site's names is checked."""
    def outputs(node: ir.Node) -> tuple[str, ...]:
        return tuple(v.name for v in node.outputs)

    def named(identifier: ir.OperatorIdentifier) -> str:
        return "::".join(identifier[:2])

    def made(label: str, names: tuple[str, ...]) -> ir.OperatorIdentifier | None:
        """The function REWRITTEN calls to make ``names`` in its graph for ORIGINAL's ``label``; None if none."""
        graph = scopes.counterpart(label, names, live=True) if names and all(names) else None
        producer = None if graph is None else scopes.values[graph][names[0]].producer()
        if producer is None or producer not in scopes.live_nodes or outputs(producer) != names:
            return None
        return producer.op_identifier() if producer.op_identifier() in rewritten.functions else None

    labelled = graph_scopes(original)
    calls: dict[ir.OperatorIdentifier, dict[ir.OperatorIdentifier | None, str]] = {}
    for graph, (label, _) in labelled.items():
        for node in graph:
            if node.op_identifier() in original.functions and node in alive:
                target = made(label, outputs(node))
                calls.setdefault(node.op_identifier(), {}).setdefault(target, f"{described(node)} in {label}")
    why = {}
    for function, targets in calls.items():
        if None in targets:
            why[function] = (f"REWRITTEN calls no function where ORIGINAL's {targets[None]} calls {named(function)}: "
                             "what it computes in its place is checked by the model level only")
        elif len(targets) > 1:
            why[function] = (f"REWRITTEN calls {' and '.join(sorted(map(named, targets)))} where ORIGINAL calls "
                             f"{named(function)}: the site is checked in one of them only")
    return {label: why[root.identifier()] for label, root in labelled.values()
            if isinstance(root, ir.Function) and root.identifier() in why}


def extract(
    model: ir.Model, graph: ir.Graph, site: Site, outputs: Sequence[ir.Value], block: bool = False,
    unread: Sequence[int] = (),
) -> ir.Model:
    """A model with input ``x`` and outputs ``y, y_scale, y_zero_point`` (a ``block``'s
    ``y_centred, y_scale``; those at the ``unread`` positions left out) computing ``outputs``, the values
    read for the site in ``graph`` of ``model``."""
    extracted = site_model(model, graph, outputs, [site.input])  # outputs that ignore x still get compared
    names, types = (CENTRED_OUTPUTS, CENTRED_OUTPUT_TYPES) if block else (OUTPUTS, OUTPUT_TYPES)
    kept = [k for k in range(len(names)) if k not in unread]
    _canonical(extracted.graph, [names[k] for k in kept], [types[k] for k in kept])
    return extracted
