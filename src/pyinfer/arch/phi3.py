"""The phi3 architecture (Phi-3 and Phi-4 mini): the llama family's layers with Q, K and V in one
matrix (`attn_qkv`, or three as llama's), gate and up in one (`ffn_up` of 2 * n_ff rows, gate
first), RoPE on split halves (NeoX order) of the first `rope.dimension_count` dims of each head,
and a sliding window on every layer where `phi3.attention.sliding_window` is set (Phi-4's
files write 0: none); run by csrc/models/llama.cpp.

The window is applied as the file and transformers' Phi3 read it; llama.cpp ignores it for this
architecture, so the two agree only on sequences no longer than the window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pyinfer.arch.base import Architecture, Config, UnsupportedModelError, get_float
from pyinfer.arch.llama import FAMILY_HARMLESS_KEYS, FAMILY_KEYS, FAMILY_TENSORS, family_config, sliding_window


def _config(arch: Architecture, md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> Config:
    # LongRoPE (the 128k models) scales attention by this factor and its factor tensors
    # (rope_factors_long/short, refused as unused); without them it must be 1.
    attn_factor = get_float(arch, md, "rope.scaling.attn_factor", 1.0)
    if not (math.isfinite(attn_factor) and attn_factor == 1.0):
        raise UnsupportedModelError(
            f"{arch.key('rope.scaling.attn_factor')} = {attn_factor}: LongRoPE's attention scaling is not supported"
        )
    return family_config(arch, md, shapes, partial_rotary=True, rope_neox=True, ffn_fused=True,
                         sliding_window=sliding_window(arch, md))


PHI3 = Architecture(
    name="phi3",
    make_config=_config,
    tensors=(
        *FAMILY_TENSORS,
        "blk.{L}.attn_norm.weight",
        "blk.{L}.attn_qkv.weight",  # [q_dim + 2 * kv_dim, n_embd]; or the three below
        "blk.{L}.attn_q.weight",
        "blk.{L}.attn_k.weight",
        "blk.{L}.attn_v.weight",
        "blk.{L}.attn_output.weight",
        "blk.{L}.ffn_norm.weight",
        "blk.{L}.ffn_up.weight",  # [2 * n_ff, n_embd]: gate rows, then up rows
        "blk.{L}.ffn_down.weight",
    ),
    implemented_keys=FAMILY_KEYS | {"attention.sliding_window", "rope.scaling.attn_factor"},
    harmless_keys=FAMILY_HARMLESS_KEYS,
)
