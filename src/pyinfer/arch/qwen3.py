"""The qwen3 architecture (Qwen 3's dense models): the llama family's layers with RMSNorm of each
query and key head before RoPE on split halves (NeoX order), no biases, a head dim of its own
(`attention.key_length`); run by csrc/models/llama.cpp."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyinfer.arch.base import Architecture, Config
from pyinfer.arch.llama import FAMILY_HARMLESS_KEYS, FAMILY_KEYS, FAMILY_TENSORS, LAYER_TENSORS, family_config


def _config(arch: Architecture, md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> Config:
    return family_config(arch, md, shapes, rope_neox=True, qk_norm=True)


QWEN3 = Architecture(
    name="qwen3",
    make_config=_config,
    tensors=(
        *FAMILY_TENSORS,
        *LAYER_TENSORS,
        "blk.{L}.attn_q_norm.weight",
        "blk.{L}.attn_k_norm.weight",
    ),
    implemented_keys=FAMILY_KEYS,
    harmless_keys=FAMILY_HARMLESS_KEYS,
)
