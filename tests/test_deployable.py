"""dql_pass.verification.deployable: what keeps a model from running on a runtime, each reason on one line."""

from __future__ import annotations

import onnx_ir as ir
import pytest
from helpers import sample

from dql_pass import runtimes
from dql_pass.verification import deployable


class _Refusing:
    """A runtime that is installed and refuses every model (or runs none) with a multi-line message,
    as OpenVINO's frontend does."""

    lacks = ()

    def __init__(self, at: str):
        self.at = at

    def installed(self) -> bool:
        return True

    def load(self, model):
        if self.at == "load":
            raise runtimes.RuntimeFailure("Exception from core.cpp:84:\nCheck 'false' failed\n\nSummary:\n"
                                          "-- No conversion rule")
        return self

    def run(self, feeds):
        raise runtimes.RuntimeFailure("kernel failed:\n  at node 3\n-- out of range")


@pytest.mark.parametrize("at", ["load", "run"])
def test_a_runtime_refusal_is_one_line_that_keeps_its_cause(monkeypatch, at):
    monkeypatch.setattr(deployable.runtimes, "get", lambda name: _Refusing(at))
    found = deployable.blockers(ir.from_proto(sample("mlp_dynamic")), "openvino")
    (reason,) = [r for r in found.reasons if "cannot" in r]
    assert "\n" not in reason and reason.endswith(("No conversion rule", "out of range")), reason
