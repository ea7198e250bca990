"""The gemma3 architecture (Gemma 3's text models): RMSNorm before and after each block, RMSNorm
on each query and key head, RoPE on split halves (NeoX order), GeGLU, embeddings scaled by
sqrt(width), sliding-window attention on the local layers with a RoPE base of their own; the
C++ side is csrc/models/gemma3.cpp.

The norms' weights are used as stored: Gemma computes x * (1 + w), and llama.cpp's converter
writes 1 + w into the file, so the forward pass is a plain RMSNorm times the stored vector.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyinfer.arch import llama
from pyinfer.arch.base import Architecture, Config, UnsupportedModelError, get_float, get_int, get_key

# llama.cpp's constants for Gemma 3 where the file says nothing: every sixth layer attends to
# the whole context, the others to a sliding window, with RoPE base 10000 on those.
DEFAULT_PATTERN = 6
DEFAULT_LOCAL_ROPE_BASE = 10000.0


@dataclass(frozen=True)
class Gemma3Config(Config):
    """Config plus what Gemma 3 adds: which layers are local, their window and RoPE base, the
    query scale and the final logit soft-cap (0: none)."""

    sliding_window: int = 0
    local_layers: tuple[bool, ...] = ()
    rope_base_local: float = DEFAULT_LOCAL_ROPE_BASE
    attn_scale: float = 1.0  # multiplies q.k (1 / sqrt(head_dim) but for the 27B model)
    final_logit_softcap: float = 0.0

    @property
    def embd_scale(self) -> float:
        return math.sqrt(self.n_embd)

    def params(self) -> dict[str, float]:
        p = super().params()
        p.update({"sliding_window": self.sliding_window, "rope_base_local": self.rope_base_local,
                  "attn_scale": self.attn_scale, "final_logit_softcap": self.final_logit_softcap})
        p.update({f"local.{il}": float(v) for il, v in enumerate(self.local_layers)})
        return p


def _local_layers(arch: Architecture, md: Mapping[str, Any], n_layer: int) -> tuple[bool, ...]:
    """Which layers use the sliding window: `attention.sliding_window_pattern` as a period N
    (every N-th layer global, the others local; N = 1: all global) or one flag per layer."""
    key = arch.key("attention.sliding_window_pattern")
    v = md.get(key, DEFAULT_PATTERN)
    if isinstance(v, (list, tuple)) or hasattr(v, "tolist"):
        items = v.tolist() if hasattr(v, "tolist") else v
        if not all(isinstance(x, bool) or (isinstance(x, int) and x in (0, 1)) for x in items):
            raise UnsupportedModelError(f"{key} must be a period or one flag (bool) per layer")
        flags = [bool(x) for x in items]
        if len(flags) != n_layer:
            raise UnsupportedModelError(f"{key} has {len(flags)} flags for {n_layer} layers")
        return tuple(flags)
    n = get_int(arch, md, "attention.sliding_window_pattern", DEFAULT_PATTERN)
    if n < 1:
        raise UnsupportedModelError(f"{key} = {n} must be a positive period")
    return tuple(il % n < n - 1 for il in range(n_layer))


def _config(arch: Architecture, md: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> Config:
    base = llama._config(arch, md, shapes)  # the dimensions, norms, RoPE and its linear scaling
    window = get_int(arch, md, "attention.sliding_window")
    if window < 1:
        raise UnsupportedModelError(f"{arch.key('attention.sliding_window')} = {window} must be positive")
    local_base = get_float(arch, md, "rope.freq_base_swa", DEFAULT_LOCAL_ROPE_BASE)
    if not (math.isfinite(local_base) and local_base > 1):
        raise UnsupportedModelError(f"{arch.key('rope.freq_base_swa')} = {local_base} must be a finite number > 1")
    cap = get_float(arch, md, "final_logit_softcapping", 0.0)
    if not (math.isfinite(cap) and cap >= 0):
        raise UnsupportedModelError(f"{arch.key('final_logit_softcapping')} = {cap} must be a finite number >= 0")
    attn_cap = get_key(arch, md, "attn_logit_softcapping", 0.0)
    if attn_cap:
        raise UnsupportedModelError(
            f"{arch.key('attn_logit_softcapping')} = {attn_cap}: soft-capped attention scores are not supported"
        )
    # llama.cpp scales queries by 1/sqrt(head_dim), except for the 62-layer 27B model, whose
    # query_pre_attn_scalar is width / heads (the file does not carry it).
    scalar = base.n_embd / base.n_head if base.n_layer == 62 else base.head_dim
    return Gemma3Config(
        **{f.name: getattr(base, f.name) for f in dataclasses.fields(Config)},
        sliding_window=window,
        local_layers=_local_layers(arch, md, base.n_layer),
        rope_base_local=local_base,
        attn_scale=1.0 / math.sqrt(scalar),
        final_logit_softcap=cap,
    )


GEMMA3 = Architecture(
    name="gemma3",
    make_config=_config,
    tensors=(
        "token_embd.weight",
        "output_norm.weight",
        "output.weight",  # absent: tied to the embedding (as in every Gemma 3 file)
        "blk.{L}.attn_norm.weight",
        "blk.{L}.attn_q.weight",
        "blk.{L}.attn_k.weight",
        "blk.{L}.attn_v.weight",
        "blk.{L}.attn_q_norm.weight",
        "blk.{L}.attn_k_norm.weight",
        "blk.{L}.attn_output.weight",
        "blk.{L}.post_attention_norm.weight",
        "blk.{L}.ffn_norm.weight",
        "blk.{L}.ffn_gate.weight",
        "blk.{L}.ffn_up.weight",
        "blk.{L}.ffn_down.weight",
        "blk.{L}.post_ffw_norm.weight",
    ),
    implemented_keys=frozenset({
        "block_count", "embedding_length", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "attention.layer_norm_rms_epsilon",
        "attention.key_length", "attention.value_length", "attention.sliding_window",
        "attention.sliding_window_pattern", "rope.freq_base", "rope.freq_base_swa", "rope.dimension_count",
        "rope.scaling.type", "rope.scaling.factor", "final_logit_softcapping", "attn_logit_softcapping",
        "vocab_size",
    }),
    harmless_keys=frozenset({"context_length"}),
)
