"""onnxscript rewriter rules that fuse a decomposed DynamicQuantizeLinear back into one node.

The rules, each a small class whose ``rule()`` gives an onnxscript ``RewriteRule``:

- ``OnnxFunctionBodyFusion``: ONNX's own function body of the operator, as ``onnx.inliner``
  (``inline_schema_functions=True``) and exporters write it, with the two Identity nodes that name
  y_scale and y_zero_point and without them. One pair of rules per function version that onnx
  defines (only DynamicQuantizeLinear-11 today), valid at every opset from 11 to the newest: the
  ops of the body keep their meaning there.
- ``DqlPassBodyFusion``: dql_pass's own decompositions (every variant), one rule per zero-range
  policy, as ``expand(mode="inline")`` stamps them.
- ``DqlPassCallFusion``: a call to the model-local function ``dql_pass::DynamicQuantizeLinear_*``
  that ``expand(mode="function")`` adds, fused when the function's body is one of the bodies above.

The body patterns are not written a second time here: each one is generated node by node from the
FunctionProto that defines the decomposition (``onnx.defs`` for ONNX's body,
:func:`dql_pass.decomposition.function_proto` for ours). ``fuse_rules()`` asks for commuted inputs,
so ``Min(0, ReduceMin(x))``, ``Equal(0, range)`` or ``Add(zp, Round(q))`` fuse as well; a body
with more than eight commutative nodes (the residual, portable and lean variants) fuses with its inputs in dql_pass's
order only, since each ordering is a rule of its own.

What a rule checks before it fuses, so that the fused node computes exactly what the block did:

- the structure: every op of the body, in the same order of non-commutative inputs, hence Div and
  not a Mul by a reciprocal, Round before the zero point is added, the saturation of the zero point
  and of y (Clip, Where or QuantizeLinear), the Cast to uint8; one x feeds the reductions and the
  quantization (one pattern variable);
- every constant, bit for bit, against the function's own: float32 scalars 0 and 255, and the
  zero-range scale 1.0 or 1/255 and unit scale 1.0 of dql_pass's bodies. Constant nodes and
  initializers both count; an initializer that is also a graph input (so it can be overridden
  at run time) does not;
- attributes: those of the body (``keepdims=0``, ``to=uint8``); any other must be neutral for a
  uint8, per-tensor quantization (e.g. ``noop_with_empty_axes=0``, ``output_dtype`` uint8);
- x is float32 when its type is known, and the ai.onnx opset is at least 11;
- no intermediate value is used outside the block or is a graph output (onnxscript's matcher
  refuses those matches; the block is then left alone).

The fused node keeps the three output values' names (the rewriter hands them over) and takes the
name of the node that produced y, without the ``/QuantizeLinear`` or ``/Cast`` suffix that
dql_pass's expansion adds: ``fuse(expand(m))`` gives m's DQL nodes their names back. A name that
is y's own comes back as no name, since expand names an unnamed DQL's nodes after y (so a DQL
named exactly like its y output comes back unnamed). The rewriter puts the node where y was
computed, the block's last node in what onnx.inliner, exporters and dql_pass write; a block whose
y_scale is consumed between its own nodes would need a topological sort afterwards, which
:func:`dql_pass.fuse` always does.
``expand_rules()`` is left out on purpose: expansion needs names that are unique across subgraphs,
which :mod:`dql_pass.expansion` provides and the rewriter does not.

Also here: ``behaviour_notes()`` (how the nodes fused by a rule differ from the block) and
``body_problems()`` (whether a body keeps the invariant that the rules' matcher and the diagnosis
rely on: one ReduceMin and one ReduceMax reading the same value, nodes in topological order, each Constant
node's tensor in ``value``, and every output but y computed in y's backward slice or next to it;
see :mod:`dql_pass.fusion._onnxscript_compat`). Every body a rule is built from is checked.

Each rule class has ``pattern``, ``check`` and ``rewrite`` as onnxscript's rule classes have them;
``rule()`` builds the ``RewriteRule`` with onnxscript's public constructor and the matcher of
:mod:`dql_pass.fusion._onnxscript_compat` (not ``RewriteRuleClassBase.rule()``, which takes no
matcher). ``fuse_rules()`` at the end composes them into the ``RewriteRuleSet`` callers apply.
"""

from __future__ import annotations

