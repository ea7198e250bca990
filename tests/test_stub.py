"""The .pyi stubs of the compiled modules (_C from pybind11; _bpe, _sampling, _gguf_scan from
Cython) name exactly what each module exports, with the same parameters."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import pyinfer
from pyinfer import _C, _bpe, _gguf_scan, _sampling

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


# ---- the Cython modules

CYTHON = [_bpe, _sampling, _gguf_scan]


def _source(module, suffix: str) -> Path:
    # Beside the package's Python files (an editable install keeps the built modules apart).
    return Path(pyinfer.__file__).with_name(module.__name__.rsplit(".", 1)[1] + suffix)


def _args(f: ast.FunctionDef) -> list[str]:
    return [a.arg for a in f.args.args]


def cython_stub(module) -> dict[str, object]:
    """Functions (parameters), constants, and classes (methods' parameters; properties and
    attributes as "data") in the module's stub."""
    tree = ast.parse(_source(module, ".pyi").read_text())
    out: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = _args(node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = "constant"
        elif isinstance(node, ast.ClassDef):
            members: dict[str, object] = {}
            for f in node.body:
                if isinstance(f, ast.FunctionDef):
                    is_prop = any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)
                    members[f.name] = "data" if is_prop else _args(f)
                elif isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name):
                    members[f.target.id] = "data"
            out[node.name] = members
    return out


def _pyx_init(module, cls: str) -> list[str]:
    """__init__'s parameter names from the .pyx source: a cdef class's slot has no signature."""
    src = _source(module, ".pyx").read_text()
    body = src[src.index(f"cdef class {cls}") :]
    m = re.search(r"def __init__\(([^)]*)\)", body)
    assert m, f"no __init__ in {cls}"
    return [p.split("=")[0].split()[-1] for p in m.group(1).split(",")]


def cython_module(module) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", module.__name__) != module.__name__:
            continue
        if isinstance(obj, type):
            members: dict[str, object] = {"__init__": _pyx_init(module, name)}
            for attr, v in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(v, property) or inspect.isgetsetdescriptor(v) or inspect.ismemberdescriptor(v):
                    members[attr] = "data"  # a property or a `cdef public` field: Cython makes both getsets
                elif callable(v):
                    members[attr] = list(inspect.signature(v).parameters)
            out[name] = members
        elif callable(obj):
            out[name] = list(inspect.signature(obj).parameters)
        elif isinstance(obj, int):
            out[name] = "constant"
    return out


@pytest.mark.parametrize("module", CYTHON, ids=lambda m: m.__name__)
def test_cython_stub_matches_module(module):
    assert cython_stub(module) == cython_module(module)
