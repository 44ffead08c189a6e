"""Every node of a decomposed DynamicQuantizeLinear is a kernel launch on a GPU: the forms that GPU
targets run stay within their node budgets, per site and over the whole tensor."""

from __future__ import annotations

import onnx
import pytest

from dql_pass import decomposition, runtimes

# Per variant: (nodes per site, nodes that read or write a whole-tensor value), Constant nodes left
# out as decomposition.variant counts them (inline mode shares them between sites).
BUDGETS = {"portable": (97, 31), "lean": (53, 15), "float64": (27, 11)}
# The runtimes whose target runs on a GPU, and the most that target may cost.
GPU_TARGETS = {"webgpu": BUDGETS["lean"], "onnxruntime-cuda": BUDGETS["float64"]}


def whole_tensor_nodes(proto: onnx.FunctionProto) -> int:
    """The nodes with an input shaped like x (a reduction reads it whole, then gives a scalar)."""
    shaped = {proto.input[0]}
    count = 0
    for node in proto.node:  # topological order
        if any(i in shaped for i in node.input):
            count += 1
            if not node.op_type.startswith("Reduce"):
                shaped.update(node.output)
    return count


def cost(variant: str) -> tuple[int, int]:
    proto = decomposition.function_proto(variant)
    return decomposition.variant(variant).nodes, whole_tensor_nodes(proto)


@pytest.mark.parametrize("variant", sorted(BUDGETS))
def test_the_form_stays_within_its_node_budget(variant):
    nodes, whole = cost(variant)
    budget, whole_budget = BUDGETS[variant]
    assert nodes <= budget and whole <= whole_budget, (variant, nodes, whole)


@pytest.mark.parametrize("runtime", sorted(GPU_TARGETS))
def test_the_gpu_target_stays_within_its_node_budget(runtime):
    nodes, whole = cost(runtimes.RUNTIMES[runtime].variant)
    budget, whole_budget = GPU_TARGETS[runtime]
    assert nodes <= budget and whole <= whole_budget, (runtime, nodes, whole)