__all__ = [
    "DqlPassBodyFusion",
    "DqlPassCallFusion",
    "OnnxFunctionBodyFusion",
    "behaviour_notes",
    "body_problems",
    "fuse_rules",
]

import collections
import dataclasses
import re
from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter.pattern import MatchResult, MatchStatus, RewriteRule, RewriteRuleSet

from dql_pass import decomposition
from dql_pass.fusion._onnxscript_compat import NAME_TAG, NeighbourMatcher
from dql_pass.fusion.diagnosis import closest_miss
from dql_pass.op import MIN_OPSET, NAME, VARIANTS, ZERO_RANGE_POLICIES, ai_onnx_opset


# Attributes a matched node may carry beyond the body's own, with the values that leave a uint8,
# per-tensor quantization unchanged (None: any value). Everything else blocks the fusion.
_NEUTRAL_ATTRIBUTES: dict[str, dict[str, frozenset[int] | None]] = {
    "ReduceMin": {"noop_with_empty_axes": frozenset({0})},
    "ReduceMax": {"noop_with_empty_axes": frozenset({0})},
    "QuantizeLinear": {
        "axis": None,  # the scale is a scalar: per-tensor whatever the axis
        "saturate": None,  # float8 outputs only
        "output_dtype": frozenset({0, ir.DataType.UINT8.value}),
        "block_size": frozenset({0}),
        "precision": frozenset({0, ir.DataType.FLOAT.value}),
    },
    "Cast": {"saturate": None, "round_mode": None},  # float8 outputs only
}

# The ops whose inputs onnxscript's RewriteRuleSet(commute=True) swaps, one rule per ordering.
_COMMUTATIVE = frozenset({"Add", "Mul", "And", "Or", "Xor", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Equal", "Max",
                          "Min", "Sum", "Mean"})
_MAX_COMMUTED = 8  # at most 2^8 rules per body

_ONNX_BODY_NOTE = (
    "on an all-zero or empty x, ONNX's function body computes y_scale 0 and then 0/0, so its zero point "
    "and y are NaN cast to uint8 (undefined); the fused node gives the runtime's answer: y_scale 1.0, "
    "y_zero_point 0, y 0 on ONNX Runtime. Inputs holding ±inf, or whose scale underflows to 0, also "
    "get the runtime's defined results instead of NaN casts."
)
_ONNX_REFERENCE_NOTE = (
    "dql_pass's onnx-reference policy gave an all-zero or empty x the scale 1/255; the fused node "
    "gives the runtime's scale instead: 1.0 on ONNX Runtime (onnx.reference keeps 1/255)."
)


class _FusionRule:
    """A fusion into one DynamicQuantizeLinear node; ``note`` says how the fused node behaves differently."""

    def __init__(self, name: str, note: str | None = None):
        self.name = name
        self.note = note

    def rule(self) -> RewriteRule:
        return RewriteRule(self.pattern, self.rewrite, self.check, matcher=NeighbourMatcher, name=self.name)

    def rewrite(self, op, x: ir.Value, y: ir.Value, **_) -> Sequence[ir.Value]:
        name = _fused_name(y)
        outputs = op.DynamicQuantizeLinear(x, _outputs=3, _name=name)
        outputs[0].producer().metadata_props[NAME_TAG] = name or ""  # what fusing names it, not NameFixPass
        return outputs


def _fused_name(y: ir.Value) -> str | None:
    """The name of the node that produced y, without the ``/<op>[_<n>]`` suffix of dql_pass's
    expansion; None when what is left is y's own name (expand names an unnamed DQL's nodes after y)."""
    root = y.producer()
    name = re.sub(rf"/{root.op_type}(_\d+)?$", "", root.name or "")
    return None if name in ("", y.name) else name


def _ai_onnx_opset(context) -> int:
    container = context.graph_or_function
    imports = container.opset_imports if isinstance(container, ir.Function) else context.model.opset_imports
    return ai_onnx_opset(imports) or 0


def _input_mismatch(context, x: ir.Value) -> str | None:
    if x.dtype is not None and x.dtype != ir.DataType.FLOAT:
        return f"x is {x.dtype.name.lower()}, DynamicQuantizeLinear takes float32"
    if _ai_onnx_opset(context) < MIN_OPSET:
        return f"the ai.onnx opset is below {MIN_OPSET}: no DynamicQuantizeLinear there"
    return None


def _describe(array: np.ndarray) -> str:
    return f"{array.dtype} {array.shape} {array}" if array.ndim else f"{array.dtype} {array}"


