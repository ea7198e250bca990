"""pyinfer: fast LLM inference on CPUs."""

from __future__ import annotations

from pyinfer import _C
from pyinfer.bandwidth import measure_read_bandwidth
from pyinfer.chat import ChatTemplate
from pyinfer.engine import Engine, RequestHandle
from pyinfer.errors import ChatTemplateError, ContextOverflowError, GGUFError, OverloadedError
from pyinfer.generate import CancelToken, Completion, CompletionChunk, Timings
from pyinfer.llama_compat import Llama, LlamaGrammar
from pyinfer.model import Batch, Context, Model
from pyinfer.sampling import SamplingParams
from pyinfer.tokenizer import Tokenizer

__version__ = "0.1.0"


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
