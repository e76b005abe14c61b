"""Shared fixtures: every engine that works on this machine. Tests write real files in tmp_path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import dsaio

# --import-mode=importlib keeps test folders off sys.path; the shared test helpers live here.
sys.path.insert(0, str(Path(__file__).parent))

ENGINES = [name for name, info in dsaio.backends().items() if info["available"]]


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    return request.param