def _constant_array(value: ir.Value) -> np.ndarray | None:
    """The value of an initializer or a Constant node's output.

    Not ``ir.convenience.get_const_tensor``: it renames the tensor it reads, which writes into the
    caller's ModelProto when the model was deserialized from one.
    """
    if value.const_value is not None:
        return value.const_value.numpy()
    node = value.producer()
    if node is None or node.op_type != "Constant" or node.domain != "" or len(node.attributes) != 1:
        return None
    (name, attr), *_ = node.attributes.items()
    if attr.is_ref():
        return None
    if name == "value":
        return attr.as_tensor().numpy()
    if name in ("value_float", "value_floats"):
        return np.array(attr.value, np.float32)
    return None  # integers or strings: not the float32 the body needs


def _constant_mismatch(value: ir.Value, expected: ir.TensorProtocol) -> str | None:
    """Why ``value`` is not exactly the constant ``expected`` (dtype, shape and bits), or None."""
    if value.is_graph_input():
        return f"{value.name!r} is a graph input, so it can change at run time"
    try:
        have = _constant_array(value)
    except Exception:  # external data that is not there
        return f"{value.name!r}: its value cannot be read"
    if have is None:
        return f"{value.name!r} is not a float32 constant"
    want = expected.numpy()
    if have.dtype != want.dtype or have.shape != want.shape or have.tobytes() != want.tobytes():
        return f"{value.name!r} is {_describe(have)}, expected {_describe(want)}"
    return None


def _attribute_mismatch(node: ir.Node, expected: set[str]) -> str | None:
    neutral = _NEUTRAL_ATTRIBUTES.get(node.op_type, {})
    for name, attr in node.attributes.items():
        if attr.is_ref():
            return f"{node.op_type} {node.name!r}: attribute {name} refers to a function attribute"
        if name in expected:
            continue
        if name not in neutral:
            return f"{node.op_type} {node.name!r}: attribute {name} is not part of the body"
        allowed = neutral[name]
        if allowed is not None and attr.value not in allowed:
            return f"{node.op_type} {node.name!r}: attribute {name}={attr.value} changes the result"
    return None


def body_problems(body: onnx.FunctionProto) -> list[str]:
    """How ``body`` breaks the invariant the rules and the diagnosis rely on; empty when it keeps it.

    The invariant: one input x and the outputs y, y_scale, y_zero_point; nodes in topological
    order; each Constant node holds its tensor in ``value``; one ReduceMin and one ReduceMax read
    the same value, x or one made of it (how :mod:`dql_pass.fusion.diagnosis` finds blocks left
    alone), and y is
    computed from both; every output but y is computed in y's backward slice or by a node that
    reads a value computed there (where :class:`~dql_pass.fusion._onnxscript_compat.NeighbourMatcher`
    looks for it).
    """
    if len(body.input) != 1 or len(body.output) != 3:
        return [f"{len(body.input)} input(s) and {len(body.output)} output(s), not x and y, y_scale, y_zero_point"]
    x, (y, *others) = body.input[0], body.output
    problems = []
    producer: dict[str, int] = {}  # value name -> index of the node that computes it
    for index, node in enumerate(body.node):
        if late := [name for name in node.input if name and name != x and name not in producer]:
            problems.append(f"{node.op_type} node {index} reads {late} before they are computed")
        if node.op_type == "Constant" and [a.name for a in node.attribute] != ["value"]:
            problems.append(f"Constant node {index} does not hold its tensor in 'value'")
        producer.update(dict.fromkeys(node.output, index))
    reductions = [i for i, n in enumerate(body.node) if n.op_type in ("ReduceMin", "ReduceMax")]
    if sorted(body.node[i].op_type for i in reductions) != ["ReduceMax", "ReduceMin"] or len(
        {body.node[i].input[0] for i in reductions}
    ) != 1:
        problems.append("the body has not exactly one ReduceMin and one ReduceMax, reading the same value")
    if missing := [name for name in body.output if name not in producer]:
        return [*problems, f"no node computes {missing}"]
    backward, pending = set(), [producer[y]]
    while pending:
        index = pending.pop()
        if index not in backward:
            backward.add(index)
            pending += [producer[name] for name in body.node[index].input if name in producer]
    if not set(reductions) <= backward:
        problems.append("y is not computed from both reductions")
    for name in others:
        node = body.node[producer[name]]
        if producer[name] not in backward and not any(producer.get(i) in backward for i in node.input):
            problems.append(f"{name} is computed away from y's nodes, where the matcher does not look")
    return problems


