"""Shared fixtures: the default model and the Gemma 3 file (fetched into the cache if absent,
never skipped)."""

from __future__ import annotations

from pathlib import Path

import pytest

import pyinfer
from pyinfer import _C

# Every ISA path this CPU can run; kernel tests run on each.
ISAS = pyinfer.cpu_info()["available"]


@pytest.fixture(scope="session")
def default_model() -> Path:
    from pyinfer.registry import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def gemma3_model() -> Path:
    """The Gemma 3 270M Q4_K_M file (`pyinfer pull gemma3-270m`): a test that needs it fails
    when it cannot be had."""
    from pyinfer.registry import resolve_model

    return resolve_model("gemma3-270m")


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest):
    """Make each available ISA path the active one in turn, then restore the previous one."""
    before = _C.get_isa()
    _C.set_isa(request.param)
    try:
        yield request.param
    finally:
        _C.set_isa(before)
