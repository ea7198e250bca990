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
    # Keyword-only parameters follow a '*', as in pybind11's signature line.
    return {
        node.name: [a.arg for a in node.args.args]
        + (["*"] + [a.arg for a in node.args.kwonlyargs] if node.args.kwonlyargs else [])
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }


def parse_params(name: str, doc: str | None) -> list[str]:
    """Parameter names from pybind11's docstring signature line: name(a: T, b: T = ...) -> R."""
    first = (doc or "").splitlines()[0]
    m = re.match(rf"{name}\((.*)\)\s*->", first)
    assert m, f"no signature in the docstring of {name}: {first!r}"
    return [p.split(":")[0].strip() for p in re.split(r",\s*(?![^\[]*\])", m.group(1)) if p.strip()]


def stub_classes() -> dict[str, dict[str, list[str]]]:
    tree = ast.parse(STUB.read_text())
    return {
        node.name: {
            f.name: [a.arg for a in f.args.args]
            for f in node.body
            if isinstance(f, ast.FunctionDef)
        }
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }


def module_classes() -> dict[str, dict[str, list[str]]]:
    out = {}
    for name, cls in vars(_C).items():
        if name.startswith("_") or not isinstance(cls, type):
            continue
        methods = {}
        for attr, obj in vars(cls).items():
            if (attr.startswith("_") and attr != "__init__") or not callable(obj):
                continue
            methods[attr] = parse_params(attr, obj.__doc__)
        out[name] = methods
    return out


def module_functions() -> dict[str, list[str]]:
    return {
        name: parse_params(name, obj.__doc__)
        for name, obj in vars(_C).items()
        if not name.startswith("_") and callable(obj) and not isinstance(obj, type)
    }


def test_stub_classes_match_module():
    assert stub_classes() == module_classes()


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
