"""The package's public names, and what importing it costs: `import pyinfer` and the CLI leave
Jinja2, asyncio, the engine and the llama-cpp-python layer unimported until a program asks for
a name that needs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import pyinfer

HEAVY = ["asyncio", "jinja2", "pyinfer.chat", "pyinfer.engine", "pyinfer.llama_compat"]


def imported_after(code: str) -> list[str]:
    """The HEAVY modules present in a fresh interpreter after it runs code."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("code", ["import pyinfer", "import pyinfer.cli"])
def test_import_leaves_heavy_modules_for_later(code):
    assert imported_after(code) == []


def test_lazy_names_are_the_modules_objects():
    from pyinfer.chat import ChatTemplate
    from pyinfer.engine import Engine, RequestHandle
    from pyinfer.llama_compat import Llama, LlamaGrammar

    assert (pyinfer.ChatTemplate, pyinfer.Engine, pyinfer.RequestHandle, pyinfer.Llama, pyinfer.LlamaGrammar) == (
        ChatTemplate, Engine, RequestHandle, Llama, LlamaGrammar)
    # A lazy name brings in its own module only.
    assert imported_after("from pyinfer import Engine") == ["asyncio", "pyinfer.engine"]


def test_every_public_name_resolves():
    for name in pyinfer.__all__:
        assert getattr(pyinfer, name) is not None, name
    assert set(pyinfer.__all__) <= set(dir(pyinfer))
    namespace: dict[str, object] = {}
    exec("from pyinfer import *", namespace)
    assert set(pyinfer.__all__) <= set(namespace)


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        pyinfer.Nope  # noqa: B018
