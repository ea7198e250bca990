"""The package passes ruff and mypy with the configuration in pyproject.toml, and its version
is written once (the installed metadata reads it from pyinfer/__init__.py)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import pyinfer

ROOT = Path(__file__).resolve().parents[1]


def _run_tool(module: str, *args: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install '.[test]')")
    r = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, f"{module} {' '.join(args)}:\n{r.stdout}{r.stderr}"


def test_ruff_is_clean():
    _run_tool("ruff", "check", "src/pyinfer")


def test_mypy_is_clean():
    _run_tool("mypy")  # files and options: [tool.mypy] in pyproject.toml


def test_the_version_is_written_once():
    assert importlib.metadata.version("pyinfer") == pyinfer.__version__
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and pyinfer.__version__ not in pyproject
