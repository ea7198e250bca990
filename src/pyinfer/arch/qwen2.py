"""The qwen2 architecture (Qwen 2 and 2.5): the llama family's layers with biases on the Q, K and
V projections and RoPE on split halves (NeoX order); run by csrc/models/llama.cpp."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfer.arch.base import Architecture, Config
from pyinfer.arch.llama import FAMILY_HARMLESS_KEYS, FAMILY_KEYS, FAMILY_TENSORS, LAYER_TENSORS, family_config


def _config(arch: Architecture, md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> Config:
    return family_config(arch, md, shapes, rope_neox=True, qkv_bias=True)


QWEN2 = Architecture(
    name="qwen2",
    make_config=_config,
    tensors=(
        *FAMILY_TENSORS,
        *LAYER_TENSORS,
        "blk.{L}.attn_q.bias",
        "blk.{L}.attn_k.bias",
        "blk.{L}.attn_v.bias",
    ),
    # qwen2.attention.sliding_window is refused: Qwen 2 windows only the layers from
    # max_window_layers on, which the file does not say.
    implemented_keys=FAMILY_KEYS,
    harmless_keys=FAMILY_HARMLESS_KEYS,
)
