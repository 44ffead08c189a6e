"""Fixtures only; shared helpers live in helpers.py and are imported by name."""

from __future__ import annotations

import pytest
from helpers import newest_ort_opset


@pytest.fixture(scope="session")
def ort_opset() -> int:
    return newest_ort_opset()
