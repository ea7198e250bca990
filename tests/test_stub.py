"""The _C.pyi stub names exactly what the compiled module exports, with the same parameters."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pyinfer
from pyinfer import _C

STUB = Path(pyinfer.__file__).with_name("_C.pyi")


def stub_functions() -> dict[str, list[str]]:
    tree = ast.parse(STUB.read_text())
    return {
        node.name: [a.arg for a in node.args.args]
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }


def module_functions() -> dict[str, list[str]]:
    out = {}
    for name, obj in vars(_C).items():
        if name.startswith("_") or not callable(obj):
            continue
        # pybind11 puts the signature on the docstring's first line: name(a: T, b: T = ...) -> R
        first = (obj.__doc__ or "").splitlines()[0]
        m = re.match(rf"{name}\((.*)\)\s*->", first)
        assert m, f"no signature in the docstring of _C.{name}: {first!r}"
        params = [p.split(":")[0].strip() for p in re.split(r",\s*(?![^\[]*\])", m.group(1)) if p.strip()]
        out[name] = params
    return out


def test_stub_exists_and_is_installed():
    assert STUB.is_file()


def test_stub_names_match_module():
    assert sorted(stub_functions()) == sorted(module_functions())


def test_stub_parameters_match_module():
    assert stub_functions() == module_functions()


def test_every_stub_function_is_documented():
    tree = ast.parse(STUB.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            assert ast.get_docstring(node), node.name
    assert inspect.getdoc(_C)
