"""The reference figures in tests/data/reference/ (see its README.md), loaded for the tests."""

from __future__ import annotations

import json
from pathlib import Path

DIR = Path(__file__).resolve().parent / "data" / "reference"


def path(name: str) -> Path:
    """A file of the reference set; a missing one is an error naming it, never a skip."""
    p = DIR / name
    if not p.is_file():
        raise FileNotFoundError(f"reference file {p} is missing (see {DIR / 'README.md'})")
    return p


def load(name: str) -> dict:
    return json.loads(path(name).read_text(encoding="utf-8"))


def text(name: str) -> str:
    return path(name).read_text(encoding="utf-8")
