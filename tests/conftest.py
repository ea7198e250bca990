"""Shared fixtures: the default model (fetched into the cache if absent, never skipped)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def default_model() -> Path:
    from pyinfer.models import resolve_model

    return resolve_model(None)