@dataclasses.dataclass(frozen=True)
class _Use:
    """An input of a body node: a value of the body, or a constant (a pattern variable)."""

    value: ir.Value | None = None
    constant: str | None = None


class _BodyFusion(_FusionRule):
    """Fuse the nodes of one FunctionProto that computes DQL (inputs x; outputs y, y_scale, y_zero_point)."""

    def __init__(self, name: str, body: onnx.FunctionProto, *, keep_identity: bool = True, note: str | None = None):
        super().__init__(name, note)
        if problems := body_problems(body):
            raise ValueError(f"{name}: the body breaks the matcher's invariant: {'; '.join(problems)}")
        function = ir.serde.deserialize_function(body)
        self.commutative_nodes = sum(n.op_type in _COMMUTATIVE for n in body.node)
        self._input = function.inputs[0]
        self._outputs = list(function.outputs)
        tensors = {
            n.outputs[0]: n.attributes["value"].as_tensor()
            for n in function
            if n.op_type == "Constant" and n.domain == ""
        }
        # Each use of a constant gets its own variable: producers share or repeat constants at will.
        self._constants: dict[str, tuple[ir.TensorProtocol, str]] = {}
        self._aliases: dict[ir.Value, ir.Value] = {}
        self._plan: list[tuple[ir.Node, list[_Use]]] = []
        self._attributes: dict[str, set[str]] = collections.defaultdict(set)
        for node in function:
            if node.outputs[0] in tensors:
                continue
            if node.op_type == "Identity" and not keep_identity:
                self._aliases[node.outputs[0]] = self._resolve(node.inputs[0])
                continue
            uses = []
            for i, value in enumerate(node.inputs):
                if value in tensors:
                    var = f"constant_{len(self._constants)}"
                    self._constants[var] = (tensors[value], f"{node.op_type} input {i} ({value.name})")
                    uses.append(_Use(constant=var))
                else:
                    uses.append(_Use(value=self._resolve(value)))
            self._plan.append((node, uses))
            self._attributes[node.op_type].update(node.attributes)

    def _resolve(self, value: ir.Value) -> ir.Value:
        return self._aliases.get(value, value)

    def pattern(self, op, x):
        values: dict[ir.Value, object] = {self._input: x}
        y = self._resolve(self._outputs[0])
        for node, uses in self._plan:
            inputs = [pattern.Var(use.constant) if use.constant else values[use.value] for use in uses]
            attributes = {name: attr.value for name, attr in node.attributes.items()}
            outputs = getattr(op, node.op_type)(
                *inputs, _outputs=["y" if out is y else None for out in node.outputs], **attributes
            )
            outputs = [outputs] if len(node.outputs) == 1 else outputs
            values.update(zip(node.outputs, outputs))
        return [values[self._resolve(out)] for out in self._outputs]

    def check(self, context, x: ir.Value, y: ir.Value, **constants: ir.Value) -> MatchResult:
        result = MatchResult()
        if reason := _input_mismatch(context, x):
            return result.fail(reason, x)
        for var, (expected, role) in self._constants.items():
            if reason := _constant_mismatch(constants[var], expected):
                return result.fail(f"{role}: {reason}", constants[var])
        for node in context.nodes:
            if reason := _attribute_mismatch(node, self._attributes[node.op_type]):
                return result.fail(reason, node)
        return result


class OnnxFunctionBodyFusion(_BodyFusion):
    """ONNX's function body of DynamicQuantizeLinear, at one of its function versions."""

    def __init__(self, version: int, *, keep_identity: bool):
        body = onnx.FunctionProto.FromString(onnx.defs.get_schema(NAME).get_function_with_opset_version(version))
        name = f"onnx_function_body_{version}" + ("" if keep_identity else "_without_identity")
        super().__init__(name, body, keep_identity=keep_identity, note=_ONNX_BODY_NOTE)


class DqlPassBodyFusion(_BodyFusion):
    """One of dql_pass's decompositions, as ``expand(mode="inline")`` stamps it."""

    def __init__(self, variant: str, zero_range: str):
        body = decomposition.function_proto(variant, MIN_OPSET, zero_range)
        note = _ONNX_REFERENCE_NOTE if zero_range == "onnx-reference" else None
        super().__init__(f"dql_pass_{variant}_{zero_range.replace('-', '_')}", body, note=note)


