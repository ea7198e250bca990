"""`import pyinfer.as_llama_cpp` makes `llama_cpp` name pyinfer's llama-cpp-python surface, so
that code and wrappers written against llama-cpp-python (LangChain's LlamaCpp and ChatLlamaCpp,
llama-index's LlamaCPP) run on pyinfer unchanged:

    import pyinfer.as_llama_cpp  # noqa: F401  (before the wrapper imports llama_cpp)
    from langchain_community.llms import LlamaCpp
    llm = LlamaCpp(model_path="model.gguf")

The alias is what `from llama_cpp import Llama, LlamaGrammar, ...` reads; a llama_cpp module
imported before this one is replaced for later imports only.
"""

from __future__ import annotations

import sys

from pyinfer import __version__
from pyinfer.llama_compat import (
    Llama,
    LlamaGrammar,
    LlamaRAMCache,
    LlamaState,
    LogitsProcessorList,
    StoppingCriteriaList,
)

__all__ = [
    "Llama",
    "LlamaGrammar",
    "LlamaRAMCache",
    "LlamaState",
    "LogitsProcessorList",
    "StoppingCriteriaList",
    "__version__",
]

sys.modules["llama_cpp"] = sys.modules[__name__]
