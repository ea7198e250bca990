"""Architectures: one description per architecture (config from metadata, the tensors it
reads, the keys it implements), shared by the C++ model, the NumPy reference and `info`."""

from __future__ import annotations

from typing import Any

from pyinfer.arch.base import Architecture, Config, Description, UnsupportedModelError
from pyinfer.arch.gemma3 import GEMMA3
from pyinfer.arch.llama import LLAMA
from pyinfer.arch.phi3 import PHI3
from pyinfer.arch.qwen2 import QWEN2
from pyinfer.arch.qwen3 import QWEN3

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (LLAMA, QWEN2, QWEN3, PHI3, GEMMA3)}

__all__ = ["ARCHITECTURES", "Architecture", "Config", "Description", "UnsupportedModelError",
           "architecture", "describe"]


def architecture(reader: Any) -> Architecture:
    """The description of a GGUFReader's architecture; UnsupportedModelError if none."""
    name = reader.metadata.get("general.architecture")
    arch = ARCHITECTURES.get(name) if isinstance(name, str) else None
    if arch is None:
        raise UnsupportedModelError(
            f"{reader.path}: architecture {name!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    return arch


def describe(reader: Any) -> Description:
    """A GGUFReader's file as its architecture reads it: UnsupportedModelError (a ValueError)
    naming the tensor or metadata key the forward pass would otherwise ignore."""
    arch = architecture(reader)
    shapes = {name: tuple(t.shape) for name, t in reader.tensors.items()}
    try:
        description = arch.describe(reader.metadata, shapes)
        # Sampling works on rows of logits, one per embedding row, and the tokenizer must name
        # each of them (llama.cpp refuses such a file too).
        tokens = reader.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, (list, tuple)) and len(tokens) != description.config.n_vocab:
            raise UnsupportedModelError(
                f"tokenizer.ggml.tokens has {len(tokens)} entries but token_embd.weight has "
                f"{description.config.n_vocab} rows: the vocabulary and the embedding disagree"
            )
        return description
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{reader.path}: {e}") from None
