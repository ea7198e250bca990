"""Test-only modules (the `test` extra) that some comparisons need."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def need(name: str) -> ModuleType:
    """The module, or a skip; in CI (CI set, e.g. CI=true) a missing module fails the test."""
    if os.environ.get("CI"):
        return importlib.import_module(name)
    return pytest.importorskip(name)
