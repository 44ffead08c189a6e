"""Fixtures, and the record of the tests skipped for want of the browser setup; shared helpers live in
helpers.py and are imported by name.

A run records in pytest's cache the tests it skipped because the web runtimes were not set up (their
skip names the setup command). ``pytest --skipped-for-the-browser`` runs those tests again: .ci/run sets
the browser up after the README's test command, then runs them."""

from __future__ import annotations

import onnx
import pytest
from helpers import MODELS, newest_ort_opset

from dql_pass import suites
from dql_pass.runtimes import web

_SKIPPED_FOR_THE_BROWSER = "dql_pass/skipped_for_the_browser"
_skipped: list[str] = []  # in the process that reports (the controller, under pytest-xdist)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--skipped-for-the-browser", action="store_true",
                     help="run only the tests the last run skipped because the web runtimes were not set up")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--skipped-for-the-browser"):
        return
    wanted = set(config.cache.get(_SKIPPED_FOR_THE_BROWSER, []))
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in wanted])
    items[:] = [item for item in items if item.nodeid in wanted]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and web.SETUP in str(report.longrepr):
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, "workerinput") or config.getoption("--skipped-for-the-browser"):
        return  # a pytest-xdist worker reports to the controller, which records
    if getattr(config, "cache", None) is not None:
        config.cache.set(_SKIPPED_FOR_THE_BROWSER, sorted(set(_skipped)))


@pytest.fixture(scope="session")
def ort_opset() -> int:
    return newest_ort_opset()


@pytest.fixture()
def small_suite(tmp_path):
    """Two inputs, every form, one opset: cheap to edit."""
    path = tmp_path / "dql"
    suites.generate_suite(path, opsets=(18,), include_large=False, names=("spec_example", "rank_0"))
    return path


@pytest.fixture(scope="module")
def mlp() -> onnx.ModelProto:
    return onnx.load(MODELS / "mlp_dynamic.onnx")
