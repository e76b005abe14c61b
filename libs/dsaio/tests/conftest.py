"""Shared fixtures: every engine that works on this machine. Tests write real files in tmp_path."""

from __future__ import annotations

import pytest

import dsaio

ENGINES = [name for name, info in dsaio.backends().items() if info["available"]]


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    return request.param
