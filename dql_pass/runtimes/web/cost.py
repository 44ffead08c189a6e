"""What a model costs on the web runtimes, as the page reports it: the WebGPU API calls counted in
the page (:class:`GpuCalls`), and where each node runs, read from onnxruntime's verbose placement
log (:func:`read_placement`); :class:`Cost` holds both."""

from __future__ import annotations

__all__ = ["COPIES", "Cost", "GpuCalls", "read_placement"]

import dataclasses
import re
from collections.abc import Sequence

from dql_pass.runtimes.base import RuntimeFailure

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


_PLACED = re.compile(r"\] +(All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)$")
_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]   (\S.*)$")


def read_placement(log: Sequence[str], nodes: Sequence[str]) -> dict[str, list[str]]:
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
