"""pyinfer: fast LLM inference on CPUs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pyinfer import _C
from pyinfer.bandwidth import measure_read_bandwidth
from pyinfer.errors import ChatTemplateError, ContextOverflowError, GGUFError, OverloadedError
from pyinfer.generate import CancelToken, Completion, CompletionChunk, Timings
from pyinfer.model import Batch, Context, Model
from pyinfer.sampling import SamplingParams
from pyinfer.tokenizer import Tokenizer

if TYPE_CHECKING:
    from pyinfer.chat import ChatTemplate
    from pyinfer.engine import Engine, RequestHandle
    from pyinfer.llama_compat import Llama, LlamaGrammar

__version__ = "0.1.0"

# Names whose modules bring Jinja2 or asyncio along, imported when first asked for, so that
# `import pyinfer` (and the CLI's start) does not pay for what a program may never use.
_LAZY = {"ChatTemplate": "pyinfer.chat", "Engine": "pyinfer.engine", "RequestHandle": "pyinfer.engine",
         "Llama": "pyinfer.llama_compat", "LlamaGrammar": "pyinfer.llama_compat"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pyinfer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def cpu_info() -> dict:
    """What the CPU supports, which ISA paths were compiled and can run, and the one in use.

    The active path is the best available unless ``PYINFER_ISA=scalar|avx2|avx512`` says
    otherwise (a path this CPU lacks fails the import with a clear message).
    """
    return _C.cpu_info()


__all__ = [
    "Batch",
    "CancelToken",
    "ChatTemplate",
    "ChatTemplateError",
    "Completion",
    "CompletionChunk",
    "Context",
    "ContextOverflowError",
    "Engine",
    "GGUFError",
    "Llama",
    "LlamaGrammar",
    "Model",
    "OverloadedError",
    "RequestHandle",
    "SamplingParams",
    "Timings",
    "Tokenizer",
    "__version__",
    "cpu_info",
    "measure_read_bandwidth",
]