class DqlPassCallFusion(_FusionRule):
    """A call to dql_pass's model-local function, fused when the function's body computes DQL."""

    def __init__(self, variant: str, zero_range: str, bodies: Sequence[RewriteRule]):
        note = _ONNX_REFERENCE_NOTE if zero_range == "onnx-reference" else None
        super().__init__(f"dql_pass_call_{variant}_{zero_range.replace('-', '_')}", note)
        self._op_type = decomposition.function_name(variant, zero_range)
        self._bodies = bodies

    def pattern(self, op, x):
        return getattr(op, self._op_type)(
            x, _domain=decomposition.FUNCTION_DOMAIN, _outputs=["y", "y_scale", "y_zero_point"]
        )

    def check(self, context, x: ir.Value, y: ir.Value, **_) -> MatchResult:
        result = MatchResult()
        if reason := _input_mismatch(context, x):
            return result.fail(reason, x)
        call = y.producer()
        function = context.model.functions.get(call.op_identifier())
        if function is None:
            return result.fail(f"{call.domain}::{call.op_type} is not a model-local function", call)
        if reason := _body_mismatch(context.model, function, self._bodies):
            return result.fail(f"the body of {call.domain}::{call.op_type} {reason}", call)
        return result


def _body_mismatch(model: ir.Model, function: ir.Function, bodies: Sequence[RewriteRule]) -> str | None:
    """Why the body of ``function`` does not compute DQL of its input, or None when it does."""
    if len(function.inputs) != 1 or len(function.outputs) != 3 or function.attributes:
        return "does not have one input, three outputs and no attributes"
    x, outputs = function.inputs[0], list(function.outputs)
    nodes = [n for n in function if not (n.op_type == "Constant" and n.domain == "")]
    if len(nodes) == 1 and nodes[0].op_type == NAME and nodes[0].domain == "":
        # Already fused: the rewriter visits the function's own body too.
        if list(nodes[0].inputs) == [x] and list(nodes[0].outputs) == outputs:
            return None
    root = outputs[0].producer()
    if root is None:
        return "does not compute y"
    for rule in bodies:
        match = rule.match(model, function, root)
        if match and list(match.outputs) == outputs and match.bindings.get("x") is x and set(match.nodes) == set(nodes):
            return None
    miss = closest_miss(bodies, model, function, [root])
    if miss is not None and miss.status != MatchStatus.SUCCESS:
        return f"is not a DQL body ({miss.rule}: {miss.reason})"
    return "computes more than DQL"


def _fusions() -> tuple[list[_FusionRule], list[RewriteRule], list[_FusionRule]]:
    """The body fusions, their commuted rules, and the call fusions (which check bodies with those).

    Built afresh on every call: a rule's matcher keeps state while it matches.
    """
    versions = onnx.defs.get_schema(NAME).function_opset_versions
    bodies: list[_FusionRule] = [OnnxFunctionBodyFusion(v, keep_identity=k) for v in versions for k in (True, False)]
    bodies += [DqlPassBodyFusion(v, p) for v in VARIANTS for p in ZERO_RANGE_POLICIES]
    # A rule per ordering of the commutative nodes' inputs: 2^n rules. A body with more than
    # _MAX_COMMUTED of them (residual has 38, portable 36, lean 12) fuses with its inputs in dql_pass's order.
    few = [b for b in bodies if b.commutative_nodes <= _MAX_COMMUTED]
    commuted = RewriteRuleSet([b.rule() for b in few], commute=True).rules
    commuted += [b.rule() for b in bodies if b.commutative_nodes > _MAX_COMMUTED]
    calls: list[_FusionRule] = [
        DqlPassCallFusion(v, p, commuted) for v in VARIANTS for p in ZERO_RANGE_POLICIES
    ]
    return bodies, commuted, calls


def fuse_rules() -> RewriteRuleSet:
    """The rules that fuse decomposed DQL back into one node (commuted inputs included)."""
    _, commuted, calls = _fusions()
    return RewriteRuleSet([*commuted, *(call.rule() for call in calls)])


def behaviour_notes() -> dict[str, str]:
    """For the rules whose fused node behaves differently from the block it replaces: rule name -> how."""
    bodies, _, calls = _fusions()
    return {fusion.name: fusion.note for fusion in (*bodies, *calls) if fusion.note}
